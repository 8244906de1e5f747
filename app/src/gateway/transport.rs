//! The HTTP transport under async-stripe: the same requests, over kept-alive connections.
//!
//! async-stripe builds its hyper client with `pool_max_idle_per_host(0)`: every call opens a new
//! TCP connection (and, to Stripe, a new TLS session). Under load that costs a handshake per
//! payment and, at a few hundred calls per second, exhausts the machine's ephemeral ports with
//! connections in `TIME_WAIT`. So payonce keeps everything else of async-stripe (the request
//! types, their form encoding, the response and error types) and sends the requests it builds
//! ([`RequestBuilder`], from `StripeRequest::build`) through a pooled hyper client of its own.
//! It gets the response body back as bytes: the gateway reads it with async-stripe's types and,
//! for the few members it passes on as they are (`next_action`), as plain JSON. An error answer
//! keeps Stripe's retry hint (`Stripe-Should-Retry`), which async-stripe's error type has no room
//! for ([`CallError`]). The transport is also an async-stripe client (`StripeClient`), which the
//! simulator's tests use.
//! `docs/performance.md` has the before and after.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderName, HeaderValue, USER_AGENT};
use hyper::{Method, Request};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use stripe::StripeError;
use stripe_client_core::{CustomizedStripeRequest, RequestBuilder, StripeClient, StripeMethod};

const STRIPE_VERSION: HeaderName = HeaderName::from_static("stripe-version");
const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
const SHOULD_RETRY: HeaderName = HeaderName::from_static("stripe-should-retry");
const FORM: HeaderValue = HeaderValue::from_static("application/x-www-form-urlencoded");

/// How long an idle connection to the gateway is kept for reuse.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// A call without a 2xx answer: async-stripe's error, and Stripe's `Stripe-Should-Retry` hint if
/// the answer carried one (`true`: retrying may succeed; `false`: it will not), which Stripe's own
/// libraries follow before any rule of their own.
#[derive(Debug)]
pub struct CallError {
    pub error: StripeError,
    pub should_retry: Option<bool>,
}

impl From<StripeError> for CallError {
    fn from(error: StripeError) -> Self {
        Self { error, should_retry: None }
    }
}

/// A Stripe API client over a connection pool. Cheap to clone (the pool is shared).
#[derive(Clone)]
pub struct Transport {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// `https://api.stripe.com/` or another base URL, ending in `/`.
    base_url: String,
    /// `Bearer sk_…`, marked sensitive so it never shows in a debug print.
    authorization: HeaderValue,
    user_agent: HeaderValue,
    version: HeaderValue,
    /// Deadline of a call through [`StripeClient`] that sets none.
    timeout: Duration,
}

impl Transport {
    /// A transport to `base_url` (ending in `/`) with `secret_key`.
    pub fn new(secret_key: &str, base_url: String, timeout: Duration) -> Result<Self, StripeError> {
        let mut authorization = HeaderValue::try_from(format!("Bearer {secret_key}"))
            .map_err(|_| StripeError::ConfigError("the secret key must be visible ASCII".into()))?;
        authorization.set_sensitive(true);
        let user_agent = HeaderValue::from_static(concat!("payonce/", env!("CARGO_PKG_VERSION"), " (async-stripe)"));
        let version = HeaderValue::from_str(stripe_shared::version::VERSION.as_str())
            .map_err(|_| StripeError::ConfigError("unprintable Stripe API version".into()))?;
        let connector = HttpsConnectorBuilder::new().with_webpki_roots().https_or_http().enable_http1().build();
        let client = Client::builder(TokioExecutor::new()).pool_idle_timeout(IDLE_TIMEOUT).build(connector);
        Ok(Self { client, base_url, authorization, user_agent, version, timeout })
    }

    async fn send(&self, request: Request<Full<Bytes>>) -> Result<Bytes, CallError> {
        let response = self.client.request(request).await.map_err(|err| StripeError::ClientError(err.to_string()))?;
        let status = response.status();
        let should_retry = match response.headers().get(SHOULD_RETRY).map(HeaderValue::as_bytes) {
            Some(b"true") => Some(true),
            Some(b"false") => Some(false),
            _ => None,
        };
        let body = response.into_body().collect().await.map_err(|err| StripeError::ClientError(err.to_string()))?;
        let body = body.to_bytes();
        if status.is_success() {
            return Ok(body);
        }
        // Stripe's error envelope, parsed with async-stripe's own types.
        let error = match std::str::from_utf8(&body)
            .ok()
            .and_then(|text| miniserde::json::from_str::<stripe_shared::Error>(text).ok())
        {
            Some(envelope) => StripeError::Stripe(envelope.error, status.as_u16()),
            None => StripeError::JSONDeserialize(format!("unreadable error body with status {status}")),
        };
        Err(CallError { error, should_retry })
    }
}

impl Transport {
    /// Sends one request, once: payonce decides itself when to retry, with its own
    /// deterministic key. Returns the body of a 2xx answer; any other answer is Stripe's error
    /// envelope, parsed with async-stripe's own types, with its retry hint.
    pub async fn call(
        &self,
        request: RequestBuilder,
        idempotency_key: Option<&str>,
        timeout: Duration,
    ) -> Result<Bytes, CallError> {
        let mut uri = format!("{}v1{}", self.base_url, request.path);
        if let Some(query) = request.query.as_deref().filter(|query| !query.is_empty()) {
            uri.push('?');
            uri.push_str(query);
        }
        let method = match request.method {
            StripeMethod::Get => Method::GET,
            StripeMethod::Post => Method::POST,
            StripeMethod::Delete => Method::DELETE,
        };
        let mut builder = Request::builder()
            .method(method)
            .uri(uri)
            .header(AUTHORIZATION, self.authorization.clone())
            .header(USER_AGENT, self.user_agent.clone())
            .header(STRIPE_VERSION, self.version.clone());
        if let Some(key) = idempotency_key {
            builder = builder.header(IDEMPOTENCY_KEY, key);
        }
        if request.body.is_some() {
            builder = builder.header(CONTENT_TYPE, FORM);
        }
        let body = Full::new(request.body.map(Bytes::from).unwrap_or_default());
        let request = builder.body(body).map_err(|err| StripeError::ClientError(err.to_string()))?;
        tokio::time::timeout(timeout, self.send(request)).await.unwrap_or(Err(StripeError::Timeout.into()))
    }
}

impl StripeClient for Transport {
    type Err = StripeError;

    /// One attempt, with the request's own key and timeout.
    async fn execute(&self, request: CustomizedStripeRequest) -> Result<Bytes, StripeError> {
        let (request, config) = request.into_pieces();
        let key = config.request_strategy.as_ref().and_then(|strategy| strategy.get_key());
        let timeout = config.timeout.unwrap_or(self.timeout);
        self.call(request, key.as_ref().map(|key| key.as_str()), timeout).await.map_err(|failure| failure.error)
    }
}

#[cfg(test)]
mod tests {
    use axum::extract::Path;
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    use stripe_client_core::StripeRequest;
    use stripe_core::payment_intent::RetrievePaymentIntent;

    use super::*;
    use crate::gateway::outcome::RefusalReason;
    use crate::gateway::{Gateway, Outcome};

    /// A Stripe stand-in that answers every retrieve with a 500 `api_error`, its
    /// `Stripe-Should-Retry` taken from the id asked for (`true`, `false`, anything else: none).
    async fn stub() -> String {
        let answer = |Path(hint): Path<String>| async move {
            let body = r#"{"error": {"type": "api_error", "message": "An error occurred."}}"#;
            let mut response = (StatusCode::INTERNAL_SERVER_ERROR, body).into_response();
            if hint == "true" || hint == "false" {
                response.headers_mut().insert("stripe-should-retry", HeaderValue::from_str(&hint).unwrap());
            }
            response
        };
        let router = axum::Router::new().route("/v1/payment_intents/{hint}", axum::routing::get(answer));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}/", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, router).await.expect("serves") });
        base
    }

    /// The answer's retry hint reaches the outcome: `true` is unknown, `false` turns what would
    /// be unknown into a refusal, none leaves it to the status (a 500: unknown).
    #[tokio::test]
    async fn the_retry_hint_is_read_and_decides() {
        let base = stub().await;
        let timeout = Duration::from_secs(5);
        let transport = Transport::new("sk_test_hint", base.clone(), timeout).expect("a transport");
        for (hint, expected) in [("true", Some(true)), ("false", Some(false)), ("none", None)] {
            let failure = transport.call(RetrievePaymentIntent::new(hint).build(), None, timeout).await.unwrap_err();
            assert!(matches!(failure.error, StripeError::Stripe(_, 500)), "{failure:?}");
            assert_eq!(failure.should_retry, expected, "{hint}");
        }
        let gateway = Gateway::new("sk_test_hint", Some(&base), timeout).expect("a gateway");
        assert_eq!(gateway.retrieve("true").await.label(), "unavailable");
        assert_eq!(gateway.retrieve("none").await.label(), "unavailable");
        let Outcome::Refused(refusal) = gateway.retrieve("false").await else { panic!("not retryable: a refusal") };
        assert_eq!(refusal.reason, RefusalReason::NotRetryable);
    }
}
