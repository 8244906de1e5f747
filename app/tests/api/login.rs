//! The admin login under attack: concurrent guesses, a memory blow-up by password checks, session
//! rows written by anonymous visitors, and hostile `next` values.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use reqwest::header::LOCATION;
use reqwest::{Client, StatusCode};
use tokio::sync::Barrier;

use crate::browser::{ADMIN, PASSWORD, create_admin};
use crate::connections::Served;
use crate::helpers::{TestApp, browser_client, field};

/// A browser of its own: its cookies and the login form's CSRF token.
async fn login_form(app_url: &str, client: &Client) -> String {
    let page = client.get(format!("{app_url}/admin/login")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    field(&page.text().await.unwrap(), "csrf")
}

/// Sends every `(client, csrf, name, password)` login at the same instant; returns the statuses.
async fn burst(app_url: &str, attempts: Vec<(Client, String, String, String)>) -> Vec<StatusCode> {
    let barrier = Arc::new(Barrier::new(attempts.len()));
    let tasks: Vec<_> = attempts
        .into_iter()
        .map(|(client, csrf, name, password)| {
            let (barrier, url) = (barrier.clone(), format!("{app_url}/admin/login"));
            tokio::spawn(async move {
                let request = client.post(url).form(&[("csrf", csrf), ("name", name), ("password", password)]);
                barrier.wait().await;
                request.send().await.unwrap().status()
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    statuses
}

/// 30 simultaneous wrong guesses for one name from one address: at most the limit (5) are
/// verified, the others are refused (429) before their password is looked at; and the right
/// password, sent right after the burst, is refused too, unchecked.
///
/// (Not the right password *inside* the burst: the order in which simultaneous requests reach
/// the limit is the scheduler's, and when the right one happens to be among the first five, the
/// sign-in clears the name's failures, as it should, and the guesses still waiting are checked.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_guesses_verifies_at_most_the_limit() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let client = browser_client();
    let csrf = login_form(&app.url(""), &client).await;
    let attempts =
        (0..30).map(|i| (client.clone(), csrf.clone(), ADMIN.to_owned(), format!("wrong-password-{i}"))).collect();
    let statuses = burst(&app.url(""), attempts).await;
    let verified = statuses.iter().filter(|s| **s != StatusCode::TOO_MANY_REQUESTS).count();
    assert!(verified <= 5, "at most 5 passwords checked, {verified} were: {statuses:?}");
    assert!(
        statuses.iter().all(|s| matches!(*s, StatusCode::UNAUTHORIZED | StatusCode::TOO_MANY_REQUESTS)),
        "{statuses:?}"
    );
    let failures: i64 =
        sqlx::query_scalar("select count(*) from admin_login_failures").fetch_one(&app.db).await.unwrap();
    assert_eq!(failures, verified as i64, "each wrong password checked is one failure recorded");

    // Five failures block the name; fewer happen only when checks were busy for over 5 s on a
    // loaded machine (those attempts are answered 429 unchecked and not counted).
    if failures == 5 {
        let right = (client.clone(), csrf.clone(), ADMIN.to_owned(), PASSWORD.to_owned());
        let right = burst(&app.url(""), vec![right]).await;
        assert_eq!(right, [StatusCode::TOO_MANY_REQUESTS], "the right password behind the burst must not be checked");
    }
}

/// 100 simultaneous logins for 100 names from one address: at most the per-address limit (20)
/// are checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_names_from_one_address_verifies_at_most_the_limit() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let client = browser_client();
    let csrf = login_form(&app.url(""), &client).await;
    let attempts =
        (0..100).map(|i| (client.clone(), csrf.clone(), format!("name-{i}"), "wrong-password".to_owned())).collect();
    let statuses = burst(&app.url(""), attempts).await;
    let verified = statuses.iter().filter(|s| **s == StatusCode::UNAUTHORIZED).count();
    assert!(verified <= 20, "at most 20 passwords checked from one address, {verified} were");
    assert_eq!(
        verified + statuses.iter().filter(|s| **s == StatusCode::TOO_MANY_REQUESTS).count(),
        100,
        "every login answered 401 or 429: {statuses:?}"
    );
}

/// 100 simultaneous logins from 100 addresses (so that no rate limit applies) cannot blow the
/// server's memory up: password checks (19 MiB of argon2 memory each) run a few at a time, and
/// the peak resident memory of the process stays under 300 MiB. Every login is answered 401, or
/// 429 if it waited too long for its turn; none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_password_checks_have_bounded_memory() {
    let served = Served::start(&[], None).await;
    payonce::admin::accounts::create(&served.database.pool, ADMIN, PASSWORD).await.unwrap();
    let url = served.server.url("");
    let mut attempts = Vec::new();
    for i in 0..100u8 {
        let address = IpAddr::V4(Ipv4Addr::new(127, 0, 1, i + 1));
        let client = reqwest::Client::builder()
            .cookie_store(true)
            .redirect(reqwest::redirect::Policy::none())
            .local_address(address)
            .build()
            .unwrap();
        let csrf = login_form(&url, &client).await;
        attempts.push((client, csrf, ADMIN.to_owned(), format!("wrong-password-{i}")));
    }
    let before = served.server.peak_memory_kib();
    let statuses = burst(&url, attempts).await;
    let peak = served.server.peak_memory_kib();
    eprintln!("peak resident memory: {} MiB before the burst, {} MiB after", before / 1024, peak / 1024);
    assert!(
        statuses.iter().all(|s| matches!(*s, StatusCode::UNAUTHORIZED | StatusCode::TOO_MANY_REQUESTS)),
        "{statuses:?}"
    );
    assert!(statuses.contains(&StatusCode::UNAUTHORIZED), "some passwords were checked: {statuses:?}");
    assert!(peak < 300 * 1024, "peak resident memory {} MiB", peak / 1024);
}

/// Anonymous visitors leave no session behind: 300 views of the login page (and of the shop)
/// write no session row, and the form they got still signs in.
#[tokio::test]
async fn anonymous_page_views_write_no_session_rows() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    for _ in 0..300 {
        let page = app.client.get(app.url("/admin/login")).send().await.unwrap();
        assert_eq!(page.status(), StatusCode::OK);
    }
    for _ in 0..20 {
        assert_eq!(app.client.get(app.url("/")).send().await.unwrap().status(), StatusCode::OK);
    }
    assert_eq!(app.count("tower_sessions.session").await, 0);

    let client = browser_client();
    let csrf = login_form(&app.url(""), &client).await;
    assert_eq!(app.count("tower_sessions.session").await, 0);
    let login = client
        .post(app.url("/admin/login"))
        .form(&[("csrf", csrf.as_str()), ("name", ADMIN), ("password", PASSWORD)])
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), StatusCode::SEE_OTHER);
    assert_eq!(app.count("tower_sessions.session").await, 1, "signing in is worth a session");
    // A wrong token, or none, is still refused.
    let refused = browser_client()
        .post(app.url("/admin/login"))
        .header("cookie", "payonce_admin_csrf=00")
        .form(&[("csrf", "00"), ("name", ADMIN), ("password", PASSWORD)])
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
}

/// A `next` that is not a printable relative dashboard path is ignored (sign-in lands on
/// /admin), never followed and never a 500; the login page does not echo it either.
#[tokio::test]
async fn hostile_next_values_are_ignored() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    for next in [
        "/admin\u{1}",
        "/admin/keys\r\nSet-Cookie: x=1",
        "/admin\u{7f}",
        "/admin/k\u{e9}ys",
        "/admin/ keys",
        "//evil.example",
        "/admin\\..",
        "/adminx",
    ] {
        let client = browser_client();
        let csrf = login_form(&app.url(""), &client).await;
        let login = client
            .post(app.url("/admin/login"))
            .form(&[("csrf", csrf.as_str()), ("name", ADMIN), ("password", PASSWORD), ("next", next)])
            .send()
            .await
            .unwrap();
        assert_eq!(login.status(), StatusCode::SEE_OTHER, "{next:?}");
        assert_eq!(login.headers()[LOCATION], "/admin", "{next:?}");
    }
    let client = browser_client();
    let page = client.get(app.url("/admin/login?next=%2Fadmin%01")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert_eq!(field(&page.text().await.unwrap(), "next"), "");
    let page = client.get(app.url("/admin/login?next=%2Fadmin%2Fkeys%3Fstate%3Dstuck")).send().await.unwrap();
    assert_eq!(field(&page.text().await.unwrap(), "next"), "/admin/keys?state=stuck");
}

/// A control character in `?next=` (a newline, a NUL, an escape, a header injection) never turns
/// a correct sign-in into an error. However the browser gets there (the login page's form, which
/// drops the unsafe `next`; a form posted back to the URL it was given; the raw value in the
/// form), the operator is signed in and sent to the dashboard's home, never to the unsafe target.
#[tokio::test]
async fn control_characters_in_next_still_sign_in_to_the_dashboard() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    for (escaped, raw) in
        [("%0A", "\n"), ("%00", "\0"), ("%1B", "\u{1b}"), ("%0D%0ASet-Cookie:%20x=1", "\r\nSet-Cookie: x=1")]
    {
        let query = format!("?next=%2Fadmin%2Fkeys{escaped}");
        let next = format!("/admin/keys{raw}");

        // The login page is shown, without the unsafe target; its form signs in to /admin.
        let client = browser_client();
        let page = client.get(app.url(&format!("/admin/login{query}"))).send().await.unwrap();
        assert_eq!(page.status(), StatusCode::OK, "{escaped}");
        let page = page.text().await.unwrap();
        assert_eq!(field(&page, "next"), "", "{escaped}: the page does not carry the unsafe target");
        signs_in_to_the_home(&app, &client, &query, &field(&page, "csrf"), &field(&page, "next")).await;

        // A client that sends the raw value in the form (and posts to the URL it was given).
        let client = browser_client();
        let csrf = login_form(&app.url(""), &client).await;
        signs_in_to_the_home(&app, &client, &query, &csrf, &next).await;
    }
}

/// Posts the right name and password with `next` to `/admin/login{query}`; asserts that the
/// operator is signed in and sent to the dashboard's home.
async fn signs_in_to_the_home(app: &TestApp, client: &Client, query: &str, csrf: &str, next: &str) {
    let login = client
        .post(app.url(&format!("/admin/login{query}")))
        .form(&[("csrf", csrf), ("name", ADMIN), ("password", PASSWORD), ("next", next)])
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), StatusCode::SEE_OTHER, "{query}: {}", login.text().await.unwrap());
    assert_eq!(login.headers()[LOCATION], "/admin", "{query}");
    assert_eq!(client.get(app.url("/admin")).send().await.unwrap().status(), StatusCode::OK, "{query}");
}
