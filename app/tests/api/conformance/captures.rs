//! The conformance flows of authorizations: authorize now, capture later (or cancel, or let
//! expire): payonce's own calls (`"capture": "manual"`, then its capture and cancel), and
//! Stripe's refusals through async-stripe's own client, with the request types payonce's gateway
//! uses.

use reqwest::StatusCode;
use serde_json::json;
use stripe::{IdempotencyKey, RequestStrategy, StripeError, StripeRequest};
use stripe_core::payment_intent::{
    CancelPaymentIntent, CancelPaymentIntentCancellationReason, CapturePaymentIntent, CreatePaymentIntent,
    CreatePaymentIntentAutomaticPaymentMethods, CreatePaymentIntentAutomaticPaymentMethodsAllowRedirects,
};
use stripe_core::{PaymentIntent, PaymentIntentCaptureMethod, PaymentIntentId, PaymentIntentStatus};
use stripe_types::Currency;

use super::Run;
use crate::helpers::{SIM_SECRET_KEY, new_key, parts};

impl Run<'_> {
    /// Authorize now, capture later, through async-stripe's own client (the request types
    /// payonce's gateway uses: `capture_method=manual`, `CapturePaymentIntent`,
    /// `CancelPaymentIntent`, each with an Idempotency-Key): a partial capture and its replay;
    /// Stripe's refusals of a capture (more than capturable, not `requires_capture`, unknown);
    /// cancels of an authorization and of an unconfirmed PaymentIntent, and their refusals; an
    /// authorization that expires; a refund of an authorization.
    pub(super) async fn captures(&self, gateway_url: &str) {
        // payonce's own: an authorization captured in part, another cancelled.
        for (action, body) in [("capture", json!({"amount_to_capture": 1500})), ("cancel", json!({}))] {
            let manual =
                json!({"amount": 2000, "currency": "usd", "payment_method": "pm_card_visa", "capture": "manual"});
            let request = self.app.post_payment(&self.api_key, Some(&new_key()), &manual);
            let (status, _, held) = parts(request.send().await.unwrap()).await;
            assert_eq!((status, held["status"].as_str()), (StatusCode::CREATED, Some("requires_capture")), "{held}");
            let path = format!("/v1/payments/{}/{action}", held["id"].as_str().unwrap());
            let request = self.app.client.post(self.app.url(&path)).bearer_auth(&self.api_key);
            let (status, _, settled) =
                parts(request.header("Idempotency-Key", new_key()).json(&body).send().await.unwrap()).await;
            assert_eq!(status, StatusCode::OK, "{action}: {settled}");
        }

        let client = stripe::ClientBuilder::new(SIM_SECRET_KEY).url(gateway_url).build().expect("a client");
        let client = &client;
        let keyed = || RequestStrategy::Idempotent(IdempotencyKey::new(new_key()).expect("a key"));
        let authorize = || async {
            let mut automatic = CreatePaymentIntentAutomaticPaymentMethods::new(true);
            automatic.allow_redirects = Some(CreatePaymentIntentAutomaticPaymentMethodsAllowRedirects::Never);
            let create = CreatePaymentIntent::new(3000, Currency::USD)
                .capture_method(PaymentIntentCaptureMethod::Manual)
                .confirm(true)
                .payment_method("pm_card_visa")
                .automatic_payment_methods(automatic);
            let intent = create.customize().request_strategy(keyed()).send(client).await.expect("authorized");
            assert_eq!(intent.status, PaymentIntentStatus::RequiresCapture);
            intent.id
        };
        let capture = |id: &PaymentIntentId, amount: Option<i64>, strategy: RequestStrategy| {
            let mut request = CapturePaymentIntent::new(id.clone());
            if let Some(amount) = amount {
                request = request.amount_to_capture(amount);
            }
            async move { request.customize().request_strategy(strategy).send(client).await }
        };
        let cancel = |id: &PaymentIntentId| {
            let request = CancelPaymentIntent::new(id.clone())
                .cancellation_reason(CancelPaymentIntentCancellationReason::RequestedByCustomer);
            let strategy = keyed();
            async move { request.customize().request_strategy(strategy).send(client).await }
        };
        let refused = |result: Result<PaymentIntent, StripeError>| match result {
            Err(StripeError::Stripe(error, status)) => (status, error.code.map(|code| code.as_str().to_owned())),
            other => panic!("a Stripe error, got {other:?}"),
        };

        let captured = authorize().await;
        let key = RequestStrategy::Idempotent(IdempotencyKey::new(new_key()).expect("a key"));
        let first = capture(&captured, Some(2000), key.clone()).await.expect("captured");
        assert_eq!((first.status, first.amount_received), (PaymentIntentStatus::Succeeded, 2000));
        assert_eq!(capture(&captured, Some(2000), key).await.expect("replayed").id, captured);
        let again = refused(capture(&captured, None, keyed()).await);
        assert_eq!(again, (400, Some("payment_intent_unexpected_state".to_owned())));

        let held = authorize().await;
        let too_much = refused(capture(&held, Some(3001), keyed()).await);
        assert_eq!(too_much, (400, Some("amount_too_large".to_owned())));
        let (status, body) = self.raw.post("v1/refunds", Some(&new_key()), &[("payment_intent", held.as_str())]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "an authorization is canceled, not refunded: {body}");
        let canceled = cancel(&held).await.expect("canceled");
        assert_eq!(canceled.status, PaymentIntentStatus::Canceled);
        assert_eq!(refused(cancel(&held).await).0, 400);
        let nope = PaymentIntentId::from("pi_nope");
        assert_eq!(refused(capture(&nope, None, keyed()).await).0, 404);
        assert_eq!(refused(cancel(&nope).await).0, 404);

        let expiring = authorize().await;
        self.app.ledger.control(&format!("payment_intents/{expiring}/expire_authorization"), json!({})).await;
        let expired = refused(capture(&expiring, None, keyed()).await);
        assert_eq!(expired, (400, Some("payment_intent_unexpected_state".to_owned())));
        let unconfirmed = CreatePaymentIntent::new(500, Currency::USD).send(client).await.expect("created");
        let canceled = CancelPaymentIntent::new(unconfirmed.id).send(client).await.expect("canceled");
        assert_eq!((canceled.status, canceled.cancellation_reason), (PaymentIntentStatus::Canceled, None));
    }
}
