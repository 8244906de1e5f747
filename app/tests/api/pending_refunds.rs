//! Pending refunds are reconciled: a refund the gateway answered `pending` (a bank debit's) is
//! answered 201 `pending` and, with no webhook ever arriving (none is registered here), the
//! sweeper looks it up at the gateway on its schedule and settles it with what the gateway says:
//! succeeded, or failed with its reservation given back once. No answer that tells changes
//! nothing and is asked again later. When the webhook does arrive, it settles the refund and the
//! look-ups stop.

use std::time::{Duration, Instant};

use payonce::idempotency::EngineSettings;
use payonce::sweeper::{SweepReport, Sweeper};
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::admin::{page, sign_in};
use crate::browser::create_admin;
use crate::helpers::{Options, TestApp, browser_client, new_key, no_backoff, parts};

/// The refund, as payonce and the gateway know it.
struct Pending {
    /// The refund's client key.
    key: String,
    /// payonce's refund id (`re_` + 32 hex).
    refund: String,
    /// The gateway's refund id.
    gateway_refund: String,
    /// payonce's payment id (`pay_…`).
    payment: String,
}

/// A sweeper of the test's own, with no backoff: every scheduled look-up is due at each pass.
fn sweeper(app: &TestApp) -> Sweeper {
    let settings = EngineSettings { budget: no_backoff(), ..EngineSettings::default() };
    app.database.sweeper(&app.sim_url, "sweeper:test", settings)
}

/// One pass, which must not hit an error.
async fn sweep(sweeper: &Sweeper) -> SweepReport {
    let report = sweeper.sweep().await;
    assert_eq!(report.errors, 0, "{report:?}");
    report
}

/// A bank debit of 2500 settled (looked up by the sweeper: no webhooks here), then a refund of
/// 1500 of it that the gateway keeps `pending` (its processing knob at 10 minutes).
async fn refund_left_pending(app: &TestApp, sweeper: &Sweeper, api_key: &str) -> Pending {
    app.ledger.set_settings(json!({"processing_ms": 100})).await;
    let body = json!({"amount": 2500, "currency": "usd", "payment_method": "pm_usBankAccount_success"});
    let (status, _, paid) = parts(app.post_payment(api_key, Some(&new_key()), &body).send().await.unwrap()).await;
    assert_eq!((status, paid["status"].as_str()), (StatusCode::ACCEPTED, Some("processing")), "{paid}");
    let started = Instant::now();
    while sqlx::query_scalar::<_, String>("select status from payments").fetch_one(&app.db).await.unwrap()
        != "succeeded"
    {
        assert!(started.elapsed() < Duration::from_secs(10), "the bank debit never settled");
        tokio::time::sleep(Duration::from_millis(50)).await;
        sweep(sweeper).await;
    }

    app.ledger.set_settings(json!({"processing_ms": 600_000})).await;
    let key = new_key();
    let payment = paid["id"].as_str().unwrap().to_owned();
    let request = app.post_refund(api_key, Some(&key), &json!({"payment": payment, "amount": 1500}));
    let (status, _, refund) = parts(request.send().await.unwrap()).await;
    assert_eq!((status, refund["status"].as_str()), (StatusCode::CREATED, Some("pending")), "{refund}");
    let gateway_refund = refund["gateway_refund"].as_str().expect("the gateway's refund id").to_owned();
    assert!(app.ledger.refunds().await.is_empty(), "no money moved back yet");
    assert_eq!(row(app).await, ("pending".into(), true, 0, 1500), "reserved, and scheduled for a look-up");
    Pending { key, refund: refund["id"].as_str().unwrap().to_owned(), gateway_refund, payment }
}

/// The refund's status, whether a look-up is scheduled, how many were made, and the payment's
/// `amount_refunded`.
async fn row(app: &TestApp) -> (String, bool, i32, i64) {
    sqlx::query_as(
        "select r.status, r.reconcile_at is not null, r.reconcile_attempts, p.amount_refunded
         from refunds r join payments p on p.id = r.payment_id order by r.id limit 1",
    )
    .fetch_one(&app.db)
    .await
    .unwrap()
}

/// The `reconciled` events on the refund key's timeline: their details, in order.
async fn reconciliations(app: &TestApp, key: &str) -> Vec<Value> {
    sqlx::query_scalar(
        "select e.detail from idempotency_events e join idempotency_keys k on k.id = e.key_id
         where k.key = $1 and e.kind = 'reconciled' order by e.id",
    )
    .bind(key)
    .fetch_all(&app.db)
    .await
    .unwrap()
}

/// The gateway settles a pending refund (as its bank would, days later).
async fn settle(app: &TestApp, gateway_refund: &str, outcome: &str) {
    let settled = app.ledger.control(&format!("refunds/{gateway_refund}/settle"), json!({"outcome": outcome})).await;
    assert_ne!(settled["status"], "pending");
}

/// The line the payment's dashboard page shows under a refund's status: when the gateway is
/// asked next (`None`: no such line, as for a final refund).
async fn lookup_line(app: &TestApp, client: &reqwest::Client, payment: &str) -> Option<String> {
    let body = page(app, client, &format!("/admin/payments/{payment}")).await;
    let (_, rest) = body.split_once(r#"<small class="lookup">"#)?;
    Some(rest.split_once("</small>").expect("the line closes").0.to_owned())
}

/// With no webhook, a pending refund is looked up by the sweeper: still pending at the gateway,
/// it stays pending and is asked again; once the gateway has refunded it, the next look-up makes
/// it `succeeded` (a `reconciled` event from pending to succeeded), it is no longer looked up,
/// and payonce's books agree with the gateway's ledger. All along, the payment's dashboard page
/// says when the gateway is asked next, and how often it was.
#[tokio::test]
async fn a_pending_refund_settles_through_reconciliation_without_webhooks() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let api_key = app.customer("acme").await;
    let sweeper = sweeper(&app);
    let pending = refund_left_pending(&app, &sweeper, &api_key).await;
    let operator = browser_client();
    sign_in(&app, &operator).await;
    let before = lookup_line(&app, &operator, &pending.payment).await.expect("a look-up line while pending");
    assert!(before.contains("(not asked yet)"), "{before}");

    let report = sweep(&sweeper).await;
    assert_eq!(report.looked_up_on(payonce::refunds::ROUTE), (1, 0), "{report:?}");
    assert_eq!(row(&app).await, ("pending".into(), true, 1, 1500), "still pending, asked again later");
    let after = lookup_line(&app, &operator, &pending.payment).await.expect("still a look-up line");
    assert!(after.contains("(asked once so far)"), "{after}");
    let seen = reconciliations(&app, &pending.key).await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!((seen[0]["method"].as_str(), seen[0]["answer"].as_str()), (Some("retrieve"), Some("pending")));

    settle(&app, &pending.gateway_refund, "succeed").await;
    let report = sweep(&sweeper).await;
    assert_eq!(report.looked_up_on(payonce::refunds::ROUTE), (1, 1), "{report:?}");
    assert_eq!(row(&app).await, ("succeeded".into(), false, 2, 1500), "settled and no longer looked up");
    assert_eq!(lookup_line(&app, &operator, &pending.payment).await, None, "nothing to look up once settled");
    let seen = reconciliations(&app, &pending.key).await;
    let last = seen.last().unwrap();
    assert_eq!(
        (last["answer"].as_str(), last["from"].as_str(), last["to"].as_str(), last["refund"].as_str()),
        (Some("succeeded"), Some("pending"), Some("succeeded"), Some(pending.refund.as_str()))
    );

    let (status, _, shown) =
        parts(app.get(&api_key, &format!("/v1/refunds/{}", pending.refund)).send().await.unwrap()).await;
    assert_eq!((status, shown["status"].as_str()), (StatusCode::OK, Some("succeeded")));
    // The ledger agrees: one refund, this one, of what payonce reserved; the charge says the same.
    let refunds = app.ledger.refunds().await;
    assert_eq!(refunds.len(), 1, "{refunds:?}");
    assert_eq!(refunds[0]["refund"], pending.gateway_refund.as_str());
    assert_eq!(refunds[0]["metadata"]["payonce_refund"], pending.refund.as_str());
    assert_eq!(refunds[0]["amount"], 1500);
    let charge: Value = app.ledger.charges().await.into_iter().next().expect("the charge");
    assert_eq!(charge["amount_refunded"], 1500);

    let report = sweep(&sweeper).await;
    assert_eq!(
        report.looked_up_on(payonce::refunds::ROUTE).0,
        0,
        "a settled refund is not looked up again: {report:?}"
    );
    assert_eq!(reconciliations(&app, &pending.key).await.len(), 2);
}

/// The gateway fails a pending refund: the look-up makes it `failed` with the gateway's reason,
/// and its 1500 is given back to the payment once: a forced second look-up changes nothing, and
/// the whole 2500 can then be refunded again.
#[tokio::test]
async fn a_pending_refund_the_gateway_fails_gives_its_amount_back_once() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let sweeper = sweeper(&app);
    let pending = refund_left_pending(&app, &sweeper, &api_key).await;

    settle(&app, &pending.gateway_refund, "fail").await;
    let report = sweep(&sweeper).await;
    assert_eq!(report.looked_up_on(payonce::refunds::ROUTE), (1, 1), "{report:?}");
    assert_eq!(row(&app).await, ("failed".into(), false, 1, 0), "failed, its reservation given back");
    let (status, _, shown) =
        parts(app.get(&api_key, &format!("/v1/refunds/{}", pending.refund)).send().await.unwrap()).await;
    assert_eq!((status, shown["status"].as_str()), (StatusCode::OK, Some("failed")));
    assert_eq!(shown["failure"]["code"], "declined");
    let last = reconciliations(&app, &pending.key).await.pop().unwrap();
    assert_eq!((last["answer"].as_str(), last["to"].as_str()), (Some("declined"), Some("failed")));
    assert!(app.ledger.refunds().await.is_empty(), "no money moved back");

    // Looked up again (as if scheduled by mistake): no longer pending, so nothing given back twice.
    sqlx::query("update refunds set reconcile_at = now()").execute(&app.db).await.unwrap();
    let report = sweep(&sweeper).await;
    assert_eq!(report.looked_up_on(payonce::refunds::ROUTE), (1, 0), "{report:?}");
    assert_eq!(row(&app).await, ("failed".into(), false, 2, 0));

    // All of it is refundable again, at payonce and at the gateway.
    let request = app.post_refund(&api_key, Some(&new_key()), &json!({"payment": pending.payment}));
    let (status, _, again) = parts(request.send().await.unwrap()).await;
    assert_eq!((status, again["amount"].as_i64()), (StatusCode::CREATED, Some(2500)), "{again}");
    let id = Uuid::try_parse(pending.payment.strip_prefix("pay_").unwrap()).unwrap();
    let refunded: i64 = sqlx::query_scalar("select amount_refunded from payments where id = $1")
        .bind(id)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(refunded, 2500);
}

/// The gateway is unavailable when the look-ups come (500s on every read): the refund stays
/// pending, its reservation held, and is rescheduled after each (`reconciled`, answer
/// `unavailable`), never guessed; once the gateway answers again, the refund it made settles.
#[tokio::test]
async fn a_pending_refund_stays_pending_while_the_gateway_is_unavailable() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let sweeper = sweeper(&app);
    let pending = refund_left_pending(&app, &sweeper, &api_key).await;
    settle(&app, &pending.gateway_refund, "succeed").await;

    app.set_faults(json!({"fail_rate": 1.0, "operations": ["read"]})).await;
    for attempts in 1..=2 {
        let report = sweep(&sweeper).await;
        assert_eq!(report.looked_up_on(payonce::refunds::ROUTE), (1, 0), "{report:?}");
        assert_eq!(row(&app).await, ("pending".into(), true, attempts, 1500), "rescheduled, nothing guessed");
    }
    let seen = reconciliations(&app, &pending.key).await;
    let answers: Vec<_> = seen.iter().map(|detail| detail["answer"].as_str().unwrap_or_default()).collect();
    assert_eq!(answers, ["unavailable", "unavailable"], "{seen:?}");

    app.set_faults(json!({})).await;
    let report = sweep(&sweeper).await;
    assert_eq!(report.looked_up_on(payonce::refunds::ROUTE).1, 1, "{report:?}");
    assert_eq!(row(&app).await, ("succeeded".into(), false, 3, 1500));
}

/// With webhooks (the built-in simulator registers payonce's endpoint), the refund's
/// `refund.updated` settles it first: it is unscheduled in the same statement, and the sweeper
/// never asks the gateway about it.
#[tokio::test]
async fn a_refund_its_webhook_settled_is_no_longer_looked_up() {
    let app = TestApp::spawn_with(Options { builtin_simulator: true, ..Default::default() }).await;
    let api_key = app.customer("acme").await;
    let sweeper = sweeper(&app);
    let pending = refund_left_pending(&app, &sweeper, &api_key).await;

    settle(&app, &pending.gateway_refund, "succeed").await;
    let started = Instant::now();
    while row(&app).await.0 != "succeeded" {
        assert!(started.elapsed() < Duration::from_secs(10), "the refund's webhook never settled it");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(row(&app).await, ("succeeded".into(), false, 0, 1500), "settled and unscheduled by the webhook");
    let report = sweep(&sweeper).await;
    assert_eq!(report.looked_up_on(payonce::refunds::ROUTE).0, 0, "{report:?}");
    assert!(reconciliations(&app, &pending.key).await.is_empty());
}
