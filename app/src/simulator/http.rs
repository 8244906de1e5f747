//! What every Stripe route does first: authenticate, read the `Idempotency-Key`, check the body's
//! encoding, and (for lists) read the pagination parameters. Also the request's id and Stripe's
//! 404 for an unknown URL.

use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::error::ApiError;
use super::form::{Form, Param, parse_limit};
use super::objects::List;

/// Stripe's limit on `Idempotency-Key` length.
const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// The API version since which `automatic_payment_methods` is on by default (and a confirmation
/// may need a `return_url`).
const AUTOMATIC_PAYMENT_METHODS_SINCE: &str = "2023-08-16";

/// The request's id (`req_…`): sent back in the `Request-Id` header, and in the `request.id` of
/// every event the request causes. Set by the server's middleware on every request.
#[derive(Clone, Debug)]
pub(crate) struct RequestId(pub String);

impl RequestId {
    pub fn new() -> Self {
        Self(format!("req_{}", super::objects::random_alphanumeric(14)))
    }
}

/// Who is calling and how: what a write needs to know about its request.
#[derive(Clone, Debug)]
pub(crate) struct Caller {
    /// The API key (never logged).
    pub api_key: String,
    pub idempotency_key: Option<String>,
    pub request_id: String,
}

impl Caller {
    pub fn from_request(headers: &HeaderMap, request_id: &RequestId) -> Result<Self, ApiError> {
        Ok(Self {
            api_key: api_key(headers)?,
            idempotency_key: idempotency_key(headers)?,
            request_id: request_id.0.clone(),
        })
    }
}

/// Any other URL, or a known URL with another method: Stripe's 404.
pub(crate) async fn unrecognized(method: Method, uri: Uri) -> ApiError {
    ApiError::invalid_request(format!(
        "Unrecognized request URL ({method}: {}). Please see https://stripe.com/docs or we can \
         help at https://support.stripe.com/.",
        uri.path()
    ))
    .with_status(StatusCode::NOT_FOUND)
}

/// The API key, from `Authorization: Bearer sk_…` (Stripe's libraries) or HTTP Basic with the
/// key as user name (`curl -u sk_test_…:`). Never logged.
pub(crate) fn api_key(headers: &HeaderMap) -> Result<String, ApiError> {
    let Some(value) = headers.get(AUTHORIZATION) else {
        return Err(ApiError::unauthorized(
            "You did not provide an API key. You need to provide your API key in the \
             Authorization header, using Bearer auth (e.g. 'Authorization: Bearer \
             YOUR_SECRET_KEY'). See https://stripe.com/docs/api#authentication for details.",
        ));
    };
    let value = value.to_str().unwrap_or_default();
    let (scheme, credentials) = value.split_once(' ').unwrap_or((value, ""));
    let credentials = credentials.trim();
    let key = if scheme.eq_ignore_ascii_case("bearer") {
        credentials.to_owned()
    } else if scheme.eq_ignore_ascii_case("basic") {
        let decoded =
            BASE64.decode(credentials).ok().and_then(|bytes| String::from_utf8(bytes).ok()).unwrap_or_default();
        decoded.split_once(':').map_or(decoded.as_str(), |(user, _)| user).to_owned()
    } else {
        String::new()
    };
    let well_formed = key.len() > 3
        && (key.starts_with("sk_") || key.starts_with("rk_"))
        && key.bytes().all(|byte| byte.is_ascii_graphic());
    if !well_formed {
        return Err(ApiError::unauthorized(format!("Invalid API Key provided: {}", masked(&key))));
    }
    Ok(key)
}

/// Stripe echoes only the end of a rejected key.
fn masked(key: &str) -> String {
    let chars: Vec<char> = key.chars().collect();
    match chars.len() {
        n if n >= 12 => format!("********{}", chars[n - 4..].iter().collect::<String>()),
        _ => "********".to_owned(),
    }
}

/// The `Idempotency-Key` header, taken verbatim (Stripe clients send a bare token).
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let invalid = || {
        ApiError::invalid_request(format!(
            "Keys for idempotent requests must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} printable ASCII \
             characters."
        ))
    };
    let key = value.to_str().map_err(|_| invalid())?;
    if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_LEN {
        return Err(invalid());
    }
    Ok(Some(key.to_owned()))
}

/// Whether the request's `Stripe-Version` predates automatic payment methods by default. No
/// header means the account's default version, which for the simulator is a current one.
pub(crate) fn legacy_api_version(headers: &HeaderMap) -> bool {
    headers
        .get("stripe-version")
        .and_then(|value| value.to_str().ok())
        .and_then(|version| version.get(..10))
        .is_some_and(|date| date < AUTOMATIC_PAYMENT_METHODS_SINCE)
}

/// Stripe's API takes form bodies only; a JSON body would otherwise surface as a confusing
/// "unknown parameter" error. No `Content-Type` at all is accepted as a form.
pub(crate) fn require_form_encoding(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(content_type) = headers.get(CONTENT_TYPE) else {
        return Ok(());
    };
    let content_type = content_type.to_str().unwrap_or_default();
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    if essence.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        Ok(())
    } else {
        Err(ApiError::invalid_request(format!(
            "Invalid request: Stripe's API takes application/x-www-form-urlencoded bodies, not \
             '{content_type}'."
        )))
    }
}

/// A list's pagination: `limit` (1..=100, default 10), `starting_after`, `ending_before`.
#[derive(Debug, Default)]
pub(crate) struct Page {
    limit: Option<usize>,
    starting_after: Option<String>,
    ending_before: Option<String>,
}

impl Page {
    /// Takes the parameter if it is a pagination one (or `expand`, accepted and ignored);
    /// `Ok(false)` leaves it to the route.
    pub fn take(&mut self, param: &Param<'_>) -> Result<bool, ApiError> {
        match (param.name, param.inner) {
            ("limit", None) => self.limit = Some(parse_limit(param.key, param.value, 100)?),
            ("starting_after", None) => self.starting_after = super::form::non_empty(param.value),
            ("ending_before", None) => self.ending_before = super::form::non_empty(param.value),
            ("expand", _) => {}
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Reads a list's query string: pagination, plus what `filter` accepts (it returns
    /// `Ok(false)` for a parameter it does not know, which is then a 400).
    pub fn parse(
        query: Option<&str>,
        supported: &str,
        mut filter: impl FnMut(&Param<'_>) -> Result<bool, ApiError>,
    ) -> Result<Self, ApiError> {
        let form = Form::query(query);
        let mut page = Self::default();
        for param in form.params()? {
            if !page.take(&param)? && !filter(&param)? {
                return Err(ApiError::parameter_unknown(param.key, supported));
            }
        }
        Ok(page)
    }

    /// One page of `items` (newest first, each with its id), as Stripe's list object.
    pub fn list<T>(&self, items: Vec<(String, T)>, url: &'static str) -> List<T> {
        let limit = self.limit.unwrap_or(10);
        let (data, has_more) = if let Some(before) = &self.ending_before {
            // The `limit` items just newer than `before`, still newest first.
            let end = items.iter().position(|(id, _)| id == before).unwrap_or(0);
            let start = end.saturating_sub(limit);
            let has_more = start > 0;
            (items.into_iter().skip(start).take(end - start).map(|(_, item)| item).collect(), has_more)
        } else {
            let start = match &self.starting_after {
                Some(after) => items.iter().position(|(id, _)| id == after).map_or(items.len(), |at| at + 1),
                None => 0,
            };
            let has_more = items.len() > start + limit;
            (items.into_iter().skip(start).take(limit).map(|(_, item)| item).collect(), has_more)
        };
        List::new(data, has_more, url)
    }
}

/// A list's `created` filter: `created=T`, or bounds `created[gt]`, `[gte]`, `[lt]`, `[lte]`
/// (Unix seconds), for the lists Stripe filters by creation time.
#[derive(Debug, Default)]
pub(crate) struct Created {
    gt: Option<i64>,
    gte: Option<i64>,
    lt: Option<i64>,
    lte: Option<i64>,
}

impl Created {
    /// Takes the parameter if it is a `created` one; `Ok(false)` leaves it to the route.
    pub fn take(&mut self, param: &Param<'_>) -> Result<bool, ApiError> {
        if param.name != "created" {
            return Ok(false);
        }
        let value = param.value.parse::<i64>().map_err(|_| {
            ApiError::invalid_request(format!("Invalid integer: {}", param.value))
                .code("parameter_invalid_integer")
                .param(param.key)
        })?;
        match param.inner {
            None => (self.gte, self.lte) = (Some(value), Some(value)),
            Some("gt") => self.gt = Some(value),
            Some("gte") => self.gte = Some(value),
            Some("lt") => self.lt = Some(value),
            Some("lte") => self.lte = Some(value),
            Some(_) => return Ok(false),
        }
        Ok(true)
    }

    pub fn contains(&self, created: i64) -> bool {
        self.gt.is_none_or(|gt| created > gt)
            && self.gte.is_none_or(|gte| created >= gte)
            && self.lt.is_none_or(|lt| created < lt)
            && self.lte.is_none_or(|lte| created <= lte)
    }
}
