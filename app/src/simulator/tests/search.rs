//! `GET /v1/payment_intents/search` through async-stripe: metadata and status clauses, AND,
//! misses, pages, and Stripe's 400 for syntax outside the subset.

use std::collections::HashMap;

use stripe::ApiErrorsType;
use stripe_core::payment_intent::SearchPaymentIntent;

use super::{TestSim, payment, send, stripe_error};

/// Pays once per `(payment, payment method)`, tagging each with `payonce_payment`.
async fn pay_tagged(sim: &TestSim, payments: &[(&str, &str)]) {
    for (tag, payment_method) in payments {
        let request =
            payment(payment_method).metadata(HashMap::from([("payonce_payment".to_owned(), (*tag).to_owned())]));
        let _ = send(&sim.stripe(), &request, tag).await;
    }
}

/// payonce's reconciliation query finds its PaymentIntent, and only it; AND narrows by status;
/// a query that matches nothing is an empty result, not an error.
#[tokio::test]
async fn metadata_search_finds_the_payment_and_misses_others() {
    let sim = TestSim::start().await;
    pay_tagged(&sim, &[("pay_a", "pm_card_visa"), ("pay_b", "pm_card_chargeDeclined"), ("pay_c", "pm_card_visa")])
        .await;
    let client = sim.stripe();

    let hit = SearchPaymentIntent::new("metadata['payonce_payment']:'pay_b'").send(&client).await.expect("searched");
    assert_eq!(hit.data.len(), 1);
    assert_eq!(hit.data[0].metadata["payonce_payment"], "pay_b");
    assert!(!hit.has_more && hit.next_page.is_none());
    assert_eq!(hit.url, "/v1/payment_intents/search");

    let declined = "metadata['payonce_payment']:'pay_b' AND status:'succeeded'";
    assert!(SearchPaymentIntent::new(declined).send(&client).await.expect("searched").data.is_empty());
    let succeeded = SearchPaymentIntent::new("status:'succeeded'").send(&client).await.expect("searched");
    let mut tags: Vec<_> = succeeded.data.iter().map(|intent| intent.metadata["payonce_payment"].clone()).collect();
    tags.sort();
    assert_eq!(tags, ["pay_a", "pay_c"]);
    let miss = SearchPaymentIntent::new("metadata['payonce_payment']:'pay_zzz'").send(&client).await;
    assert!(miss.expect("searched").data.is_empty());
    let other_account =
        SearchPaymentIntent::new("status:'succeeded'").send(&sim.stripe_with_key("sk_test_other")).await;
    assert!(other_account.expect("searched").data.is_empty(), "searches are scoped to the API key");
}

/// Results come newest first, `limit` at a time, with `next_page` to continue.
#[tokio::test]
async fn search_pages_through_results() {
    let sim = TestSim::start().await;
    pay_tagged(&sim, &[("p1", "pm_card_visa"), ("p2", "pm_card_visa"), ("p3", "pm_card_visa")]).await;
    let client = sim.stripe();

    let first = SearchPaymentIntent::new("status:'succeeded'").limit(2).send(&client).await.expect("searched");
    assert!(first.has_more);
    let page = first.next_page.clone().expect("a next page");
    let second =
        SearchPaymentIntent::new("status:'succeeded'").limit(2).page(page).send(&client).await.expect("page 2");

    let tags: Vec<_> =
        first.data.iter().chain(&second.data).map(|intent| intent.metadata["payonce_payment"].clone()).collect();
    assert_eq!(tags, ["p3", "p2", "p1"]);
    assert!(!second.has_more);
}

/// Syntax outside the subset is refused with Stripe's 400 on `query`, not answered wrongly.
#[tokio::test]
async fn unsupported_query_syntax_is_a_400() {
    let sim = TestSim::start().await;
    for query in ["status:'succeeded' OR status:'processing'", "amount>100", "customer:'cus_1'", "status:succeeded"] {
        let error = stripe_error(SearchPaymentIntent::new(query).send(&sim.stripe()).await, 400);
        assert_eq!(error.type_, ApiErrorsType::InvalidRequestError, "{query}");
        assert_eq!(error.param.as_deref(), Some("query"), "{query}");
    }
}
