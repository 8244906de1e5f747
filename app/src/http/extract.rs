//! Extractors whose rejections speak the API's problem format.
//!
//! Handlers list them in this order, and axum runs them in that order, which fixes the order of
//! the checks: authentication (401), then the `Idempotency-Key` (400), then the body (400, 413,
//! 415). None of them touches the key's row, so a request refused here leaves its key unused.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::AppState;
use super::error::ApiError;
use crate::customers::Customer;
use crate::idempotency::IdempotencyKey;

/// The largest request body accepted.
pub const BODY_LIMIT: usize = 64 * 1024;

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
        match axum::Json::<T>::from_request(request, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(JsonRejection::MissingJsonContentType(_)) => Err(ApiError::UnsupportedMediaType),
            Err(JsonRejection::JsonSyntaxError(err)) => {
                Err(ApiError::invalid(format!("the body is not valid JSON ({})", err.body_text())))
            }
            // Wrong types, missing or unknown fields: serde's message names the field and the line.
            Err(JsonRejection::JsonDataError(err)) => Err(ApiError::invalid(err.body_text())),
            Err(JsonRejection::BytesRejection(err)) if err.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::PayloadTooLarge { limit: BODY_LIMIT })
            }
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
