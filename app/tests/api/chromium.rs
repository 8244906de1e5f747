//! A real browser for the dashboard and shop tests: Debian's headless Chromium, driven through
//! its chromedriver over the W3C WebDriver protocol (fantoccini).
//!
//! Install both with `.ci/install-browser` (`apt-get install chromium chromium-driver`). Without
//! them the browser tests fail and say so: they never pass silently. `CHROMIUM` and
//! `CHROMEDRIVER` override the paths.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

/// How long the helpers wait for a page to get where a test expects.
const WAIT: Duration = Duration::from_secs(15);

/// The window: a laptop screen, as on a projector.
const WIDTH: u32 = 1280;
const HEIGHT: u32 = 900;
/// A projector's screen, in CSS pixels: the smallest the dashboard is shown on in a workshop.
const PROJECTOR_WIDTH: u32 = 1280;
const PROJECTOR_HEIGHT: u32 = 800;
/// A phone's screen, in CSS pixels.
const PHONE_WIDTH: u32 = 390;
const PHONE_HEIGHT: u32 = 844;
/// What the window has around the page (headless: the difference is fixed).
const CHROME_HEIGHT: u32 = 140;

/// Where screenshots go: `target/browser-artifacts/<name>.png` at the top of the repository.
pub fn artifacts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/browser-artifacts")
}

/// The environment variable that makes the browser tests save what they see
/// (`PAYONCE_SCREENSHOTS=1`; `docs/images/update.sh` sets it). Off by default: each of the ~60
/// full-page screenshots costs Chromium a stretched window's layout and a PNG of up to
/// 1280 × 4000 pixels, on the two cores the whole suite shares (with them the API tests took
/// 108.7 s, without 104.5 s; the tests' own times summed 834 s against 783 s: issue 19).
pub const SCREENSHOTS: &str = "PAYONCE_SCREENSHOTS";

fn screenshots() -> bool {
    std::env::var_os(SCREENSHOTS).is_some_and(|v| !v.is_empty() && v != "0")
}

fn tool(env: &str, default: &str) -> PathBuf {
    let path = std::env::var_os(env).map_or_else(|| PathBuf::from(default), PathBuf::from);
    assert!(
        path.is_file(),
        "the browser tests need {} at {} (set {env} to use another path). Install Chromium and its \
         driver with `.ci/install-browser` (apt-get install chromium chromium-driver).",
        Path::new(default).file_name().and_then(|n| n.to_str()).unwrap_or(default),
        path.display(),
    );
    path
}

/// A headless Chromium session. Call [`Browser::close`] at the end of a test; dropping it kills
/// chromedriver and the browser it started (their own process group) in any case.
pub struct Browser {
    pub client: Client,
    driver: Child,
    profile: PathBuf,
}

impl Browser {
    pub async fn start() -> Self {
        let chromium = tool("CHROMIUM", "/usr/bin/chromium");
        let chromedriver = tool("CHROMEDRIVER", "/usr/bin/chromedriver");
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group, so that Drop can end chromedriver and its browser together.
            .process_group(0)
            .spawn()
            .unwrap_or_else(|err| panic!("could not start {}: {err}", chromedriver.display()));
        let profile = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chromium-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&profile).unwrap();
        let browser = Self { client: connect(port, &chromium, &profile).await, driver, profile };
        browser.client.set_window_size(WIDTH, HEIGHT).await.expect("size the window");
        browser
    }

    /// Opens a path of the app.
    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap_or_else(|err| panic!("open {url}: {err}"));
    }

    /// The current URL's path and query.
    pub async fn path(&self) -> String {
        let url = self.client.current_url().await.expect("current url");
        match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_owned(),
        }
    }

    /// The visible text of the page (waiting out a navigation in progress, when there is no
    /// document to read for a moment).
    pub async fn text(&self) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let body = self.client.find(Locator::Css("body")).await;
            let text = match body {
                Ok(body) => body.text().await,
                Err(err) => Err(err),
            };
            match text {
                Ok(text) => return text,
                Err(err) if Instant::now() > deadline => panic!("the page has no readable body: {err}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// The first element matching a CSS selector, waiting for it to appear.
    pub async fn find(&self, css: &str) -> Element {
        match self.client.wait().at_most(WAIT).for_element(Locator::Css(css)).await {
            Ok(element) => element,
            Err(err) => panic!("no {css} on {}: {err}\n{}", self.path().await, self.text().await),
        }
    }

    /// Types into the field with this id.
    pub async fn fill(&self, id: &str, value: &str) {
        let field = self.find(&format!("#{id}")).await;
        field.clear().await.unwrap();
        field.send_keys(value).await.unwrap();
    }

    /// Clicks the first element matching a CSS selector. A page that refreshes itself (the
    /// dashboard's live refresh swaps its tables every 2 s) may replace the element between
    /// finding and clicking it: then the new one is found and clicked.
    pub async fn click(&self, css: &str) {
        for _ in 0..5 {
            match self.find(css).await.click().await {
                Err(err) if err.is_stale_element_reference() => continue,
                done => return done.unwrap_or_else(|err| panic!("click {css}: {err}")),
            }
        }
        panic!("click {css}: replaced five times in a row before it could be clicked");
    }

    /// Waits (up to 15 s) until the page's text contains `needle`; panics with the page otherwise.
    pub async fn wait_for_text(&self, needle: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            let text = self.text().await;
            if text.contains(needle) {
                return;
            }
            if Instant::now() > deadline {
                panic!("the page never said {needle:?}; it says:\n{text}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits (up to 15 s) until the URL's path starts with `prefix`.
    pub async fn wait_for_path(&self, prefix: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let path = self.path().await;
            if path.starts_with(prefix) {
                return path;
            }
            assert!(Instant::now() < deadline, "never reached {prefix}; still at {path}:\n{}", self.text().await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Writes a screenshot of the whole page to `target/browser-artifacts/<name>.png` (the
    /// window is stretched to the page's height for it, then put back as it was), when
    /// [`SCREENSHOTS`] is set.
    pub async fn screenshot(&self, name: &str) {
        if !screenshots() {
            return;
        }
        let (width, height) = self.client.get_window_size().await.expect("the window's size");
        let page = self.client.execute("return document.documentElement.scrollHeight", vec![]).await;
        let page = page.ok().and_then(|h| h.as_u64()).unwrap_or(900).clamp(900, 4000) as u32;
        self.client.set_window_size(width as u32, page + CHROME_HEIGHT).await.expect("stretch the window");
        let png = self.client.screenshot().await.expect("a screenshot");
        self.client.set_window_size(width as u32, height as u32).await.expect("restore the window");
        let dir = artifacts_dir();
        std::fs::create_dir_all(&dir).expect("create target/browser-artifacts");
        std::fs::write(dir.join(format!("{name}.png")), png).expect("write the screenshot");
    }

    /// Makes the window a phone's: 390 × 844 CSS pixels of page, as an iPhone 12–15 shows.
    pub async fn phone(&self) {
        self.client.set_window_size(PHONE_WIDTH, PHONE_HEIGHT + CHROME_HEIGHT).await.expect("size the window");
        let inner = self.client.execute("return window.innerWidth", vec![]).await.expect("the page's width");
        assert_eq!(inner.as_u64(), Some(u64::from(PHONE_WIDTH)), "a window of a phone's width");
    }

    /// Makes the window a projector's: 1280 × 800 CSS pixels of page.
    pub async fn projector(&self) {
        self.client.set_window_size(PROJECTOR_WIDTH, PROJECTOR_HEIGHT + CHROME_HEIGHT).await.expect("size the window");
        let inner = self.client.execute("return window.innerWidth", vec![]).await.expect("the page's width");
        assert_eq!(inner.as_u64(), Some(u64::from(PROJECTOR_WIDTH)), "a window of a projector's width");
    }

    /// [`Self::screenshot`] at a phone's width.
    pub async fn screenshot_phone(&self, name: &str) {
        if !screenshots() {
            return;
        }
        let png = self.client.screenshot().await.expect("a screenshot");
        let dir = artifacts_dir();
        std::fs::create_dir_all(&dir).expect("create target/browser-artifacts");
        std::fs::write(dir.join(format!("{name}.png")), png).expect("write the screenshot");
    }

    /// Ends the session (and the browser) cleanly.
    pub async fn close(self) {
        let _ = self.client.clone().close().await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Our own process group: chromedriver and the Chromium it started, nothing else.
        let _ = Command::new("kill").arg("-KILL").arg("--").arg(format!("-{}", self.driver.id())).status();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// Waits for chromedriver to listen, then opens a session with a fresh profile.
async fn connect(port: u16, chromium: &Path, profile: &Path) -> Client {
    let capabilities: serde_json::Map<String, Value> = serde_json::from_value(json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": chromium,
            // Without the networking flags, Chromium keeps trying to reach Google's services,
            // which a closed network makes slow.
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1280,900",
                format!("--user-data-dir={}", profile.display()),
            ],
        },
    }))
    .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut builder = ClientBuilder::new(HttpConnector::new());
        builder.capabilities(capabilities.clone());
        match builder.connect(&url).await {
            Ok(client) => return client,
            // chromedriver is still starting.
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(err) => panic!("could not open a Chromium session through chromedriver: {err}"),
        }
    }
}
