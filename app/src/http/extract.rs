//! Extractors whose rejections speak the API's problem format.
//!
//! Handlers list them in this order, and axum runs them in that order, which fixes the order of
//! the checks: authentication (401), then the `Idempotency-Key` (400), then the body (400, 408,
//! 413, 415). None of them touches the key's row, so a request refused here leaves its key unused.

use axum::extract::rejection::{BytesRejection, FailedToBufferBody, JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use crate::body::BodyFault;
use crate::customers::Customer;
use crate::idempotency::IdempotencyKey;
use crate::state::AppState;

/// The largest request body accepted.
pub const BODY_LIMIT: usize = 64 * 1024;
/// The largest body any route may declare (`http::edge::refuse` answers 413 above it before a
/// byte is read). Routes take less ([`BODY_LIMIT`] for the API, 16 KiB for the pages' forms);
/// this is the ceiling for those that take more, such as Stripe's webhook events.
pub const MAX_BODY: usize = 1024 * 1024;

/// Why axum could not buffer a body for an extractor ([`Json`], `Bytes`): over `limit` (413),
/// past the body timeout (408), or anything else (400).
///
/// The length error is matched by its variant, not looked for in the error's chain: axum boxes it
/// once more on its way into the rejection (a `Box<LengthLimitError>` inside the
/// `Box<dyn Error>`), which [`BodyFault::of`]'s `is::<LengthLimitError>()` does not see. A body sent
/// in chunks (no `Content-Length` for [`BodyFault::declared_over`] to refuse first) was therefore a 400.
pub fn bytes_rejection(err: &BytesRejection, limit: usize) -> ApiError {
    match err {
        BytesRejection::FailedToBufferBody(FailedToBufferBody::LengthLimitError(_)) => {
            BodyFault::TooLarge { limit }.into()
        }
        other => BodyFault::of(other, limit).into(),
    }
}

/// The customer whose API key authenticated the request.
pub struct Authenticated(pub Customer);

impl FromRequestParts<AppState> for Authenticated {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let presented = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| {
                let (scheme, token) = value.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .ok_or(ApiError::Unauthorized)?;
        state.auth.authenticate(presented).await?.map(Authenticated).ok_or(ApiError::Unauthorized)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(IdempotencyKey::from_headers(&parts.headers)?)
    }
}

/// `axum::Json`, with rejections as problem documents.
pub struct Json<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        if let Some(too_large) = BodyFault::declared_over(request.headers(), BODY_LIMIT) {
            return Err(too_large.into());
        }
        match axum::Json::<T>::from_request(request, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(JsonRejection::MissingJsonContentType(_)) => Err(ApiError::UnsupportedMediaType),
            Err(JsonRejection::JsonSyntaxError(err)) => {
                Err(ApiError::invalid(format!("the body is not valid JSON ({})", err.body_text())))
            }
            // Wrong types, missing or unknown fields: serde's message names the field and the line.
            Err(JsonRejection::JsonDataError(err)) => Err(ApiError::invalid(err.body_text())),
            Err(JsonRejection::BytesRejection(err)) => Err(bytes_rejection(&err, BODY_LIMIT)),
            Err(other) => Err(ApiError::invalid(other.body_text())),
        }
    }
}

/// `axum::extract::Query`, with rejections as problem documents.
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(value)| Self(value))
            .map_err(|err: QueryRejection| ApiError::invalid(err.body_text()))
    }
}

#[cfg(test)]
mod tests {
    use axum::body::{Body, Bytes};

    use super::*;

    /// A body over the limit that declares no length (sent in chunks) is a 413, like one whose
    /// `Content-Length` says so (here 3 MiB against axum's default limit, 2 MB).
    #[tokio::test]
    async fn a_body_over_the_limit_without_a_length_is_413() {
        let mib = || Ok::<_, std::io::Error>(Bytes::from(vec![b' '; 1024 * 1024]));
        let chunks = futures_util::stream::iter([mib(), mib(), mib()]);
        let request = Request::post("/").body(Body::from_stream(chunks)).unwrap();
        let err = Bytes::from_request(request, &()).await.unwrap_err();
        assert!(matches!(bytes_rejection(&err, 7), ApiError::Body(BodyFault::TooLarge { limit: 7 })), "{err:?}");
    }
}
