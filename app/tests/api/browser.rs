//! The dashboard and the shop in a real browser (headless Chromium, see `chromium.rs`): what an
//! operator and a customer see and do, asserted against the database and the gateway's ledger.
//! With `PAYONCE_SCREENSHOTS=1`, each page visited is saved as
//! `target/browser-artifacts/<name>.png`.

use std::time::Duration;

use fantoccini::actions::{InputSource, MOUSE_BUTTON_LEFT, MouseActions, PointerAction};
use payonce::idempotency::{Claim, Engine, EngineSettings, EventLog, IdempotencyKey, Lease};
use payonce::payments::CreatePayment;
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::admin::{key_id, rogue_charge};
use crate::admin_refunds::{api_refund, paid};
use crate::chromium::Browser;
use crate::helpers::{TestApp, new_key, payment};

pub const ADMIN: &str = "alice";
pub const PASSWORD: &str = "correct-horse-battery";

/// Creates the operator the tests sign in as.
pub async fn create_admin(app: &TestApp) {
    payonce::admin::accounts::create(&app.db, ADMIN, PASSWORD).await.expect("create an admin");
}

/// An engine of its own on the test database: a second "server" that can claim a key and then
/// die without finishing it.
pub fn crashing_engine(app: &TestApp, lease: Duration) -> Engine {
    let (events, _writer) = EventLog::spawn(app.db.clone());
    Engine::new(app.db.clone(), EngineSettings { lease, ..EngineSettings::default() }, events)
}

/// Claims `key` for the customer of `api_key` with the API's own payment `body`, as
/// `POST /v1/payments` would, under `owner`; returns the lease, which the caller drops unfinished.
pub async fn claim_and_crash(
    app: &TestApp,
    engine: &Engine,
    api_key: &str,
    key: &str,
    body: Value,
    owner: &str,
) -> Lease {
    let customer = payonce::customers::authenticate(&app.db, api_key).await.unwrap().expect("a customer");
    let request = serde_json::from_value::<CreatePayment>(body).unwrap().validate().unwrap();
    let key = IdempotencyKey::new(key.to_owned()).unwrap();
    let op =
        payonce::http::idempotent::operation(payonce::operations::Op::Payment, customer.id, key, &request).unwrap();
    match engine.claim(&op, owner).await.expect("claim") {
        Claim::Acquired(lease) => lease,
        other => panic!("expected to acquire the key, got {other:?}"),
    }
}

/// Claims `key` under `owner` with a 300 s lease, as a holder that was then killed 200 s ago: its
/// lease still runs (100 s left), but nothing renews it (a holder heartbeats every third of its
/// lease, here every 100 s). Returns the lease, never to be used.
pub async fn claim_and_go_silent(app: &TestApp, api_key: &str, key: &str, owner: &str) -> Lease {
    let engine = crashing_engine(app, Duration::from_secs(300));
    let lease = claim_and_crash(app, &engine, api_key, key, payment(300), owner).await;
    sqlx::query(
        "update idempotency_keys set updated_at = now() - interval '200 seconds',
                locked_until = now() + interval '100 seconds' where id = $1",
    )
    .bind(lease.key_id)
    .execute(&app.db)
    .await
    .unwrap();
    lease
}

/// Signs the browser in to the dashboard from wherever the login page is.
pub(crate) async fn sign_in(browser: &Browser) {
    browser.wait_for_path("/admin/login").await;
    browser.fill("name", ADMIN).await;
    browser.fill("password", PASSWORD).await;
    browser.click("form.stacked button[type=submit]").await;
}

/// An anonymous visitor lands on the login page; signing in leads back to the page asked for;
/// signing out ends the session.
#[tokio::test]
async fn dashboard_requires_login() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let api_key = app.customer("acme").await;
    for amount in [100, 200] {
        let response = app.post_payment(&api_key, Some(&new_key()), &payment(amount)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    let browser = Browser::start().await;

    browser.goto(&app.url("/admin")).await;
    assert_eq!(browser.wait_for_path("/admin/login").await, "/admin/login");
    browser.screenshot("admin-login").await;

    // A wrong password is refused, and says so.
    browser.fill("name", ADMIN).await;
    browser.fill("password", "not-the-password").await;
    browser.click("form.stacked button[type=submit]").await;
    browser.wait_for_text("Wrong name or password.").await;

    browser.goto(&app.url("/admin/keys?state=completed")).await;
    assert_eq!(browser.wait_for_path("/admin/login").await, "/admin/login?next=%2Fadmin%2Fkeys%3Fstate%3Dcompleted");
    sign_in(&browser).await;
    assert_eq!(browser.wait_for_path("/admin/keys").await, "/admin/keys?state=completed");
    browser.wait_for_text("2 keys match").await;
    browser.wait_for_text("Signed in as alice").await;
    browser.screenshot("admin-keys").await;

    // The table refreshes itself: a key paid now appears without a reload.
    let fresh = new_key();
    let response = app.post_payment(&api_key, Some(&fresh), &payment(300)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    browser.wait_for_text(&fresh).await;
    browser.wait_for_text("3 keys match").await;

    browser.goto(&app.url("/admin")).await;
    browser.wait_for_text("Keys by state").await;
    let completed = browser.find("a[href='/admin/keys?state=completed'] .num").await;
    assert_eq!(completed.text().await.unwrap(), "3");
    browser.find("svg.chart polyline.s-claims").await;
    browser.screenshot("admin-overview").await;

    browser.click(".signout button").await;
    browser.wait_for_text("You are signed out.").await;
    browser.goto(&app.url("/admin")).await;
    browser.wait_for_path("/admin/login").await;
    browser.close().await;
}

/// A server claims a key and dies: the key shows up as stuck, the operator releases it (a new
/// token fences the dead holder off), and the client's next retry completes it with one charge.
#[tokio::test]
async fn stuck_key_appears_and_release_lets_the_retry_finish_it() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    let engine = crashing_engine(&app, Duration::from_secs(1));
    let lease = claim_and_crash(&app, &engine, &api_key, &key, payment(4200), "http:crashed-host:4242").await;
    let key_id = lease.key_id;
    drop(lease); // the worker died right after its claim
    tokio::time::sleep(Duration::from_millis(1300)).await; // its lease lapses

    let browser = Browser::start().await;
    browser.goto(&app.url("/admin/keys?state=stuck")).await;
    sign_in(&browser).await;
    browser.wait_for_path("/admin/keys").await;
    browser.wait_for_text(&key).await;
    browser.wait_for_text("Stuck").await;
    browser.screenshot("admin-keys-stuck").await;

    browser.click(&format!("a[href='/admin/keys/{key_id}']")).await;
    browser.wait_for_text("Operator actions").await;
    let page = browser.text().await;
    assert!(page.contains("http:crashed-host:4242"), "the lease owner is shown:\n{page}");
    assert!(page.contains("lapsed"), "the lease countdown says it lapsed:\n{page}");
    browser.screenshot("admin-key-stuck").await;

    // The confirmation step: the button is inside a closed disclosure until asked for.
    browser.click(".actions details summary").await;
    browser.screenshot("admin-key-release-confirm").await;
    browser.click("#release").await;
    browser.wait_for_text("Released the key").await;
    browser.screenshot("admin-key-released").await;

    let (state, token, owner): (String, i64, Option<String>) =
        sqlx::query_as("select state, lease_token, lease_owner from idempotency_keys where id = $1")
            .bind(key_id)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!((state.as_str(), token, owner), ("processing", 2, None));
    let by: String =
        sqlx::query_scalar("select detail->>'by' from idempotency_events where key_id = $1 and kind = 'released'")
            .bind(key_id)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(by, "operator:alice");

    // The client retries: it resumes the key and is charged exactly once.
    let response = app.post_payment(&api_key, Some(&key), &payment(4200)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(app.charges_for(&key).await.len(), 1);
    assert_eq!(app.event_kinds(&key).await, ["claimed", "released", "reclaimed", "payment_created", "completed"]);

    browser.goto(&app.url(&format!("/admin/keys/{key_id}"))).await;
    browser.wait_for_text("Completed").await;
    browser.wait_for_text("pi_").await;
    browser.screenshot("admin-key-completed").await;
    browser.close().await;
}

/// Two clicks on Pay (the second while the first is still at the gateway) are one payment: one
/// charge in the ledger, and the browser ends on the receipt. Going back and paying again with
/// the same page is the same payment too.
#[tokio::test]
async fn double_click_on_pay_charges_once() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let api_key = app.customer("acme").await;
    let browser = Browser::start().await;

    browser.goto(&app.url("/")).await;
    browser.wait_for_text("Sign in to the demo shop").await;
    browser.screenshot("shop-sign-in").await;
    browser.fill("api_key", &api_key).await;
    browser.click("form.stacked button[type=submit]").await;
    browser.wait_for_text("Hello, acme").await;
    assert!(!browser.text().await.contains(&api_key), "the API key is never shown back");
    browser.screenshot("shop-home").await;

    browser.click("#buy-mug").await;
    browser.wait_for_text("Exactly-once mug").await;
    let key = browser.find("#idempotency-key").await.text().await.unwrap();
    Uuid::try_parse(&key).expect("the form carries a UUID key");
    browser.screenshot("shop-checkout").await;

    // The gateway takes two seconds: the second click arrives while the first is in flight. The
    // clicks are 400 ms apart: a browser replaces a form submission it has not sent yet by a
    // second one, and on a busy machine (the whole suite at once) 120 ms was sometimes too short
    // for the first to leave, so one request reached payonce and there was no retry to see.
    app.set_faults(json!({"latency_ms": 2000})).await;
    let pay = browser.find("#pay").await;
    let double_click = MouseActions::new("mouse".into())
        .then(PointerAction::MoveToElement { element: pay, duration: None, x: 0.0, y: 0.0 })
        .then(PointerAction::Down { button: MOUSE_BUTTON_LEFT })
        .then(PointerAction::Up { button: MOUSE_BUTTON_LEFT })
        .then(PointerAction::Pause { duration: Duration::from_millis(400) })
        .then(PointerAction::Down { button: MOUSE_BUTTON_LEFT })
        .then(PointerAction::Up { button: MOUSE_BUTTON_LEFT });
    browser.client.perform_actions(double_click).await.expect("double click");
    browser.wait_for_path("/shop/receipts/").await;
    browser.wait_for_text("Payment received").await;
    browser.screenshot("shop-receipt").await;

    assert_eq!(app.charges_for(&key).await.len(), 1, "one charge for the double click");
    assert_eq!(app.count("payments").await, 1);
    // A conflict or a replay is an observation, written in a batch a moment late (later on a
    // busy machine): event_kinds_once gives it up to 5 s.
    let retried = |kinds: &[String]| kinds.iter().any(|k| k == "conflict" || k == "replayed");
    let kinds = app.event_kinds_once(&key, retried).await;
    assert!(retried(&kinds), "the second click reached the server as a retry of the same key: {kinds:?}");

    // Back to the very same checkout page, and Pay again: a replay, not a second charge.
    app.set_faults(json!({})).await;
    browser.client.back().await.unwrap();
    browser.wait_for_text("Exactly-once mug").await;
    let again = browser.find("#idempotency-key").await.text().await.unwrap();
    assert_eq!(again, key, "the back button shows the page as it was, with its key");
    browser.click("#pay").await;
    browser.wait_for_path("/shop/receipts/").await;
    assert_eq!(app.charges_for(&key).await.len(), 1, "paying again from the same page charged nothing more");

    // A payment in flight (another tab, another server) shows as such and refreshes itself.
    let pending_key = Uuid::now_v7().to_string();
    let engine = crashing_engine(&app, Duration::from_secs(60));
    let _lease = claim_and_crash(&app, &engine, &api_key, &pending_key, payment(1200), "http:busy-host:1").await;
    browser.goto(&app.url(&format!("/shop/payments/{pending_key}"))).await;
    browser.wait_for_text("Your payment is in progress").await;
    let refresh = browser.find("meta[http-equiv=refresh]").await;
    assert_eq!(refresh.attr("content").await.unwrap().as_deref(), Some("2"));
    browser.screenshot("shop-pending").await;

    // A declined card says so, charges nothing, and offers a fresh form.
    browser.goto(&app.url("/shop/checkout/tee")).await;
    browser.wait_for_text("Idempotency T-shirt").await;
    browser.click("input[value=pm_card_chargeDeclinedInsufficientFunds]").await;
    let declined_key = browser.find("#idempotency-key").await.text().await.unwrap();
    browser.click("#pay").await;
    browser.wait_for_text("Your card was declined").await;
    browser.wait_for_text("Your card has insufficient funds.").await;
    browser.wait_for_text("You have not been charged").await;
    browser.screenshot("shop-declined").await;
    assert!(app.charges_for(&declined_key).await.is_empty());
    let fresh = browser.find("#idempotency-key").await.text().await.unwrap();
    assert_ne!(fresh, declined_key, "another card needs another key");

    // The double-charge audit agrees.
    browser.goto(&app.url("/admin/gateway")).await;
    sign_in(&browser).await;
    browser.wait_for_text("No double charges.").await;
    browser.wait_for_text("1 charge in the simulator's ledger for 1 idempotency key").await;
    browser.screenshot("admin-gateway").await;
    browser.close().await;
}

/// Runs a script in the page and returns its value.
async fn eval(browser: &Browser, script: &str) -> Value {
    browser.client.execute(script, vec![]).await.unwrap_or_else(|err| panic!("{script}: {err}"))
}

/// Waits until the live refresh has replaced the element with this id (the old node is marked,
/// the new one is not).
async fn wait_for_refresh(browser: &Browser, id: &str) {
    eval(browser, &format!("document.getElementById('{id}').dataset.old = '1'; return true")).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let script = format!("var e = document.getElementById('{id}'); return !!e && !e.dataset.old");
        if eval(browser, &script).await == Value::Bool(true) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "#{id} was never refreshed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The 2-second live refresh keeps what a person is doing: the keyboard focus stays on the link
/// or disclosure it was on, an open disclosure stays open (both were once lost at every refresh),
/// and a change is said in a polite live region.
#[tokio::test]
async fn live_refresh_keeps_focus_and_open_disclosures() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    let response = app.post_payment(&api_key, Some(&key), &payment(100)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let key_id: Uuid = sqlx::query_scalar("select id from idempotency_keys where key = $1")
        .bind(&key)
        .fetch_one(&app.db)
        .await
        .unwrap();
    let browser = Browser::start().await;
    browser.goto(&app.url("/admin/keys")).await;
    sign_in(&browser).await;
    browser.wait_for_text(&key).await;

    // Focus on a key's link in the table: still there after a refresh.
    eval(&browser, &format!("document.getElementById('key-{key_id}').focus(); return true")).await;
    wait_for_refresh(&browser, "keys-live").await;
    let focused = eval(&browser, "return document.activeElement && document.activeElement.id").await;
    assert_eq!(focused, json!(format!("key-{key_id}")), "the focus survived the refresh");
    let region = browser.find("#live-status[aria-live=polite]").await;
    let fresh = new_key();
    let response = app.post_payment(&api_key, Some(&fresh), &payment(200)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    browser.wait_for_text(&fresh).await;
    wait_for_refresh(&browser, "keys-live").await;
    assert_eq!(region.text().await.unwrap(), "2 keys match", "the change is announced");

    // An open disclosure on the key's page, with the focus on it: both survive a refresh.
    browser.goto(&app.url(&format!("/admin/keys/{key_id}"))).await;
    browser.wait_for_text("Stored response").await;
    browser.click("#stored-request-summary").await;
    eval(&browser, "document.getElementById('stored-request-summary').focus(); return true").await;
    assert_eq!(eval(&browser, "return document.getElementById('stored-request').open").await, json!(true));
    wait_for_refresh(&browser, "key-live").await;
    wait_for_refresh(&browser, "key-live").await;
    assert_eq!(eval(&browser, "return document.getElementById('stored-request').open").await, json!(true));
    let focused = eval(&browser, "return document.activeElement && document.activeElement.id").await;
    assert_eq!(focused, json!("stored-request-summary"));
    browser.close().await;
}

/// How much wider than its window the page lays out (0: nothing scrolls sideways); the elements
/// that stick out are printed, to say what to fix.
async fn overflow(browser: &Browser) -> i64 {
    let width =
        eval(browser, "return document.documentElement.scrollWidth - document.documentElement.clientWidth").await;
    let culprits = eval(
        browser,
        "return Array.from(document.querySelectorAll('body *')).filter(function (e) { \
           return e.getBoundingClientRect().right > document.documentElement.clientWidth + 0.5; }).slice(0, 8).map(function (e) { \
           return e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right); })",
    )
    .await;
    if width.as_i64() != Some(0) {
        eprintln!("wider than the window: {culprits}");
    }
    width.as_i64().unwrap()
}

/// The shop on a 390 px phone: no page is wider than the screen (the checkout once laid out at
/// 859 px), from signing in to the receipt.
#[tokio::test]
async fn the_shop_fits_a_phone() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let browser = Browser::start().await;
    browser.phone().await;
    browser.goto(&app.url("/")).await;
    browser.wait_for_text("Sign in to the demo shop").await;
    assert_eq!(overflow(&browser).await, 0, "sign-in");
    browser.fill("api_key", &api_key).await;
    browser.click("form.stacked button[type=submit]").await;
    browser.wait_for_text("Hello, acme").await;
    assert_eq!(overflow(&browser).await, 0, "catalogue");
    browser.screenshot_phone("shop-phone-home").await;
    browser.click("#buy-mug").await;
    browser.wait_for_text("Exactly-once mug").await;
    assert_eq!(overflow(&browser).await, 0, "checkout");
    browser.screenshot_phone("shop-phone-checkout").await;
    browser.click("#pay").await;
    browser.wait_for_path("/shop/receipts/").await;
    browser.wait_for_text("Payment received").await;
    assert_eq!(overflow(&browser).await, 0, "receipt");
    browser.close().await;
}

/// Every state the dashboard tells apart, seen by an operator: completed, declined, stuck (saying
/// why), expired (its tombstone, found by the Expired card) and paid again after expiry (apart
/// from double charges in the audit). The screenshots are docs/images/ (`docs/images/update.sh`).
#[tokio::test]
async fn the_fixed_pages_as_an_operator_sees_them() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let api_key = app.customer("acme").await;
    for key in ["order-1", "order-2", "order-7"] {
        let response = app.post_payment(&api_key, Some(key), &payment(1000)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    let declined = json!({"amount": 1500, "currency": "usd", "payment_method": "pm_card_chargeDeclined"});
    let response = app.post_payment(&api_key, Some("order-3"), &declined).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYMENT_REQUIRED);
    let engine = crashing_engine(&app, Duration::from_secs(1));
    let stuck = claim_and_crash(&app, &engine, &api_key, "order-4", payment(4200), "http:crashed-host:4242").await;
    tokio::time::sleep(Duration::from_millis(1300)).await;

    let browser = Browser::start().await;
    browser.goto(&app.url("/admin/keys?q=order-7")).await;
    sign_in(&browser).await;
    browser.wait_for_text("1 key match").await;
    browser.click("a[href^='/admin/keys/']").await;
    browser.click("#expire-summary").await;
    browser.click("#expire").await;
    browser.wait_for_text("Expired the key").await;
    let again = app.post_payment(&api_key, Some("order-7"), &payment(1000)).send().await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);

    browser.goto(&app.url("/admin")).await;
    browser.wait_for_text("Keys by state").await;
    assert_eq!(browser.find("#count-expired .num").await.text().await.unwrap(), "1");
    browser.screenshot("dashboard-overview").await;
    browser.click("#count-expired").await;
    browser.wait_for_path("/admin/keys?state=expired").await;
    browser.wait_for_text("1 key match").await;
    browser.click("a[href^='/admin/keys/']").await;
    browser.wait_for_text("What it was").await;
    browser.wait_for_text("operator:alice").await;
    browser.screenshot("dashboard-key-expired").await;

    browser.goto(&app.url("/admin/keys")).await;
    browser.wait_for_text("Completed · declined").await;
    browser.wait_for_text("Stuck because its holder stopped without a word").await;
    // The stuck row's details, opened: its lease and where it stopped.
    browser.click(&format!("#more-{} summary", stuck.key_id)).await;
    browser.wait_for_text("http:crashed-host:4242").await;
    browser.screenshot("dashboard-keys").await;
    browser.goto(&app.url(&format!("/admin/keys/{}", stuck.key_id))).await;
    browser.wait_for_text("attempts 1/12").await;
    browser.screenshot("dashboard-key-stuck").await;

    browser.goto(&app.url("/admin/gateway")).await;
    browser.wait_for_text("No double charges.").await;
    browser.wait_for_text("Paid again after the key expired (1)").await;
    browser.screenshot("dashboard-gateway-audit").await;
    browser.close().await;
}

/// What keeps a dashboard page from fitting its window, in words (empty: it fits). The page is
/// measured as it is, then with every disclosure open (what is behind one must fit too): the
/// document must not be wider than the window, no element may end right of it, and nothing may
/// scroll sideways inside it (a table in a scrolling box hides its last columns just the same);
/// an element is named where it first sticks out, not with all that it holds.
/// A drop-down narrower than its longest label cuts that label.
const FITS: &str = r#"
var width = document.documentElement.clientWidth, problems = [];
function name(e) {
  return e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + (e.className && e.className.baseVal === undefined && e.className ? '.' + e.className.trim().split(/\s+/).join('.') : '')
    + (e.getAttribute('name') ? '[name=' + e.getAttribute('name') + ']' : '');
}
function measure(when) {
  var doc = document.documentElement;
  if (doc.scrollWidth > window.innerWidth || doc.scrollWidth > width) {
    problems.push(when + 'the page is ' + doc.scrollWidth + ' px wide in a ' + width + ' px window');
  }
  document.querySelectorAll('body *').forEach(function (e) {
    var box = e.getBoundingClientRect(), style = getComputedStyle(e);
    var parent = e.parentElement.getBoundingClientRect();
    if (box.width > 0 && box.right > width + 0.5 && !(parent.right > width + 0.5)) {
      problems.push(when + name(e) + ' ends at ' + Math.round(box.right) + ' px');
    }
    if ((style.overflowX === 'auto' || style.overflowX === 'scroll') && e.scrollWidth > e.clientWidth + 1) {
      problems.push(when + name(e) + ' scrolls sideways: ' + e.scrollWidth + ' px of content in ' + e.clientWidth + ' px');
    }
  });
}
measure('');
var closed = Array.from(document.querySelectorAll('details:not([open])'));
closed.forEach(function (d) { d.open = true; });
measure('disclosures open: ');
document.querySelectorAll('select').forEach(function (select) {
  var whole = select.cloneNode(true);
  whole.removeAttribute('id');
  whole.style.cssText = 'position: absolute; visibility: hidden; width: auto; min-width: 0; max-width: none';
  select.parentNode.insertBefore(whole, select.nextSibling);
  var needs = whole.getBoundingClientRect().width, has = select.getBoundingClientRect().width;
  whole.remove();
  if (has + 0.5 < needs) {
    problems.push(name(select) + ' is ' + Math.round(has) + ' px wide: its longest label needs ' + Math.round(needs) + ' px');
  }
});
closed.forEach(function (d) { d.open = false; });
return problems;
"#;

/// The overview's cards: per card, its id, where its badge sits in it and how tall the badge is,
/// and the card's background and border colours.
const CARDS: &str = r#"
return Array.from(document.querySelectorAll('.counts a')).map(function (card) {
  var badge = card.querySelector('.badge').getBoundingClientRect(), box = card.getBoundingClientRect();
  var style = getComputedStyle(card);
  return [card.id, Math.round(badge.top - box.top), Math.round(badge.height), style.backgroundColor, style.borderTopColor];
});
"#;

/// The dashboard on a workshop's projector (1280 × 800) with what a class makes of it: long keys
/// and a long customer name, a stuck key and a silent holder, a failed and a declined key,
/// refunds, a key expired and paid again, a double charge in the audit, and a run of all four
/// claim strategies. No page scrolls sideways (the keys table once hid Lease, Response and
/// Created behind a scroll bar), with its disclosures closed or open, and no drop-down cuts its
/// labels ("All four, one after th"); the overview's badges line up, and a Stuck or Failed card
/// stands out only when it is not zero; the lab's times have one decimal at most (it once printed
/// `326.09999999999997 ms`). With `PAYONCE_SCREENSHOTS=1`, each page is saved as
/// `target/browser-artifacts/projector-*.png`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_dashboard_fits_a_projector() {
    let app = crate::lab::lab_app().await;
    create_admin(&app).await;
    let browser = Browser::start().await;
    browser.projector().await;
    browser.goto(&app.url("/admin")).await;
    sign_in(&browser).await;
    browser.wait_for_text("Keys by state").await;
    let quiet = eval(&browser, CARDS).await;

    let acme = app.customer("acme").await;
    let globex = app.customer("Globex Corporation, EMEA wholesale and returns department").await;
    let long = |n: u32| {
        format!("checkout/eu-west-1/globex-emea-wholesale/cart-0192f3a4-7b5c-7d6e-8f90-a1b2c3d4e5f6/attempt-{n:04}")
    };
    let pay = paid(&app, &globex, &long(1), 125_000).await;
    paid(&app, &globex, &long(2), 4_200).await;
    paid(&app, &acme, &new_key(), 1_000).await;
    let refund = format!("{}/refund-1", long(1));
    let body = json!({"payment": pay, "amount": 25_000, "reason": "requested_by_customer"});
    api_refund(&app, &globex, &refund, body).await;
    api_refund(&app, &globex, &format!("{}/refund-2", long(1)), json!({"payment": pay, "amount": 10_050})).await;
    let declined =
        json!({"amount": 1500, "currency": "usd", "payment_method": "pm_card_chargeDeclinedInsufficientFunds"});
    let response = app.post_payment(&globex, Some(&long(3)), &declined).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYMENT_REQUIRED);
    // A failed key, as recovery leaves one when it gives up: final, with a 502 to replay.
    paid(&app, &globex, &long(4), 990).await;
    sqlx::query("update idempotency_keys set state = 'failed', response_status = 502 where key = $1")
        .bind(long(4))
        .execute(&app.db)
        .await
        .unwrap();
    // Expired by an operator, then paid again under the same key.
    let expired = key_id(&app, &long(2)).await;
    let engine = crashing_engine(&app, Duration::from_secs(1));
    assert!(engine.operator_expire(expired, 1, ADMIN).await.unwrap().is_ok());
    paid(&app, &globex, &long(2), 4_200).await;
    // Charged twice behind payonce's back, for the audit.
    let customer = payonce::customers::authenticate(&app.db, &globex).await.unwrap().unwrap();
    let customer = payonce::customers::CustomerId(customer.id).to_string();
    for _ in 0..2 {
        rogue_charge(&app, &customer, &long(1)).await;
    }
    let stuck =
        claim_and_crash(&app, &engine, &globex, &long(5), payment(4200), "http:payonce-eu-west-1b-7f9c4d:4242").await;
    let silent = claim_and_go_silent(&app, &globex, &long(6), "http:payonce-eu-west-1c-2b8e1a:4242").await;
    tokio::time::sleep(Duration::from_millis(1300)).await; // the stuck key's lease lapses

    // A lab run of all four strategies, through its form.
    browser.goto(&app.url("/admin/lab")).await;
    browser.fill("keys", "4").await;
    browser.fill("duplicates", "5").await;
    browser.click("#run").await;
    let run = browser.wait_for_path("/admin/lab/runs/").await;
    browser.wait_for_text("Finished.").await;

    let mut pages = vec![
        ("overview".to_owned(), "/admin".to_owned()),
        ("keys".to_owned(), "/admin/keys".to_owned()),
        ("keys-payments".to_owned(), "/admin/keys?operation=payment".to_owned()),
        ("keys-refunds".to_owned(), "/admin/keys?operation=refund".to_owned()),
        ("keys-customer".to_owned(), format!("/admin/keys?customer={customer}")),
        ("keys-search".to_owned(), "/admin/keys?q=attempt-000".to_owned()),
    ];
    for state in ["in_flight", "stuck", "completed", "failed", "expired"] {
        pages.push((format!("keys-{state}"), format!("/admin/keys?state={state}")));
    }
    for (name, key) in [
        ("key-stuck", stuck.key_id),
        ("key-silent", silent.key_id),
        ("key-completed", key_id(&app, &long(1)).await),
        ("key-declined", key_id(&app, &long(3)).await),
        ("key-failed", key_id(&app, &long(4)).await),
        ("key-refund", key_id(&app, &refund).await),
        ("key-expired", expired),
    ] {
        pages.push((name.to_owned(), format!("/admin/keys/{key}")));
    }
    pages.push(("payment".to_owned(), format!("/admin/payments/{pay}")));
    pages.push(("gateway".to_owned(), "/admin/gateway".to_owned()));
    pages.push(("lab".to_owned(), "/admin/lab".to_owned()));
    pages.push(("lab-run".to_owned(), run));

    let mut unfit = Vec::new();
    for (name, path) in &pages {
        browser.goto(&app.url(path)).await;
        browser.find("#live-status").await;
        let problems = eval(&browser, FITS).await;
        let problems = problems.as_array().unwrap();
        if !problems.is_empty() {
            unfit.push(format!(
                "{path}:\n  {}",
                problems.iter().map(|p| p.as_str().unwrap()).collect::<Vec<_>>().join("\n  ")
            ));
        }
        browser.screenshot(&format!("projector-{name}")).await;
    }
    assert!(unfit.is_empty(), "pages wider than a 1280 px projector:\n{}", unfit.join("\n"));

    // The overview: every badge at the same height in its card; only a Stuck or Failed card that
    // is not zero stands out from the others (its border and background).
    browser.goto(&app.url("/admin")).await;
    browser.wait_for_text("Keys by state").await;
    let busy = eval(&browser, CARDS).await;
    for cards in [&quiet, &busy] {
        let placed: Vec<_> = cards.as_array().unwrap().iter().map(|card| (card[1].clone(), card[2].clone())).collect();
        assert!(placed.windows(2).all(|pair| pair[0] == pair[1]), "badges at the same height, the same size: {cards}");
    }
    let look = |cards: &Value, id: &str| {
        let card = cards.as_array().unwrap().iter().find(|card| card[0] == id).unwrap();
        (card[3].clone(), card[4].clone())
    };
    for id in ["count-stuck", "count-failed"] {
        assert_eq!(look(&quiet, id), look(&quiet, "count-completed"), "a zero {id} looks like any card");
        assert_ne!(look(&busy, id), look(&busy, "count-completed"), "a non-zero {id} stands out");
    }
    assert_eq!(look(&busy, "count-in_flight"), look(&busy, "count-completed"), "only stuck and failed stand out");

    // The lab's times: one decimal at most.
    browser.goto(&app.url(&pages.last().unwrap().1)).await;
    browser.wait_for_text("Finished.").await;
    let text = browser.text().await;
    let long_decimals = text
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter(|word| {
            word.split_once('.').is_some_and(|(whole, decimals)| {
                !whole.is_empty() && decimals.len() > 1 && decimals.chars().all(|c| c.is_ascii_digit())
            })
        })
        .collect::<Vec<_>>();
    assert!(long_decimals.is_empty(), "numbers with more than one decimal: {long_decimals:?}\n{text}");
    browser.close().await;
}
