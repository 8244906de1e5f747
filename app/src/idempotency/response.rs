//! The final response of an idempotent request, as stored and replayed.

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

/// Header added to every replayed response (the name Stripe uses).
pub const REPLAYED_HEADER: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The headers that belong to the representation and so are stored and replayed. Anything else
/// (dates, request ids, connection headers) describes one particular exchange and is not.
const STORED_HEADERS: [HeaderName; 2] = [axum::http::header::CONTENT_TYPE, axum::http::header::LOCATION];

/// Status, content headers and body of a final response.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    pub status: StatusCode,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
}

impl StoredResponse {
    /// A response with the given content type and optional `Location`.
    pub fn new(status: StatusCode, content_type: &'static str, location: Option<String>, body: Vec<u8>) -> Self {
        let mut headers = vec![(axum::http::header::CONTENT_TYPE, HeaderValue::from_static(content_type))];
        if let Some(location) = location {
            // Locations are built from ids payonce generated: always valid header values.
            let value = HeaderValue::try_from(location).expect("a generated location is a valid header value");
            headers.push((axum::http::header::LOCATION, value));
        }
        Self { status, headers, body: Bytes::from(body) }
    }

    /// The stored headers as JSON (`[["content-type", "application/json"], …]`) for the
    /// `response_headers` column.
    pub fn headers_json(&self) -> Value {
        self.headers
            .iter()
            .filter_map(|(name, value)| Some(Value::from(vec![name.as_str(), value.to_str().ok()?])))
            .collect()
    }

    /// Rebuilds a stored response from its columns. `None` when they are empty (the key is still
    /// processing) or hold data this code did not write, which a caller that expects a response
    /// reports as corruption rather than replaying something wrong.
    pub fn from_columns(status: Option<i16>, headers: Option<&Value>, body: Option<Vec<u8>>) -> Option<Self> {
        let (status, headers, body) = (status?, headers?, body?);
        let status = StatusCode::from_u16(u16::try_from(status).ok()?).ok()?;
        let headers = headers
            .as_array()?
            .iter()
            .map(|pair| {
                let [name, value] = pair.as_array()?.as_slice() else {
                    return None;
                };
                let name = HeaderName::try_from(name.as_str()?).ok()?;
                let value = HeaderValue::try_from(value.as_str()?).ok()?;
                STORED_HEADERS.contains(&name).then_some((name, value))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self { status, headers, body: Bytes::from(body) })
    }

    /// The HTTP response; a replay carries `Idempotent-Replayed: true`.
    pub fn into_response(self, replayed: bool) -> Response {
        let mut headers = HeaderMap::with_capacity(self.headers.len() + 1);
        for (name, value) in self.headers {
            headers.append(name, value);
        }
        if replayed {
            headers.insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
        }
        (self.status, headers, self.body).into_response()
    }
}

impl super::Engine {
    /// The final response stored for a customer's key on `route`: `None` if there is no such key,
    /// `Some(None)` while it is still processing. For pages that show what became of a request
    /// without sending it again (the shop's "payment in progress" page).
    pub async fn stored_response(
        &self,
        customer_id: uuid::Uuid,
        key: &str,
        route: &str,
    ) -> sqlx::Result<Option<Option<StoredResponse>>> {
        let Some(row) = sqlx::query!(
            r#"
            select response_status, response_headers, response_body
            from idempotency_keys
            where customer_id = $1 and key = $2 and route = $3
            "#,
            customer_id,
            key,
            route,
        )
        .fetch_optional(self.pool())
        .await?
        else {
            return Ok(None);
        };
        let final_row = row.response_status.is_some();
        match StoredResponse::from_columns(row.response_status, row.response_headers.as_ref(), row.response_body) {
            None if final_row => Err(sqlx::Error::Decode(format!("unreadable stored response for key {key}").into())),
            stored => Ok(Some(stored)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is stored comes back unchanged from the database columns.
    #[test]
    fn columns_round_trip() {
        let stored = StoredResponse::new(
            StatusCode::CREATED,
            "application/json",
            Some("/v1/payments/pay_1".into()),
            br#"{"id":"pay_1"}"#.to_vec(),
        );
        let back = StoredResponse::from_columns(Some(201), Some(&stored.headers_json()), Some(stored.body.to_vec()));
        assert_eq!(back.unwrap(), stored);
        let other_header = serde_json::json!([["x-other", "v"]]);
        assert!(StoredResponse::from_columns(Some(201), Some(&other_header), Some(vec![])).is_none());
        assert!(StoredResponse::from_columns(Some(9999), Some(&serde_json::json!([])), Some(vec![])).is_none());
        assert!(StoredResponse::from_columns(None, None, None).is_none(), "no response yet");
    }
}
