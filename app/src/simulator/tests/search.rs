//! `GET /v1/payment_intents/search` through async-stripe: Stripe's query language over the
//! PaymentIntent's fields (metadata, status, amount, created, currency, customer; `AND`, `OR`,
//! `-`, `null`, `~`, `>`/`<`), misses, pages, and Stripe's 400 for what the language does not
//! allow.

use std::collections::HashMap;

use stripe::ApiErrorsType;
use stripe_core::payment_intent::SearchPaymentIntent;

use stripe_core::payment_intent::CreatePaymentIntent;
use stripe_types::Currency;

use super::{TestSim, no_redirects, payment, send, stripe_error};

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

/// Each part of the documented language, end to end: the PaymentIntents each query finds.
#[tokio::test]
async fn the_query_language_finds_what_stripe_would() {
    let sim = TestSim::start().await;
    for (tag, payment_method, amount, currency) in [
        ("small", "pm_card_visa", 500, Currency::USD),
        ("large", "pm_card_visa", 5000, Currency::USD),
        ("euro", "pm_card_visa", 2000, Currency::EUR),
        ("declined", "pm_card_chargeDeclined", 3000, Currency::USD),
    ] {
        let request = CreatePaymentIntent::new(amount, currency)
            .confirm(true)
            .payment_method(payment_method)
            .automatic_payment_methods(no_redirects())
            .metadata(HashMap::from([("tag".to_owned(), tag.to_owned())]));
        let _ = send(&sim.stripe(), &request, tag).await;
    }
    let found = async |query: &str| {
        let result =
            SearchPaymentIntent::new(query).send(&sim.stripe()).await.unwrap_or_else(|e| panic!("{query}: {e}"));
        let mut tags: Vec<String> = result.data.iter().map(|intent| intent.metadata["tag"].clone()).collect();
        tags.sort();
        tags
    };
    assert_eq!(found("amount>2000").await, ["declined", "large"]);
    assert_eq!(found("amount<=\"2000\" AND currency:'USD'").await, ["small"], "currency matches in any case");
    assert_eq!(found("status:'succeeded' OR currency:'eur'").await, ["euro", "large", "small"]);
    assert_eq!(found("-status:'succeeded'").await, ["declined"]);
    assert_eq!(found("currency:'usd' -amount:500").await, ["declined", "large"], "spaces join with AND");
    assert_eq!(found("created>0 customer:null").await, ["declined", "euro", "large", "small"]);
    assert!(found("customer:'cus_1'").await.is_empty(), "the simulator has no customers");
    assert!(found("metadata['tag']:null").await.is_empty());
    assert_eq!(found("metadata['tag']:'euro' or metadata['tag']:'small'").await, ["euro", "small"]);
    assert!(found("metadata['tag']:'EURO'").await.is_empty(), "metadata values match exactly");
    assert_eq!(found("currency~'EUR'").await, ["euro"], "a substring, in any case");
}

/// What the language does not allow is refused with Stripe's 400 on `query`, not answered
/// wrongly.
#[tokio::test]
async fn queries_the_language_does_not_allow_are_a_400() {
    let sim = TestSim::start().await;
    for query in [
        "status:'succeeded' AND currency:'usd' OR status:'processing'",
        "nope:'x'",
        "status:succeeded",
        "status~'succ'",
        "(status:'succeeded')",
        "currency~'eu'",
    ] {
        let error = stripe_error(SearchPaymentIntent::new(query).send(&sim.stripe()).await, 400);
        assert_eq!(error.type_, ApiErrorsType::InvalidRequestError, "{query}");
        assert_eq!(error.param.as_deref(), Some("query"), "{query}");
    }
}
