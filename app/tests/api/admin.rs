//! The dashboard's security and the operator's actions, over plain HTTP: sessions, cookies,
//! CSRF, the login rate limit, fencing, and the `payonce admins create` command.

use std::time::Duration;

use reqwest::header::{LOCATION, SET_COOKIE};
use reqwest::redirect::Policy;
use reqwest::{Client, Response, StatusCode};
use uuid::Uuid;

use crate::browser::{ADMIN, PASSWORD, claim_and_crash, crashing_engine, create_admin};
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
    let engine = crashing_engine(&app, Duration::from_secs(1));
    let key_id = claim_and_crash(&app, &engine, &api_key, &key, payment(700), "http:gone:1").await.key_id;
    let client = client();
    let csrf = sign_in(&app, &client).await;

    let message = act(&app, &client, &csrf, key_id, "release", 1).await;
    assert!(message.contains("the key is in flight now"), "a live lease is not released: {message}");
    tokio::time::sleep(Duration::from_millis(1200)).await;
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
                ("metadata[payonce_customer]", "cus_0192a0b4c5d6e7f8a9b0c1d2e3f4a5b6"),
                ("metadata[payonce_idempotency_key]", "order-42"),
                ("metadata[payonce_payment]", "pay_0192a0b4c5d6e7f8a9b0c1d2e3f4a5b6"),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{}", response.text().await.unwrap());
    }
    let page = message(&client).await;
    assert!(page.contains("1 key was charged more than once!"), "{page}");
    assert!(page.contains(r#"<tr class="double"><td><code>cus_0192a0b4c5d6e7f8a9b0c1d2e3f4a5b6</code>"#), "{page}");
    assert!(page.contains("order-42") && page.contains("no such payment"), "{page}");
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

    let completed = get("/admin/keys?state=completed&q=order-1".into()).await;
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
