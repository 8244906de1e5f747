//! The dashboard's security and the operator's actions, over plain HTTP: sessions, cookies,
//! CSRF, the login rate limit, fencing, and the `payonce admins create` command.

use std::time::Duration;

use reqwest::header::{LOCATION, SET_COOKIE};
use reqwest::redirect::Policy;
use reqwest::{Client, Response, StatusCode};
use uuid::Uuid;

use crate::browser::{ADMIN, PASSWORD, claim_and_crash, claim_and_go_silent, crashing_engine, create_admin};
use crate::helpers::{TestApp, browser_client as client, field, new_key, payment};

/// The hidden `csrf` field of a page.
async fn csrf_of(response: Response) -> String {
    field(&response.text().await.unwrap(), "csrf")
}

/// Signs `client` in; returns the session's CSRF token.
pub async fn sign_in(app: &TestApp, client: &Client) -> String {
    let csrf = csrf_of(client.get(app.url("/admin/login")).send().await.unwrap()).await;
    let response = client
        .post(app.url("/admin/login"))
        .form(&[("csrf", csrf.as_str()), ("name", ADMIN), ("password", PASSWORD), ("next", "")])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(response.headers()[LOCATION], "/admin");
    csrf_of(client.get(app.url("/admin")).send().await.unwrap()).await
}

fn location(response: &Response) -> &str {
    response.headers()[LOCATION].to_str().unwrap()
}

/// Every dashboard page sends an anonymous visitor to the login page (htmx gets `HX-Redirect`);
/// every action without a session's token is refused.
#[tokio::test]
async fn every_admin_page_needs_a_session() {
    let app = TestApp::spawn().await;
    let client = client();
    let id = Uuid::now_v7();
    for path in ["/admin", "/admin/keys", &format!("/admin/keys/{id}"), "/admin/gateway"] {
        let response = client.get(app.url(path)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::SEE_OTHER, "{path}");
        assert!(location(&response).starts_with("/admin/login"), "{path}: {}", location(&response));
    }
    let live = client.get(app.url("/admin/keys")).header("HX-Request", "true").send().await.unwrap();
    assert_eq!(live.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(live.headers()["hx-redirect"], "/admin/login?next=%2Fadmin%2Fkeys");
    for path in [format!("/admin/keys/{id}/release"), format!("/admin/keys/{id}/expire"), "/admin/logout".into()] {
        let response = client.post(app.url(&path)).form(&[("lease_token", "1")]).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{path}");
    }
    // The JSON API never sets a cookie.
    let api_key = app.customer("acme").await;
    let response = app.post_payment(&api_key, Some(&new_key()), &payment(100)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert!(response.headers().get(SET_COOKIE).is_none());
}

/// The login form's CSRF cookie and the session cookie are HttpOnly, SameSite=Strict, scoped to
/// /admin, not Secure on plain HTTP; the session begins at login with a new id (one planted
/// before is not used); logging out deletes the session, so the old cookie is worthless.
#[tokio::test]
async fn login_cycles_a_hardened_session_and_logout_ends_it() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let raw = Client::builder().redirect(Policy::none()).build().unwrap();
    let hardened = |cookie: &str, attributes: &[&str]| {
        for attribute in attributes {
            assert!(cookie.contains(attribute), "{attribute} missing: {cookie}");
        }
        assert!(!cookie.contains("Secure"), "not Secure on http://: {cookie}");
    };

    let page = raw.get(app.url("/admin/login")).send().await.unwrap();
    let cookies: Vec<&str> = page.headers().get_all(SET_COOKIE).iter().map(|c| c.to_str().unwrap()).collect();
    assert_eq!(cookies.len(), 1, "the form's token only, no session yet: {cookies:?}");
    assert!(cookies[0].starts_with("payonce_admin_csrf="), "{cookies:?}");
    hardened(cookies[0], &["HttpOnly", "SameSite=Strict", "Path=/admin"]);
    let token_cookie = cookies[0].split(';').next().unwrap().to_owned();
    let csrf = csrf_of(page).await;

    let planted = "payonce_admin=AAAAAAAAAAAAAAAAAAAAAA";
    let login = raw
        .post(app.url("/admin/login"))
        .header("cookie", format!("{token_cookie}; {planted}"))
        .form(&[("csrf", csrf.as_str()), ("name", ADMIN), ("password", PASSWORD)])
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), StatusCode::SEE_OTHER);
    let cookie = login.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    hardened(&cookie, &["HttpOnly", "SameSite=Strict", "Path=/admin", "Max-Age="]);
    let (before, after) = (planted.to_owned(), cookie.split(';').next().unwrap().to_owned());
    assert!(after.starts_with("payonce_admin="), "{after}");
    assert_ne!(before, after, "a new session id at login");
    let old = raw.get(app.url("/admin")).header("cookie", &before).send().await.unwrap();
    assert_eq!(old.status(), StatusCode::SEE_OTHER, "the pre-login id is not signed in");

    let overview = raw.get(app.url("/admin")).header("cookie", &after).send().await.unwrap();
    assert_eq!(overview.status(), StatusCode::OK);
    assert_eq!(overview.headers()["cache-control"], "no-store");
    assert!(overview.headers()["content-security-policy"].to_str().unwrap().contains("script-src 'self'"));
    let csrf = csrf_of(overview).await;
    let logout = raw
        .post(app.url("/admin/logout"))
        .header("cookie", &after)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(logout.status(), StatusCode::SEE_OTHER);
    let replayed = raw.get(app.url("/admin")).header("cookie", &after).send().await.unwrap();
    assert_eq!(replayed.status(), StatusCode::SEE_OTHER, "the session is gone from the store");
}

/// After five wrong passwords for one name from one address, even the right password gets a
/// 429 with Retry-After; another name from the same address is not locked out.
#[tokio::test]
async fn failed_logins_are_rate_limited() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    payonce::admin::accounts::create(&app.db, "bob", "another-long-password").await.unwrap();
    let client = client();
    let csrf = csrf_of(client.get(app.url("/admin/login")).send().await.unwrap()).await;
    let attempt = |name: &'static str, password: &'static str| {
        client.post(app.url("/admin/login")).form(&[("csrf", csrf.as_str()), ("name", name), ("password", password)])
    };
    for _ in 0..5 {
        let response = attempt(ADMIN, "wrong-password").send().await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert!(response.text().await.unwrap().contains("Wrong name or password."));
    }
    let blocked = attempt(ADMIN, PASSWORD).send().await.unwrap();
    assert_eq!(blocked.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = blocked.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((890..=900).contains(&retry_after), "about 15 minutes: {retry_after}");
    assert!(blocked.text().await.unwrap().contains("Too many failed sign-ins"));
    // An unknown name counts like a known one, and the pair limit is per name.
    assert_eq!(attempt("nobody", "whatever").send().await.unwrap().status(), StatusCode::UNAUTHORIZED);
    let counted: i64 = sqlx::query_scalar("select count(*) from admin_login_failures where name = 'nobody'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(counted, 1, "the failure of an unknown name is recorded like any other");
    assert_eq!(attempt("bob", "another-long-password").send().await.unwrap().status(), StatusCode::SEE_OTHER);
}

/// Forms without the session's token, or with another session's, are refused.
#[tokio::test]
async fn actions_need_the_csrf_token() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let client = client();
    let csrf = sign_in(&app, &client).await;
    let other = sign_in(&app, &self::client()).await;
    assert_ne!(csrf, other);
    let id = Uuid::now_v7();
    for form in [vec![("lease_token", "1")], vec![("lease_token", "1"), ("csrf", other.as_str())]] {
        let response = client.post(app.url(&format!("/admin/keys/{id}/release"))).form(&form).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        assert!(response.text().await.unwrap().contains("did not come from this site"));
    }
    let response = client
        .post(app.url(&format!("/admin/keys/{id}/release")))
        .form(&[("lease_token", "1"), ("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    // To the key's page, not to the sign-in page: the action ran, and found no such key.
    assert_eq!(location(&response), format!("/admin/keys/{id}"));
    let page = client.get(app.url(location(&response))).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::NOT_FOUND, "a key that never existed has no page");
}

/// Posts an action and returns the message shown on the page it redirects to.
async fn act(app: &TestApp, client: &Client, csrf: &str, key_id: Uuid, action: &str, token: i64) -> String {
    let response = client
        .post(app.url(&format!("/admin/keys/{key_id}/{action}")))
        .form(&[("csrf", csrf), ("lease_token", &token.to_string())])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let page = client.get(app.url(location(&response))).send().await.unwrap().text().await.unwrap();
    let start = page.find("class=\"flash").expect("a message");
    page[start..start + page[start..].find("</p>").unwrap()].to_owned()
}

/// The operator's actions apply only to the key as the operator saw it: a stale token, or a
/// key in the wrong state, is a no-op with a message. Expiring keeps the payment.
#[tokio::test]
async fn operator_actions_are_fenced() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    // A lease long enough to outlast signing in on a loaded machine (a 1 s one ran out first).
    let engine = crashing_engine(&app, Duration::from_secs(5));
    let key_id = claim_and_crash(&app, &engine, &api_key, &key, payment(700), "http:gone:1").await.key_id;
    let client = client();
    let csrf = sign_in(&app, &client).await;

    let message = act(&app, &client, &csrf, key_id, "release", 1).await;
    assert!(message.contains("the key is in flight now"), "a live lease is not released: {message}");
    let run_out = "select locked_until <= now() from idempotency_keys where id = $1";
    while !sqlx::query_scalar::<_, bool>(run_out).bind(key_id).fetch_one(&app.db).await.unwrap() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let message = act(&app, &client, &csrf, key_id, "expire", 1).await;
    assert!(message.contains("the key is stuck now"), "a processing key is not expired: {message}");
    let message = act(&app, &client, &csrf, key_id, "release", 7).await;
    assert!(message.contains("you saw token 7, it is now 1"), "{message}");
    let message = act(&app, &client, &csrf, key_id, "release", 1).await;
    assert!(message.contains("Released the key"), "{message}");
    let message = act(&app, &client, &csrf, key_id, "release", 1).await;
    assert!(message.contains("you saw token 1, it is now 2"), "a second release with the old token: {message}");

    let response = app.post_payment(&api_key, Some(&key), &payment(700)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(app.charges_for(&key).await.len(), 1, "the released key is resumed and charged once");
    let message = act(&app, &client, &csrf, key_id, "expire", 2).await;
    assert!(message.contains("you saw token 2, it is now 3"), "the retry took the key over: {message}");
    let message = act(&app, &client, &csrf, key_id, "expire", 3).await;
    assert!(message.contains("Expired the key"), "{message}");
    let message = act(&app, &client, &csrf, key_id, "expire", 3).await;
    assert!(message.contains("no longer exists"), "{message}");

    assert_eq!(app.count("idempotency_keys").await, 0);
    assert_eq!(app.count("payments").await, 1, "the payment outlives its key");
    let by: String =
        sqlx::query_scalar("select detail->>'by' from idempotency_events where key_id = $1 and kind = 'expired'")
            .bind(key_id)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(by, "operator:alice");
    let overview = client.get(app.url("/admin")).send().await.unwrap().text().await.unwrap();
    assert!(overview.contains(r#"<span class="num">1</span> <span class="badge expired">"#), "expired is counted");
    let page = client.get(app.url(&format!("/admin/keys/{key_id}"))).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("This key no longer exists") && page.contains("ev-expired"), "its history remains");
}

/// `payonce admins create NAME` reads the password from stdin, refuses short ones and names
/// that exist, and the account can sign in.
#[tokio::test]
async fn admins_create_command() {
    use std::io::Write;
    use std::process::{Command, Stdio};

    let app = TestApp::spawn().await;
    let database_url = app.database.url.clone();
    let run = |name: &str, password: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_payonce"))
            .args(["admins", "create", name])
            .env("DATABASE_URL", &database_url)
            .env_remove("PAYONCE_ADMIN_PASSWORD")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        writeln!(child.stdin.take().unwrap(), "{password}").unwrap();
        let output = child.wait_with_output().unwrap();
        (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let (ok, stderr) = run("short", "too-short");
    assert!(!ok && stderr.contains("at least 12 characters"), "{stderr}");
    let (ok, stderr) = run(ADMIN, PASSWORD);
    assert!(ok, "{stderr}");
    let (ok, stderr) = run(ADMIN, PASSWORD);
    assert!(!ok && stderr.contains("already exists"), "{stderr}");
    sign_in(&app, &client()).await;
}

/// The gateway panel changes the simulator's faults (reporting what it refuses), and the audit
/// shows a key charged twice in red.
#[tokio::test]
async fn gateway_panel_sets_faults_and_audit_flags_double_charges() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let client = client();
    let csrf = sign_in(&app, &client).await;
    let set = |pairs: Vec<(&'static str, &'static str)>| {
        let mut form = pairs;
        form.push(("csrf", csrf.as_str()));
        client.post(app.url("/admin/gateway/faults")).form(&form).send()
    };
    let faults = |app: &TestApp| {
        let url = format!("{}_sim/faults", app.sim_url);
        async move { reqwest::get(url).await.unwrap().json::<serde_json::Value>().await.unwrap() }
    };
    let message = |client: &Client| {
        let url = app.url("/admin/gateway");
        let client = client.clone();
        async move { client.get(url).send().await.unwrap().text().await.unwrap() }
    };

    assert_eq!(
        set(vec![("latency_ms", "250"), ("fail_rate", "0.25"), ("next_calls", "3")]).await.unwrap().status(),
        303
    );
    let now = faults(&app).await;
    assert_eq!(
        (now["latency_ms"].as_u64(), now["fail_rate"].as_f64(), now["next_calls"].as_u64()),
        (Some(250), Some(0.25), Some(3))
    );
    assert!(message(&client).await.contains("Faults updated"));

    set(vec![("fail_rate", "1.5")]).await.unwrap();
    assert!(
        message(&client)
            .await
            .contains("The simulator refused the faults: Invalid faults: fail_rate must be a probability")
    );
    set(vec![("latency_ms", "soon")]).await.unwrap();
    let page = message(&client).await;
    assert!(page.contains("latency_ms:") && page.contains("soon") && page.contains("is not a number"), "{page}");
    assert_eq!(faults(&app).await["latency_ms"], 250, "refused faults change nothing");
    set(vec![("action", "clear")]).await.unwrap();
    assert_eq!(faults(&app).await["latency_ms"], 0);

    // One honest payment, then two charges made behind payonce's back under one client key.
    let api_key = app.customer("acme").await;
    let response = app.post_payment(&api_key, Some(&new_key()), &payment(100)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let page = message(&client).await;
    assert!(page.contains("No double charges.") && page.contains("1 charge in the simulator"), "{page}");
    for _ in 0..2 {
        rogue_charge(&app, "cus_0192a0b4c5d6e7f8a9b0c1d2e3f4a5b6", "order-42").await;
    }
    let page = message(&client).await;
    assert!(page.contains("1 key was charged more than once!"), "{page}");
    assert!(page.contains(r#"<tr class="double"><td><code>cus_0192a0b4c5d6e7f8a9b0c1d2e3f4a5b6</code>"#), "{page}");
    assert!(page.contains("order-42") && page.contains("no such payment"), "{page}");
}

/// The audit reads the simulator's ledger once, then only what is new, and remembers which
/// charged payments it found succeeded; yet a database that forgot them (here a truncate, as a
/// `pg_restore --clean` does) is caught on the next load, and a reset simulator is a new ledger.
#[tokio::test]
async fn the_audit_keeps_what_it_saw_until_the_database_or_the_ledger_changes() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let client = client();
    sign_in(&app, &client).await;
    let api_key = app.customer("acme").await;
    let pay = || async {
        let response = app.post_payment(&api_key, Some(&new_key()), &payment(100)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
    };

    pay().await;
    let first = page(&app, &client, "/admin/gateway").await;
    assert!(first.contains("1 charge in the simulator") && !first.contains("no such payment"), "{first}");
    pay().await;
    let second = page(&app, &client, "/admin/gateway").await;
    assert!(second.contains("2 charges in the simulator") && !second.contains("no such payment"), "{second}");
    assert_eq!((app.charges().await.len(), app.count("payments").await), (2, 2));

    sqlx::query("truncate payments cascade").execute(&app.db).await.unwrap();
    assert_eq!((app.charges().await.len(), app.count("payments").await), (2, 0), "the ledger remembers them");
    let forgotten = page(&app, &client, "/admin/gateway").await;
    assert_eq!(forgotten.matches("no such payment").count(), 2, "{forgotten}");

    let reset = reqwest::Client::new().post(format!("{}_sim/reset", app.sim_url)).send().await.unwrap();
    assert!(reset.status().is_success());
    pay().await;
    assert_eq!((app.charges().await.len(), app.count("payments").await), (1, 1));
    let after = page(&app, &client, "/admin/gateway").await;
    assert!(after.contains("1 charge in the simulator") && !after.contains("no such payment"), "{after}");
}

/// A charge made behind payonce's back (by another client of the simulator) with payonce's
/// metadata for `customer` (`cus_…`) and the client key `key`, and a payment payonce does not
/// have: what a double charge looks like in the ledger.
pub(crate) async fn rogue_charge(app: &TestApp, customer: &str, key: &str) {
    let response = Client::new()
        .post(format!("{}v1/payment_intents", app.sim_url))
        .bearer_auth("sk_test_rogue")
        .header("Idempotency-Key", Uuid::now_v7().to_string())
        .form(&[
            ("amount", "999"),
            ("currency", "usd"),
            ("payment_method", "pm_card_visa"),
            ("confirm", "true"),
            ("automatic_payment_methods[enabled]", "true"),
            ("automatic_payment_methods[allow_redirects]", "never"),
            ("metadata[payonce_customer]", customer),
            ("metadata[payonce_idempotency_key]", key),
            ("metadata[payonce_payment]", "pay_0192a0b4c5d6e7f8a9b0c1d2e3f4a5b6"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{}", response.text().await.unwrap());
}

/// The keys table filters by state, customer and a part of the key, newest first, in keyset
/// pages of 25 that link both ways.
#[tokio::test]
async fn keys_table_filters_and_pages() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let acme = app.customer("acme").await;
    let globex = app.customer("globex").await;
    for i in 0..27 {
        let key = format!("acme-order-{i:02}");
        let response = app.post_payment(&acme, Some(&key), &payment(100 + i)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    let body = serde_json::json!({"amount": 100, "currency": "usd", "payment_method": "pm_card_chargeDeclined"});
    let response = app.post_payment(&globex, Some("globex-declined"), &body).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYMENT_REQUIRED);
    let client = client();
    sign_in(&app, &client).await;
    let get = |path: String| {
        let client = client.clone();
        let url = app.url(&path);
        async move { client.get(url).send().await.unwrap().text().await.unwrap() }
    };
    let link = |page: &str, rel: &str| {
        let end = page.find(&format!("\" rel=\"{rel}\"")).unwrap_or_else(|| panic!("no {rel} link"));
        page[page[..end].rfind("href=\"").unwrap() + 6..end].replace("&amp;", "&")
    };

    let first = get("/admin/keys".into()).await;
    assert!(first.contains("28 keys match"), "{first}");
    assert_eq!(first.matches("<tr class=\"row-").count(), 25);
    let newest = first.find("globex-declined").unwrap();
    assert!(newest < first.find("acme-order-26").unwrap(), "newest first");
    assert!(!first.contains("acme-order-02") && !first.contains("rel=\"prev\""));
    let second = get(link(&first, "next")).await;
    assert_eq!(second.matches("<tr class=\"row-").count(), 3);
    assert!(second.contains("acme-order-00") && second.contains("acme-order-02") && !second.contains("acme-order-03"));
    assert!(!second.contains("rel=\"next\""));
    let back = get(link(&second, "prev")).await;
    assert_eq!(back.matches("<tr class=\"row-").count(), 25);
    assert!(back.contains("globex-declined") && back.contains("acme-order-03") && !back.contains("rel=\"prev\""));

    let completed = get("/admin/keys?state=completed&q=acme-order-1".into()).await;
    assert!(completed.contains("10 keys match"), "acme-order-10 … 19");
    let customer = payonce::customers::authenticate(&app.db, &globex).await.unwrap().unwrap();
    let globex_page = get(format!("/admin/keys?customer={}", payonce::customers::CustomerId(customer.id))).await;
    assert!(globex_page.contains("1 key match") && globex_page.contains("globex-declined"));
    assert!(get("/admin/keys?state=stuck".into()).await.contains("No keys match."));

    // One stuck key among the completed ones: each state's total counts only its own keys.
    let engine = crashing_engine(&app, Duration::from_millis(200));
    claim_and_crash(&app, &engine, &globex, "globex-stuck", payment(300), "http:gone:1").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stuck = get("/admin/keys?state=stuck".into()).await;
    assert!(stuck.contains("1 key match") && stuck.contains("globex-stuck"), "{stuck}");
    assert!(get("/admin/keys?state=completed".into()).await.contains("28 keys match"));
    assert!(get("/admin/keys".into()).await.contains("29 keys match"));
}

/// GETs a dashboard page as `client`; its body.
pub(crate) async fn page(app: &TestApp, client: &Client, path: &str) -> String {
    let response = client.get(app.url(path)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{path}");
    response.text().await.unwrap()
}

/// The id of a client key's row.
pub(crate) async fn key_id(app: &TestApp, key: &str) -> Uuid {
    sqlx::query_scalar("select id from idempotency_keys where key = $1").bind(key).fetch_one(&app.db).await.unwrap()
}

/// Expired keys can be found: an Expired filter (which once listed every key), a link on the
/// Expired card (once the only card without one), search (which once found nothing), and a
/// tombstone page that shows the client key, the customer and how the key ended (it once showed
/// only a UUID).
#[tokio::test]
async fn expired_keys_can_be_found_and_keep_their_tombstone() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let api_key = app.customer("acme").await;
    for key in ["order-7", "order-8"] {
        let response = app.post_payment(&api_key, Some(key), &payment(700)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    let client = client();
    let csrf = sign_in(&app, &client).await;
    let id = key_id(&app, "order-7").await;
    let message = act(&app, &client, &csrf, id, "expire", 1).await;
    assert!(message.contains("Expired the key"), "{message}");

    let expired = page(&app, &client, "/admin/keys?state=expired").await;
    assert!(expired.contains("1 key match"), "only the expired key: {expired}");
    assert!(expired.contains("order-7") && !expired.contains("order-8"), "{expired}");
    assert!(expired.contains(r#"<option value="expired" selected>"#), "the filter shows what it filters by");
    let completed = page(&app, &client, "/admin/keys?state=completed").await;
    assert!(completed.contains("1 key match") && !completed.contains("order-7"), "{completed}");
    let found = page(&app, &client, "/admin/keys?q=order-7").await;
    assert!(
        found.contains("1 key match") && found.contains(r#"<span class="badge expired">Expired</span>"#),
        "{found}"
    );
    let overview = page(&app, &client, "/admin").await;
    assert!(overview.contains(r#"href="/admin/keys?state=expired""#), "the Expired card links to its keys");

    let tombstone = page(&app, &client, &format!("/admin/keys/{id}")).await;
    for shown in ["order-7", "acme", "Completed", "HTTP 201", "operator:alice", "7.00 USD"] {
        assert!(tombstone.contains(shown), "the tombstone shows {shown:?}:\n{tombstone}");
    }
}

/// A customer who pays again with the same key after it expired (the operator's Expire, or the
/// TTL) made a new payment on purpose: the audit lists it apart, and does not raise the red
/// "charged more than once" alarm (which it once did).
#[tokio::test]
async fn paying_again_after_expiry_is_not_a_double_charge() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let api_key = app.customer("acme").await;
    let client = client();
    let csrf = sign_in(&app, &client).await;
    let response = app.post_payment(&api_key, Some("order-7"), &payment(700)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let id = key_id(&app, "order-7").await;
    assert!(act(&app, &client, &csrf, id, "expire", 1).await.contains("Expired the key"));
    let again = app.post_payment(&api_key, Some("order-7"), &payment(700)).send().await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert!(again.headers().get("idempotent-replayed").is_none(), "a new payment");
    assert_eq!(app.charges_for("order-7").await.len(), 2);

    let audit = page(&app, &client, "/admin/gateway").await;
    assert!(!audit.contains("charged more than once"), "{audit}");
    assert!(audit.contains("No double charges."), "{audit}");
    assert!(audit.contains("Paid again after the key expired (1)") && audit.contains("order-7"), "{audit}");
}

/// The timeline records the Retry-After the client was sent: a live lease of 60 s with a gateway
/// timeout of 10 s tells the client 10 (the timeline once said 60).
#[tokio::test]
async fn the_timeline_records_the_retry_after_sent() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    app.set_faults(serde_json::json!({"latency_ms": 1500})).await;
    let first = tokio::spawn(app.post_payment(&api_key, Some(&key), &payment(100)).send());
    tokio::time::sleep(Duration::from_millis(400)).await;
    let second = app.post_payment(&api_key, Some(&key), &payment(100)).send().await.unwrap();
    assert_eq!(second.status(), StatusCode::CONFLICT);
    let sent = second.headers()["retry-after"].to_str().unwrap().to_owned();
    assert_eq!(sent, "10", "the gateway timeout, sooner than the lease's 60 s");
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::CREATED);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let recorded: Vec<i64> = sqlx::query_scalar(
        "select (e.detail->>'retry_after')::int8 from idempotency_events e join idempotency_keys k on k.id = e.key_id
         where k.key = $1 and e.kind = 'conflict'",
    )
    .bind(&key)
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(recorded, [10], "the conflict event says what the client was told");
}

/// A declined payment's key is final, but not a success: "Completed · declined", never a plain
/// green "Completed".
#[tokio::test]
async fn a_declined_key_says_declined() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let api_key = app.customer("acme").await;
    let body = serde_json::json!({"amount": 100, "currency": "usd", "payment_method": "pm_card_chargeDeclined"});
    let response = app.post_payment(&api_key, Some("declined-1"), &body).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYMENT_REQUIRED);
    let client = client();
    sign_in(&app, &client).await;
    let badge = r#"<span class="badge completed declined">Completed · declined</span>"#;
    assert!(page(&app, &client, "/admin/keys").await.contains(badge));
    let id = key_id(&app, "declined-1").await;
    assert!(page(&app, &client, &format!("/admin/keys/{id}")).await.contains(badge));
}

/// A stuck key says why: how its holder let go, its attempts against the budget, when it may be
/// taken next, and how long ago its holder was last heard of.
#[tokio::test]
async fn a_stuck_key_says_why() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let api_key = app.customer("acme").await;
    let engine = crashing_engine(&app, Duration::from_millis(200));
    let lease = claim_and_crash(&app, &engine, &api_key, "stuck-1", payment(300), "http:gone:1").await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let client = client();
    sign_in(&app, &client).await;
    let key_page = page(&app, &client, &format!("/admin/keys/{}", lease.key_id)).await;
    for said in ["Stuck because its holder stopped without a word", "attempts 1/12", "next attempt", "Last heartbeat"] {
        assert!(key_page.contains(said), "{said:?}:\n{key_page}");
    }
    let table = page(&app, &client, "/admin/keys?state=stuck").await;
    assert!(table.contains("Stuck because its holder stopped without a word"), "{table}");

    // Its holder gives it back instead: the reason is the one it gave.
    sqlx::query(
        "insert into idempotency_events (key_id, customer_id, kind, lease_token, detail)
         select id, customer_id, 'released', lease_token, '{\"reason\": \"gateway_unknown\"}' from idempotency_keys
         where id = $1",
    )
    .bind(lease.key_id)
    .execute(&app.db)
    .await
    .unwrap();
    let key_page = page(&app, &client, &format!("/admin/keys/{}", lease.key_id)).await;
    assert!(key_page.contains("its holder gave it back (gateway_unknown)"), "{key_page}");
}

/// A live lease whose holder stopped heartbeating (killed while its 300 s lease runs) is not shown
/// as "live, 100 s left" but as a silent holder, with when it will be taken over.
#[tokio::test]
async fn a_silent_holder_is_not_called_live() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let api_key = app.customer("acme").await;
    // Killed 200 s into its 300 s lease: a holder heartbeats every third of its lease (every 100 s).
    let lease = claim_and_go_silent(&app, &api_key, "silent-1", "http:killed:9").await;
    let silenced = std::time::Instant::now();
    let client = client();
    sign_in(&app, &client).await;
    for path in [format!("/admin/keys/{}", lease.key_id), "/admin/keys".to_owned()] {
        let body = page(&app, &client, &path).await;
        assert!(body.contains("In flight · holder silent"), "{body}");
        // 200 s when it went silent, and as many more as this test has taken since (a loaded
        // machine can take seconds to sign in and render).
        let silent_for: u64 = body
            .split_once("holder silent for ")
            .and_then(|(_, rest)| rest.split_once(" s (it heartbeats every 100 s)"))
            .and_then(|(secs, _)| secs.parse().ok())
            .unwrap_or_else(|| panic!("no \"holder silent for N s (it heartbeats every 100 s)\": {body}"));
        assert!((200..=201 + silenced.elapsed().as_secs()).contains(&silent_for), "silent for {silent_for} s");
        assert!(!body.contains("live, "), "never called live: {body}");
    }
}

/// A browser that meets no route gets an HTML page; the API's paths, and clients that do not ask
/// for HTML, keep the problem document.
#[tokio::test]
async fn not_found_is_a_page_for_browsers_and_a_problem_for_the_api() {
    let app = TestApp::spawn().await;
    let html = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
    let page = Client::new().get(app.url("/no-such-page")).header("accept", html).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::NOT_FOUND);
    assert!(page.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    assert!(page.headers()["content-security-policy"].to_str().unwrap().contains("default-src 'self'"));
    assert!(page.text().await.unwrap().contains("There is nothing at this address."));
    for (path, accept) in [("/v1/no-such-thing", html), ("/no-such-page", "application/json"), ("/no-such-page", "*/*")]
    {
        let response = Client::new().get(app.url(path)).header("accept", accept).send().await.unwrap();
        crate::helpers::assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
    }
}

/// A session that ran out (on the projector) does not land on a bare login page: it says the
/// session expired, and signing in returns to the page asked for.
#[tokio::test]
async fn an_expired_session_says_so_and_keeps_next() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let client = client();
    sign_in(&app, &client).await;
    sqlx::query("delete from tower_sessions.session").execute(&app.db).await.unwrap();
    let response = client.get(app.url("/admin/keys?state=stuck")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(location(&response), "/admin/login?next=%2Fadmin%2Fkeys%3Fstate%3Dstuck&expired=1");
    let login = page(&app, &client, location(&response)).await;
    assert!(login.contains("Your session expired after 30 minutes without use"), "{login}");
    assert_eq!(field(&login, "next"), "/admin/keys?state=stuck");
    // A first visit, with no session cookie at all, is not told anything expired.
    let fresh = self::client().get(app.url("/admin/keys")).send().await.unwrap();
    assert_eq!(location(&fresh), "/admin/login?next=%2Fadmin%2Fkeys");
}

/// The session's expiry in the store, for the session of `client` (the only one).
async fn session_expiry(app: &TestApp) -> time::OffsetDateTime {
    sqlx::query_scalar("select expiry_date from tower_sessions.session").fetch_one(&app.db).await.unwrap()
}

/// In workshop mode the dashboard's live refresh keeps the operator signed in; otherwise it does
/// not (a dashboard left open signs out after the idle time).
#[tokio::test]
async fn workshop_mode_keeps_the_projector_signed_in() {
    for workshop in [false, true] {
        let web = payonce::config::WebConfig { workshop, ..Default::default() };
        let app = TestApp::spawn_with(crate::helpers::Options { web, ..Default::default() }).await;
        create_admin(&app).await;
        let client = client();
        sign_in(&app, &client).await;
        let before = session_expiry(&app).await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let live = client.get(app.url("/admin/keys")).header("HX-Request", "true").send().await.unwrap();
        assert_eq!(live.status(), StatusCode::OK);
        let after = session_expiry(&app).await;
        assert_eq!(after > before, workshop, "workshop {workshop}: {before} → {after}");
    }
}

/// The workshop's reset (workshop mode only) empties the simulator's ledger and deletes every key
/// and payment; customers stay. Without workshop mode there is no such action.
#[tokio::test]
async fn workshop_reset_starts_over() {
    let web = payonce::config::WebConfig { workshop: true, ..Default::default() };
    let app = TestApp::spawn_with(crate::helpers::Options { web, ..Default::default() }).await;
    create_admin(&app).await;
    let api_key = app.customer("acme").await;
    let response = app.post_payment(&api_key, Some("order-1"), &payment(100)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let client = client();
    let csrf = sign_in(&app, &client).await;
    assert!(page(&app, &client, "/admin/gateway").await.contains("Workshop reset"));
    let reset = client.post(app.url("/admin/gateway/reset")).form(&[("csrf", csrf.as_str())]).send().await.unwrap();
    assert_eq!(reset.status(), StatusCode::SEE_OTHER);
    let after = page(&app, &client, "/admin/gateway").await;
    assert!(after.contains("Reset: the simulator&#39;s ledger is empty"), "{after}");
    assert!(app.charges().await.is_empty());
    for table in ["idempotency_keys", "payments", "idempotency_events"] {
        assert_eq!(app.count(table).await, 0, "{table}");
    }
    assert_eq!(app.count("customers").await, 1);
    let again = app.post_payment(&api_key, Some("order-1"), &payment(100)).send().await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED, "the same key is a new payment");
    assert!(again.headers().get("idempotent-replayed").is_none());

    let plain = TestApp::spawn().await;
    create_admin(&plain).await;
    let client = self::client();
    let csrf = sign_in(&plain, &client).await;
    assert!(!page(&plain, &client, "/admin/gateway").await.contains("Workshop reset"));
    let refused = client.post(plain.url("/admin/gateway/reset")).form(&[("csrf", csrf.as_str())]).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::NOT_FOUND);
}

/// `payonce serve --admin-only` serves the dashboard and the health checks without the payments
/// API or a sweeper, on the same database as the servers it watches.
#[tokio::test]
async fn an_admin_only_server_serves_the_dashboard_alone() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let api_key = app.customer("acme").await;
    let dashboard =
        crate::helpers::ServerProcess::start(&app.database.url, &app.sim_url, &[("PAYONCE_ADMIN_ONLY", "true")]).await;
    let response = Client::new()
        .post(dashboard.url("/v1/payments"))
        .bearer_auth(&api_key)
        .header("Idempotency-Key", "order-1")
        .json(&payment(100))
        .send()
        .await
        .unwrap();
    crate::helpers::assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
    let client = client();
    let csrf = csrf_of(client.get(dashboard.url("/admin/login")).send().await.unwrap()).await;
    let login = client
        .post(dashboard.url("/admin/login"))
        .form(&[("csrf", csrf.as_str()), ("name", ADMIN), ("password", PASSWORD)])
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), StatusCode::SEE_OTHER);
    let paid = app.post_payment(&api_key, Some("order-1"), &payment(100)).send().await.unwrap();
    assert_eq!(paid.status(), StatusCode::CREATED);
    let keys = client.get(dashboard.url("/admin/keys")).send().await.unwrap().text().await.unwrap();
    assert!(keys.contains("order-1"), "the other server's key: {keys}");
    let gateway = client.get(dashboard.url("/admin/gateway")).send().await.unwrap().text().await.unwrap();
    assert!(gateway.contains("1 charge in the simulator"), "it audits the servers' simulator: {gateway}");
    // It stops when told to (it once waited forever for an event log nobody writes to).
    let mut dashboard = dashboard;
    let status = dashboard.terminate(Duration::from_secs(10)).await.expect("stopped within 10 s of SIGTERM");
    assert!(status.success(), "{status}");
}

/// The ids of the keys a keys page lists, in its order.
fn listed_ids(page: &str) -> Vec<Uuid> {
    page.split("id=\"key-").skip(1).map(|rest| Uuid::try_parse(&rest[..36]).unwrap()).collect()
}

/// At scale a count stops at 10,000 and says so: the overview's "10,000+" completed keys and the
/// keys table's "10,000+ keys match" (both were exact counts of every key, read on each refresh,
/// which took seconds at a million keys). Below the cap a count is exact; the overview's total is
/// the planner's estimate, marked "≈". The search finds a key by its beginning, by the payment it
/// made (`pay_…`) and by that payment's PaymentIntent (`pi_…`).
#[tokio::test]
async fn counts_stop_at_the_cap_and_say_so() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    crate::scale::fill(&app.database.url, 15_000).await;
    let client = client();
    sign_in(&app, &client).await;

    let overview = page(&app, &client, "/admin").await;
    assert!(overview.contains(r#"<span class="num">10,000+</span> <span class="badge completed">"#), "{overview}");
    assert!(overview.contains(r#"<span class="num">300</span> <span class="badge failed">"#), "2 % of 15,000");
    assert!(overview.contains("keys in all, as of the table's last analyze"), "the estimate, marked ≈: {overview}");
    assert!(page(&app, &client, "/admin/keys").await.contains("10,000+ keys match"));
    assert!(page(&app, &client, "/admin/keys?state=failed").await.contains("300 keys match"));
    assert!(
        page(&app, &client, "/admin/keys?state=expired").await.contains("2,688 keys match"),
        "21 % of the keys older than a day"
    );

    // The search: a key's beginning (its live keys and tombstones), a payment id, a PaymentIntent id.
    let (key_id, key, payment, payment_intent): (Uuid, String, Uuid, String) = sqlx::query_as(
        "select k.id, k.key, p.id, p.gateway_payment_intent_id from idempotency_keys k join payments p on p.key_id = k.id
         where k.key like '%-000005012'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    let prefix = &key[..key.len() - 2];
    let expected: i64 = sqlx::query_scalar(
        "select (select count(*) from idempotency_keys where starts_with(key, $1))
              + (select count(*) from idempotency_events where kind = 'expired' and starts_with(detail->>'key', $1))",
    )
    .bind(prefix)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert!(expected > 100, "5000 … 5099 and their refund keys");
    let found = page(&app, &client, &format!("/admin/keys?q={prefix}")).await;
    assert!(found.contains(&format!("{expected} keys match")), "{expected}: {found}");
    for search in [payonce::payments::PaymentId(payment).to_string(), payment_intent] {
        let found = page(&app, &client, &format!("/admin/keys?q={search}")).await;
        assert!(found.contains("1 key match"), "{search}: {found}");
        assert_eq!(listed_ids(&found), [key_id], "{search}");
    }
    let middle = &key[6..];
    assert!(
        page(&app, &client, &format!("/admin/keys?q={middle}")).await.contains("No keys match."),
        "not a substring"
    );
}

/// Pages are read by keyset (from the last row shown), not by OFFSET: keys claimed while an
/// operator reads the first page neither shift the next pages nor show a row twice, and every key
/// and tombstone older than the first page comes once, in id order, to the end.
#[tokio::test]
async fn paging_follows_the_rows_not_their_positions() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    crate::scale::fill(&app.database.url, 100).await;
    let client = client();
    sign_in(&app, &client).await;
    let all = |app: &TestApp| {
        let db = app.db.clone();
        async move {
            sqlx::query_scalar::<_, Uuid>(
                "select id from (select id from idempotency_keys union all
                                 select key_id from idempotency_events where kind = 'expired') s order by id desc",
            )
            .fetch_all(&db)
            .await
            .unwrap()
        }
    };
    let first = page(&app, &client, "/admin/keys").await;
    let shown = listed_ids(&first);
    assert_eq!(shown, all(&app).await[..25]);
    // More keys arrive, some newer than every key shown (the fill's held keys are a minute old):
    // with OFFSET 25 the next page would repeat rows of the first.
    crate::scale::fill(&app.database.url, 100).await;
    let cursor = *shown.last().unwrap();
    let mut expected = shown.clone();
    expected.extend(all(&app).await.into_iter().filter(|id| *id < cursor));
    let link = |page: &str| {
        let end = page.find("\" rel=\"next\"")?;
        Some(page[page[..end].rfind("href=\"").unwrap() + 6..end].replace("&amp;", "&"))
    };
    let mut seen = shown;
    let mut next = link(&first);
    while let Some(path) = next {
        let body = page(&app, &client, &path).await;
        seen.extend(listed_ids(&body));
        next = link(&body);
    }
    assert!(seen.len() > 150, "several pages: {}", seen.len());
    assert_eq!(seen, expected, "every row older than the first page once, in order");
}
