//! Refunds on the dashboard, over plain HTTP: refund keys beside payment keys (the Operation
//! column and filter), a refund key's page, a payment's page with its refunds, and the refund
//! form, which runs the API's idempotent path under a key generated with the page. Every test
//! asserts the database and the simulator's ledger.

use std::sync::Arc;

use reqwest::header::{CACHE_CONTROL, LOCATION};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use tokio::sync::Barrier;
use uuid::Uuid;

use crate::admin::{key_id, page, sign_in};
use crate::browser::create_admin;
use crate::helpers::{TestApp, browser_client as client, field, new_key, parts, payment};

/// A succeeded payment of `amount` under `key`; returns its id (`pay_…`).
pub(crate) async fn paid(app: &TestApp, api_key: &str, key: &str, amount: i64) -> String {
    let response = app.post_payment(api_key, Some(key), &payment(amount)).send().await.unwrap();
    let (status, _, body) = parts(response).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["id"].as_str().unwrap().to_owned()
}

/// A refund through the API; returns its JSON.
pub(crate) async fn api_refund(app: &TestApp, api_key: &str, key: &str, body: Value) -> Value {
    let (status, _, body) = parts(app.post_refund(api_key, Some(key), &body).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body
}

/// The messages (flashes) of a page.
fn flashes(page: &str) -> String {
    let mut messages = Vec::new();
    let mut rest = page;
    while let Some(start) = rest.find("<p class=\"flash") {
        let end = start + rest[start..].find("</p>").unwrap();
        messages.push(&rest[start..end]);
        rest = &rest[end..];
    }
    messages.join("\n")
}

/// The refund form of a payment's page, as rendered: (csrf, key, proposed amount).
struct RenderedForm {
    csrf: String,
    key: String,
    amount: String,
}

async fn render_form(app: &TestApp, client: &Client, payment: &str) -> RenderedForm {
    let body = page(app, client, &format!("/admin/payments/{payment}")).await;
    RenderedForm { csrf: field(&body, "csrf"), key: field(&body, "key"), amount: field(&body, "amount") }
}

/// Sends a rendered refund form with `amount` and `reason`; returns the page it leads to and its
/// messages.
async fn send_form(
    app: &TestApp,
    client: &Client,
    payment: &str,
    form: &RenderedForm,
    amount: &str,
    reason: &str,
) -> (String, String) {
    let response = client
        .post(app.url(&format!("/admin/payments/{payment}/refunds")))
        .form(&[("csrf", form.csrf.as_str()), ("key", form.key.as_str()), ("amount", amount), ("reason", reason)])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER, "{}", response.text().await.unwrap());
    let location = response.headers()[LOCATION].to_str().unwrap().to_owned();
    assert_eq!(location, format!("/admin/payments/{payment}?form={}", form.key), "the form's own result page");
    let body = page(app, client, &location).await;
    let messages = flashes(&body);
    (body, messages)
}

/// The refunds table's rows, by their refund ids.
async fn refund_rows(app: &TestApp) -> Vec<(String, i64, String)> {
    sqlx::query_as("select 're_' || replace(id::text, '-', ''), amount, status from refunds order by created_at, id")
        .fetch_all(&app.db)
        .await
        .unwrap()
}

/// The Operation filter lists only refund keys (or only payment keys), composed with the state
/// filter and the search, kept by the live refresh and the pager's links, and it finds refund
/// keys that expired (their tombstone names their route). Each row says its operation.
#[tokio::test]
async fn the_operation_filter_shows_only_refund_keys() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let acme = app.customer("acme").await;
    let pay = paid(&app, &acme, "order-1", 10_000).await;
    paid(&app, &acme, "order-2", 500).await;
    api_refund(&app, &acme, "refund-1", json!({"payment": pay, "amount": 1000})).await;
    api_refund(&app, &acme, "refund-2", json!({"payment": pay, "amount": 2000})).await;
    let client = client();
    let csrf = sign_in(&app, &client).await;

    let all = page(&app, &client, "/admin/keys").await;
    assert!(all.contains("4 keys match"), "{all}");
    assert!(all.contains("<th scope=\"col\">Operation</th>"), "{all}");
    assert_eq!(all.matches(r#"<span class="op op-refund">refund</span>"#).count(), 2, "{all}");
    assert_eq!(all.matches(r#"<span class="op op-payment">payment</span>"#).count(), 2, "{all}");

    let refunds = page(&app, &client, "/admin/keys?operation=refund").await;
    assert!(refunds.contains("2 keys match"), "{refunds}");
    assert!(refunds.contains("refund-1") && refunds.contains("refund-2"), "{refunds}");
    assert!(!refunds.contains("order-1") && !refunds.contains("order-2"), "only refund keys: {refunds}");
    assert!(!refunds.contains("op-payment"), "{refunds}");
    assert!(refunds.contains(r#"<option value="refund" selected>Refunds</option>"#), "the filter shows itself");
    assert!(refunds.contains(r#"hx-get="/admin/keys?operation=refund""#), "the live refresh keeps the filter");

    let payments = page(&app, &client, "/admin/keys?operation=payment").await;
    assert!(payments.contains("2 keys match") && payments.contains("order-1") && !payments.contains("refund-1"));

    // Composed with the search, the state, the customer; an unknown operation filters nothing.
    let searched = page(&app, &client, "/admin/keys?operation=refund&q=refund-2").await;
    assert!(searched.contains("1 key match") && searched.contains("refund-2"), "{searched}");
    assert!(page(&app, &client, "/admin/keys?operation=refund&q=order").await.contains("No keys match."));
    assert!(page(&app, &client, "/admin/keys?operation=refund&state=stuck").await.contains("No keys match."));
    let completed = page(&app, &client, "/admin/keys?operation=refund&state=completed").await;
    assert!(completed.contains("2 keys match"), "{completed}");
    assert!(page(&app, &client, "/admin/keys?operation=bogus").await.contains("4 keys match"));

    // An expired refund key is still a refund key.
    let refund_key = key_id(&app, "refund-1").await;
    let expire = client
        .post(app.url(&format!("/admin/keys/{refund_key}/expire")))
        .form(&[("csrf", csrf.as_str()), ("lease_token", "1")])
        .send()
        .await
        .unwrap();
    assert_eq!(expire.status(), StatusCode::SEE_OTHER);
    let expired = page(&app, &client, "/admin/keys?operation=refund&state=expired").await;
    assert!(expired.contains("1 key match") && expired.contains("refund-1"), "{expired}");
    assert!(page(&app, &client, "/admin/keys?operation=payment&state=expired").await.contains("No keys match."));
    let route: String = sqlx::query_scalar("select detail->>'route' from idempotency_events where kind = 'expired'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(route, "/v1/refunds", "the tombstone keeps the key's route");

    // Pages of refund keys link to pages of refund keys.
    for i in 0..26 {
        api_refund(&app, &acme, &format!("more-{i:02}"), json!({"payment": pay, "amount": 10})).await;
    }
    let first = page(&app, &client, "/admin/keys?operation=refund").await;
    assert!(first.contains("28 keys match"), "26 + refund-2 + the expired refund-1: {first}");
    let next = first.find("\" rel=\"next\"").expect("an older page");
    let href = &first[first[..next].rfind("href=\"").unwrap() + 6..next];
    assert!(href.contains("operation=refund"), "{href}");
    let older = page(&app, &client, &href.replace("&#38;", "&").replace("&amp;", "&")).await;
    assert_eq!(older.matches("<tr class=\"row-").count(), 3, "{older}");
    assert!(older.contains("refund-1") && !older.contains("order-"), "{older}");
}

/// A refund key's page shows its refund (id, amount, status, the gateway's refund id, the payment
/// it refunds, linked), not "No payment yet"; so does its tombstone once it expired.
#[tokio::test]
async fn a_refund_keys_page_shows_its_refund() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let acme = app.customer("acme").await;
    let pay = paid(&app, &acme, "order-1", 10_000).await;
    let refund =
        api_refund(&app, &acme, "refund-1", json!({"payment": pay, "amount": 3000, "reason": "duplicate"})).await;
    let gateway_refund = refund["gateway_refund"].as_str().unwrap().to_owned();
    assert_eq!(app.ledger.refunds().await[0]["refund"], gateway_refund.as_str());
    let client = client();
    let csrf = sign_in(&app, &client).await;
    let id = key_id(&app, "refund-1").await;

    let key_page = page(&app, &client, &format!("/admin/keys/{id}")).await;
    for shown in [
        refund["id"].as_str().unwrap(),
        "30.00 USD",
        r#"<span class="badge pay-succeeded">succeeded</span>"#,
        gateway_refund.as_str(),
        &format!(r#"<a href="/admin/payments/{pay}" id="refund-payment">"#),
        "duplicate",
        "<dd>refund</dd>",
    ] {
        assert!(key_page.contains(shown), "the refund key's page shows {shown:?}:\n{key_page}");
    }
    assert!(!key_page.contains("No payment yet"), "{key_page}");
    assert!(!key_page.contains("Requested by"), "the customer's own refund names no operator");

    // A payment key's page links its payment's page.
    let payment_page = page(&app, &client, &format!("/admin/keys/{}", key_id(&app, "order-1").await)).await;
    assert!(payment_page.contains(&format!(r#"<a href="/admin/payments/{pay}" id="payment-link">"#)));

    let expire = client
        .post(app.url(&format!("/admin/keys/{id}/expire")))
        .form(&[("csrf", csrf.as_str()), ("lease_token", "1")])
        .send()
        .await
        .unwrap();
    assert_eq!(expire.status(), StatusCode::SEE_OTHER);
    let tombstone = page(&app, &client, &format!("/admin/keys/{id}")).await;
    assert!(tombstone.contains("This key no longer exists"), "{tombstone}");
    for shown in [refund["id"].as_str().unwrap(), "30.00 USD", gateway_refund.as_str(), "<dd>refund</dd>"] {
        assert!(tombstone.contains(shown), "the tombstone shows {shown:?}:\n{tombstone}");
    }
    assert!(!tombstone.contains("No payment"), "{tombstone}");
}

/// A payment's page lists its refunds (id, amount, reason, status, created, its key linked) and
/// what is refunded and what remains; the form proposes what remains. It is cached privately
/// (not `no-store`), so Back shows the same form with the same key.
#[tokio::test]
async fn the_payment_page_lists_its_refunds() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let acme = app.customer("acme").await;
    let pay = paid(&app, &acme, "order-1", 10_000).await;
    let first = api_refund(&app, &acme, "refund-1", json!({"payment": pay, "amount": 3000})).await;
    let second =
        api_refund(&app, &acme, "refund-2", json!({"payment": pay, "amount": 2050, "reason": "fraudulent"})).await;
    let client = client();
    sign_in(&app, &client).await;

    let response = client.get(app.url(&format!("/admin/payments/{pay}"))).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[CACHE_CONTROL], "private, no-cache");
    let body = response.text().await.unwrap();
    assert!(body.contains(r#"<dd id="amount-refunded">50.50 USD</dd>"#), "{body}");
    assert!(body.contains(r#"<dd id="amount-remaining">49.50 USD</dd>"#), "{body}");
    assert!(body.contains("100.00 USD") && body.contains("acme"), "{body}");
    let (one, two) = (first["id"].as_str().unwrap(), second["id"].as_str().unwrap());
    let (at_one, at_two) = (body.find(one).expect("the first refund"), body.find(two).expect("the second refund"));
    assert!(at_two < at_one, "newest first");
    for shown in ["30.00 USD", "20.50 USD", "fraudulent", r#"<span class="badge pay-succeeded">succeeded</span>"#] {
        assert!(body.contains(shown), "{shown:?}:\n{body}");
    }
    for key in ["refund-1", "refund-2"] {
        let link = format!(r#"<a href="/admin/keys/{}"><code>{key}</code></a>"#, key_id(&app, key).await);
        assert!(body.contains(&link), "{link}:\n{body}");
    }
    assert!(body.contains("<time datetime=\""), "created");
    assert_eq!(field(&body, "amount"), "49.50", "the form proposes what remains");
    let key = field(&body, "key");
    assert!(Uuid::try_parse(&key).is_ok(), "a key generated with the page: {key}");
    let again = page(&app, &client, &format!("/admin/payments/{pay}")).await;
    assert_ne!(field(&again, "key"), key, "every rendering is a new form");

    // A refund that failed at the gateway gave its amount back: refunded and remaining say so.
    sqlx::query("update refunds set status = 'failed', failure_message = 'expired card' where amount = 2050")
        .execute(&app.db)
        .await
        .unwrap();
    sqlx::query("update payments set amount_refunded = 3000").execute(&app.db).await.unwrap();
    let body = page(&app, &client, &format!("/admin/payments/{pay}")).await;
    assert!(body.contains(r#"<dd id="amount-remaining">70.00 USD</dd>"#), "{body}");
    assert!(body.contains("expired card") && body.contains(r#"<span class="badge pay-failed">failed</span>"#));

    assert_eq!(client.get(app.url("/admin/payments/pay_nope")).send().await.unwrap().status(), StatusCode::NOT_FOUND);
    let unknown = format!("/admin/payments/pay_{}", Uuid::now_v7().simple());
    assert_eq!(client.get(app.url(&unknown)).send().await.unwrap().status(), StatusCode::NOT_FOUND);
    let anonymous = self::client().get(app.url(&format!("/admin/payments/{pay}"))).send().await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::SEE_OTHER, "operators only");
}

/// The refund form sent twice with the same rendered key (a resubmit, Back and Refund again) is
/// one refund: one row, one gateway refund, and the second submit is told what the first did.
/// Two sends at the same instant (a double click) are one refund too. The refund is the
/// customer's, made through the API's path, and its key's timeline names the operator.
#[tokio::test]
async fn the_form_sent_twice_is_one_refund() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let acme = app.customer("acme").await;
    let pay = paid(&app, &acme, "order-1", 10_000).await;
    let client = client();
    sign_in(&app, &client).await;

    let form = render_form(&app, &client, &pay).await;
    assert_eq!(form.amount, "100.00");
    let (_, first) = send_form(&app, &client, &pay, &form, "25.00", "requested_by_customer").await;
    let refunds = refund_rows(&app).await;
    assert_eq!(refunds.len(), 1);
    let (refund_id, amount, status) = &refunds[0];
    assert_eq!((*amount, status.as_str()), (2500, "succeeded"));
    assert!(first.contains(&format!("Refunded 25.00 USD: refund {refund_id}, succeeded")), "{first}");

    let (body, second) = send_form(&app, &client, &pay, &form, "25.00", "requested_by_customer").await;
    assert!(second.contains("This form was already sent") && second.contains(refund_id.as_str()), "{second}");
    assert!(second.contains("Nothing was refunded again"), "{second}");
    assert!(body.contains("<small>this form's refund</small>"), "the page marks it: {body}");
    assert_eq!(refund_rows(&app).await.len(), 1, "one refund in the database");
    // The same rendered form with another amount is refused, as the API refuses another payload.
    let (_, other) = send_form(&app, &client, &pay, &form, "10.00", "requested_by_customer").await;
    assert!(other.contains("Nothing was done: this form was already sent with other details"), "{other}");
    assert_eq!(refund_rows(&app).await.len(), 1);
    let ledger = app.ledger.refunds().await;
    assert_eq!(ledger.len(), 1, "one refund at the gateway");
    assert_eq!(ledger[0]["amount"], 2500);
    assert_eq!(ledger[0]["reason"], "requested_by_customer");
    assert_eq!(ledger[0]["metadata"]["payonce_idempotency_key"], form.key.as_str());

    // The same idempotent path: the customer's key on the refund route, its timeline as the API's,
    // with the operator named by the first write, and the replay recorded.
    let (customer, route, by): (String, String, Option<String>) = sqlx::query_as(
        "select c.name, k.route, (select e.detail->>'by' from idempotency_events e
                                  where e.key_id = k.id and e.kind = 'refund_created')
         from idempotency_keys k join customers c on c.id = k.customer_id where k.key = $1",
    )
    .bind(&form.key)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!((customer.as_str(), route.as_str(), by.as_deref()), ("acme", "/v1/refunds", Some("operator:alice")));
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(
        app.event_kinds_once(&form.key, |kinds| kinds.len() >= 5).await,
        ["claimed", "refund_created", "completed", "replayed", "mismatch"]
    );
    let key_page = page(&app, &client, &format!("/admin/keys/{}", key_id(&app, &form.key).await)).await;
    assert!(key_page.contains("Requested by</dt><dd>operator:alice"), "{key_page}");
    // The customer sees its refund through the API, as any other.
    let (status, _, listed) = parts(app.get(&acme, &format!("/v1/refunds?payment={pay}")).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["data"][0]["id"], refund_id.as_str());

    // A double click: two sends of one rendered form at the same instant, while the gateway is slow.
    app.set_faults(json!({"latency_ms": 600, "operations": ["create_refund"]})).await;
    let form = Arc::new(render_form(&app, &client, &pay).await);
    assert_eq!(form.amount, "75.00");
    let barrier = Arc::new(Barrier::new(2));
    let clicks: Vec<_> = (0..2)
        .map(|_| {
            let (client, barrier, form) = (client.clone(), barrier.clone(), form.clone());
            let url = app.url(&format!("/admin/payments/{pay}/refunds"));
            tokio::spawn(async move {
                barrier.wait().await;
                client
                    .post(url)
                    .form(&[
                        ("csrf", form.csrf.as_str()),
                        ("key", form.key.as_str()),
                        ("amount", "75.00"),
                        ("reason", ""),
                    ])
                    .send()
                    .await
                    .unwrap()
                    .status()
            })
        })
        .collect();
    for click in clicks {
        assert_eq!(click.await.unwrap(), StatusCode::SEE_OTHER, "neither click is an error page");
    }
    // The second click waited for the first and shows its answer: the page after a double click
    // (the browser shows the last click's) tells what was refunded.
    let messages = flashes(&page(&app, &client, &format!("/admin/payments/{pay}?form={}", form.key)).await);
    assert!(
        messages.contains("Refunded 75.00 USD") || messages.contains("already sent: it refunded 75.00 USD"),
        "{messages}"
    );
    tokio::time::sleep(std::time::Duration::from_millis(100)).await; // observations are written in batches
    let conflicts: i64 = sqlx::query_scalar(
        "select count(*) from idempotency_events e join idempotency_keys k on k.id = e.key_id
         where k.key = $1 and e.kind = 'conflict'",
    )
    .bind(&form.key)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(conflicts, 1, "the two clicks met at the key: one was a retry of the other");
    let refunds = refund_rows(&app).await;
    assert_eq!(refunds.iter().map(|r| r.1).collect::<Vec<_>>(), [2500, 7500], "one refund per form");
    assert_eq!(app.ledger.refunds().await.len(), 2, "one gateway refund per form");
    let refunded: i64 = sqlx::query_scalar("select amount_refunded from payments").fetch_one(&app.db).await.unwrap();
    assert_eq!(refunded, 10_000);
    let body = page(&app, &client, &format!("/admin/payments/{pay}")).await;
    assert!(body.contains("Nothing remains to refund") && !body.contains("name=\"key\""), "no form left: {body}");
}

/// A refund beyond what remains is refused with a message saying how much remains, and nothing
/// is refunded (the key is not even used); so are an amount that is not one, a payment that did
/// not succeed, and a form without the session's CSRF token. None of them is an error page.
#[tokio::test]
async fn a_refund_beyond_what_remains_is_refused_with_a_message() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let acme = app.customer("acme").await;
    let pay = paid(&app, &acme, "order-1", 1000).await;
    api_refund(&app, &acme, "refund-1", json!({"payment": pay, "amount": 400})).await;
    let client = client();
    sign_in(&app, &client).await;

    let form = render_form(&app, &client, &pay).await;
    assert_eq!(form.amount, "6.00");
    let (_, message) = send_form(&app, &client, &pay, &form, "15.00", "").await;
    assert!(
        message.contains("Nothing was refunded: 15.00 USD is more than the 6.00 USD that remains of this payment"),
        "{message}"
    );
    assert_eq!(refund_rows(&app).await.len(), 1, "only the earlier refund");
    assert_eq!(app.ledger.refunds().await.len(), 1);
    let refunded: i64 = sqlx::query_scalar("select amount_refunded from payments").fetch_one(&app.db).await.unwrap();
    assert_eq!(refunded, 400, "nothing reserved");
    assert!(app.database.key_state(&form.key).await.is_none(), "the refused request did not use its key");

    for amount in ["lots", "0", "-5.00", "1.234"] {
        let (_, message) = send_form(&app, &client, &pay, &form, amount, "").await;
        assert!(message.contains(&format!("Nothing was refunded: “{amount}” is not an amount")), "{message}");
    }
    let (_, message) = send_form(&app, &client, &pay, &form, "1.00", "bored").await;
    assert!(message.contains("Nothing was refunded: reason: must be one of"), "{message}");
    assert_eq!(refund_rows(&app).await.len(), 1);

    // The same form, with an amount that fits: its key was never used, so it refunds now.
    let (_, message) = send_form(&app, &client, &pay, &form, "6.00", "duplicate").await;
    assert!(message.contains("Refunded 6.00 USD"), "{message}");
    let (_, message) = send_form(&app, &client, &pay, &render_form_key(&form, new_key()), "0.01", "").await;
    assert!(message.contains("already refunded in full"), "{message}");
    assert_eq!(app.ledger.refunds().await.len(), 2);

    // A declined payment: no form, and a crafted send is told why.
    let declined = json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_chargeDeclined"});
    let (status, _, body) = parts(app.post_payment(&acme, Some("order-2"), &declined).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED);
    let failed = body["payment"].as_str().unwrap().to_owned();
    let failed_page = page(&app, &client, &format!("/admin/payments/{failed}")).await;
    assert!(failed_page.contains("Only a succeeded payment can be refunded; this one is failed"), "{failed_page}");
    assert!(!failed_page.contains("name=\"key\""), "no refund form");
    let (_, message) = send_form(&app, &client, &failed, &render_form_key(&form, new_key()), "1.00", "").await;
    assert!(message.contains("only a succeeded payment can be refunded; this one is failed"), "{message}");

    // Without the session's token nothing runs.
    let forged = client
        .post(app.url(&format!("/admin/payments/{pay}/refunds")))
        .form(&[("key", new_key().as_str()), ("amount", "1.00"), ("reason", "")])
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    assert_eq!(refund_rows(&app).await.len(), 2);
    assert_eq!(app.ledger.refunds().await.len(), 2);
}

/// A form like `form` with another key (another rendering of the page).
fn render_form_key(form: &RenderedForm, key: String) -> RenderedForm {
    RenderedForm { csrf: form.csrf.clone(), key, amount: form.amount.clone() }
}

/// The gateway not answering is a message, not an error page: the refund stays reserved and
/// pending, and the same form sent again (Back, Refund) resumes it into one gateway refund.
#[tokio::test]
async fn a_gateway_outage_is_a_message_and_the_same_form_resumes() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let acme = app.customer("acme").await;
    let pay = paid(&app, &acme, "order-1", 1000).await;
    let client = client();
    sign_in(&app, &client).await;
    app.set_faults(json!({"fail_rate": 1.0, "operations": ["create_refund"]})).await;

    let form = render_form(&app, &client, &pay).await;
    let (body, message) = send_form(&app, &client, &pay, &form, "10.00", "").await;
    assert!(message.contains("The gateway did not answer the refund yet"), "{message}");
    assert!(body.contains(r#"<span class="badge pay-pending">pending</span>"#), "listed as pending: {body}");
    assert!(body.contains(r#"<dd id="amount-pending">10.00 USD"#), "{body}");
    assert_eq!(refund_rows(&app).await.iter().map(|r| r.2.clone()).collect::<Vec<_>>(), ["pending"]);
    assert!(app.ledger.refunds().await.is_empty());

    app.set_faults(json!({})).await;
    let (_, message) = send_form(&app, &client, &pay, &form, "10.00", "").await;
    assert!(message.contains("Refunded 10.00 USD"), "the retry resumed the same refund: {message}");
    assert_eq!(refund_rows(&app).await.iter().map(|r| r.2.clone()).collect::<Vec<_>>(), ["succeeded"]);
    assert_eq!(app.ledger.refunds().await.len(), 1);
}

/// In a real browser (headless Chromium): a double click on the refund button, while the gateway
/// is slow, is one refund, and the page the browser ends on says what was refunded; Back returns
/// to the very form that was sent, with its key, and sending it again is that same refund.
#[tokio::test]
async fn in_a_browser_a_double_click_and_back_are_one_refund() {
    use fantoccini::actions::{InputSource, MOUSE_BUTTON_LEFT, MouseActions, PointerAction};

    use crate::browser::{ADMIN, PASSWORD};
    use crate::chromium::Browser;

    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let acme = app.customer("acme").await;
    let pay = paid(&app, &acme, "order-1", 10_000).await;
    let browser = Browser::start().await;
    let path = format!("/admin/payments/{pay}");
    browser.goto(&app.url(&path)).await;
    browser.wait_for_path("/admin/login").await;
    browser.fill("name", ADMIN).await;
    browser.fill("password", PASSWORD).await;
    browser.click("form.stacked button[type=submit]").await;
    browser.wait_for_path(&path).await;
    browser.wait_for_text("Remaining").await;
    browser.click("#refund-summary").await;
    let key = browser.find("input[name=key]").await.attr("value").await.unwrap().expect("the form's key");
    assert_eq!(browser.find("#refund-key").await.text().await.unwrap(), key, "the form shows its key");
    browser.fill("refund-amount", "40.00").await;
    browser.screenshot("admin-payment-refund-form").await;

    // The gateway takes a second: the second click arrives while the first is in flight.
    app.set_faults(json!({"latency_ms": 1000, "operations": ["create_refund"]})).await;
    let button = browser.find("#refund").await;
    let double_click = MouseActions::new("mouse".into())
        .then(PointerAction::MoveToElement { element: button, duration: None, x: 0.0, y: 0.0 })
        .then(PointerAction::Down { button: MOUSE_BUTTON_LEFT })
        .then(PointerAction::Up { button: MOUSE_BUTTON_LEFT })
        .then(PointerAction::Pause { duration: std::time::Duration::from_millis(120) })
        .then(PointerAction::Down { button: MOUSE_BUTTON_LEFT })
        .then(PointerAction::Up { button: MOUSE_BUTTON_LEFT });
    browser.client.perform_actions(double_click).await.expect("double click");
    browser.wait_for_path(&format!("{path}?form={key}")).await;
    browser.wait_for_text("refund re_").await;
    let said = browser.text().await;
    assert!(
        said.contains("it refunded 40.00 USD (refund re_") || said.contains("Refunded 40.00 USD: refund re_"),
        "the page says what the double click refunded: {said}"
    );
    browser.screenshot("admin-payment-refunded").await;
    let refunds = refund_rows(&app).await;
    assert_eq!(refunds.len(), 1, "one refund for the double click: {refunds:?}");
    assert_eq!(refunds[0].1, 4000);
    assert_eq!(app.ledger.refunds().await.len(), 1, "one gateway refund for the double click");

    // Back to the very form that was sent, and Refund again: a replay, not a second refund.
    app.set_faults(json!({})).await;
    browser.client.back().await.unwrap();
    browser.wait_for_text("Remaining").await;
    assert_eq!(browser.path().await, path);
    let again = browser.find("input[name=key]").await.attr("value").await.unwrap().expect("the form's key");
    assert_eq!(again, key, "the back button shows the page as it was, with its key");
    browser.client.execute("document.querySelector('.actions details').open = true", vec![]).await.unwrap();
    browser.fill("refund-amount", "40.00").await;
    browser.click("#refund").await;
    browser.wait_for_text("This form was already sent: it refunded 40.00 USD").await;
    assert_eq!(refund_rows(&app).await.len(), 1, "sending the form again refunded nothing more");
    assert_eq!(app.ledger.refunds().await.len(), 1);
    browser.close().await;
}
