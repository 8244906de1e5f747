//! Stripe's request encoding, and the parameters of `POST /v1/payment_intents`.
//!
//! Stripe takes `application/x-www-form-urlencoded` bodies whose keys nest with brackets:
//! `metadata[order_id]=42`, `expand[0]=latest_charge` (async-stripe, via `serde_qs`) or
//! `expand[]=latest_charge` (curl, other clients), `automatic_payment_methods[enabled]=true`.
//! Booleans are the words `true`/`false`. An empty value means "unset", so an empty optional
//! parameter is simply absent and an empty required one is an error.
//!
//! Validation happens here, before the idempotency layer, so a 400 from this module is never
//! saved: fixing the request and retrying with the same key works, as on Stripe.

use std::collections::BTreeMap;
use std::str::FromStr;

use serde::Serialize;
use stripe_types::Currency;

use super::error::ApiError;

/// A decoded form body: its `(key, value)` pairs in the order they were sent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Form {
    pairs: Vec<(String, String)>,
}

impl Form {
    /// Decodes a form body. Decoding cannot fail: invalid UTF-8 becomes U+FFFD, which at worst
    /// makes a parameter unknown or invalid, and so a 400.
    pub fn parse(body: &[u8]) -> Self {
        let pairs = form_urlencoded::parse(body).into_owned().collect();
        Self { pairs }
    }

    /// The pairs sorted, so that two requests with the same parameters in another order compare
    /// equal (the idempotency fingerprint).
    pub fn canonical(&self) -> Vec<(String, String)> {
        let mut pairs = self.pairs.clone();
        pairs.sort();
        pairs
    }
}

/// Splits a key at its first bracket: `metadata[order_id]` → `("metadata", Some("order_id"))`,
/// `amount` → `("amount", None)`. The inner part is everything up to the last `]`, so a
/// metadata key may itself contain brackets. `None` for a malformed key (`a[b`, `a]`).
fn split_key(key: &str) -> Option<(&str, Option<&str>)> {
    match key.split_once('[') {
        None if key.contains(']') => None,
        None => Some((key, None)),
        Some((name, rest)) => rest.strip_suffix(']').map(|inner| (name, Some(inner))),
    }
}

/// `automatic_payment_methods`, echoed back on the PaymentIntent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct AutomaticPaymentMethods {
    pub enabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_redirects: Option<&'static str>,
}

/// The validated parameters of a create call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CreateParams {
    /// Smallest currency unit, at least 1.
    pub amount: i64,
    /// Lowercase, one Stripe supports.
    pub currency: String,
    /// A test payment method id; whether it exists is checked during execution, as on Stripe.
    pub payment_method: Option<String>,
    /// Confirm (charge) immediately.
    pub confirm: bool,
    pub description: Option<String>,
    pub metadata: BTreeMap<String, String>,
    /// `automatic_async` unless `automatic` was asked for; manual capture is not simulated.
    pub capture_method: &'static str,
    pub automatic_payment_methods: Option<AutomaticPaymentMethods>,
}

/// Stripe's documented metadata limits.
const METADATA_MAX_KEYS: usize = 50;
const METADATA_KEY_MAX_CHARS: usize = 40;
const METADATA_VALUE_MAX_CHARS: usize = 500;

impl CreateParams {
    /// Validates a create request's form. Repeated scalar keys keep the last value, as Stripe's
    /// (Rack's) parser does.
    pub fn from_form(form: &Form) -> Result<Self, ApiError> {
        let mut amount = None;
        let mut currency = None;
        let mut params = Self {
            amount: 0,
            currency: String::new(),
            payment_method: None,
            confirm: false,
            description: None,
            metadata: BTreeMap::new(),
            capture_method: "automatic_async",
            automatic_payment_methods: None,
        };
        let mut automatic_enabled = None;
        let mut allow_redirects = None;

        for (key, value) in &form.pairs {
            let Some((name, inner)) = split_key(key) else {
                return Err(ApiError::invalid_request(format!("Invalid parameter name: {key}")).param(key.as_str()));
            };
            match (name, inner) {
                ("amount", None) => amount = Some(parse_amount(value)?),
                ("currency", None) => currency = Some(parse_currency(value)?),
                ("payment_method", None) => params.payment_method = non_empty(value),
                ("confirm", None) => params.confirm = parse_bool(key, value)?.unwrap_or(false),
                ("description", None) => params.description = non_empty(value),
                ("capture_method", None) => params.capture_method = parse_capture_method(value)?,
                // `metadata=` (empty) unsets all metadata: on a create there is nothing to unset.
                ("metadata", None) if value.is_empty() => params.metadata.clear(),
                ("metadata", None) => {
                    return Err(ApiError::invalid_request("Invalid hash").param("metadata"));
                }
                ("metadata", Some(meta_key)) => set_metadata(&mut params.metadata, meta_key, value)?,
                // Expansion only changes how related objects are rendered; every id the
                // simulator returns is valid unexpanded, and async-stripe accepts either form.
                ("expand", _) => {}
                ("automatic_payment_methods", Some("enabled")) => {
                    automatic_enabled = parse_bool(key, value)?;
                }
                ("automatic_payment_methods", Some("allow_redirects")) => {
                    allow_redirects = match value.as_str() {
                        "" => None,
                        "always" => Some("always"),
                        "never" => Some("never"),
                        _ => return Err(invalid_enum(key, value, "always, never")),
                    };
                }
                _ => return Err(ApiError::parameter_unknown(key)),
            }
        }

        params.amount = amount.ok_or_else(|| ApiError::parameter_missing("amount"))?;
        params.currency = currency.ok_or_else(|| ApiError::parameter_missing("currency"))?;
        params.automatic_payment_methods = match (automatic_enabled, allow_redirects) {
            (Some(enabled), allow_redirects) => Some(AutomaticPaymentMethods { enabled, allow_redirects }),
            (None, Some(_)) => {
                return Err(ApiError::parameter_missing("automatic_payment_methods[enabled]"));
            }
            (None, None) => None,
        };
        if params.confirm && params.payment_method.is_none() {
            return Err(ApiError::invalid_request(
                "You cannot confirm this PaymentIntent because it's missing a payment method. \
                 Pass `payment_method` (for example `pm_card_visa`) along with `confirm=true`.",
            )
            .code("payment_intent_unexpected_state"));
        }
        Ok(params)
    }
}

fn non_empty(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

fn parse_amount(value: &str) -> Result<i64, ApiError> {
    if value.is_empty() {
        return Err(ApiError::parameter_empty("amount"));
    }
    let amount: i64 = value.parse().map_err(|_| {
        ApiError::invalid_request(format!("Invalid integer: {value}")).code("parameter_invalid_integer").param("amount")
    })?;
    if amount < 1 {
        return Err(ApiError::invalid_request("This value must be greater than or equal to 1.")
            .code("parameter_invalid_integer")
            .param("amount"));
    }
    Ok(amount)
}

fn parse_currency(value: &str) -> Result<String, ApiError> {
    if value.is_empty() {
        return Err(ApiError::parameter_empty("currency"));
    }
    let code = value.to_ascii_lowercase();
    // async-stripe's `Currency` lists exactly the currencies Stripe supports; anything else
    // parses as `Unknown`.
    match Currency::from_str(&code) {
        Ok(Currency::Unknown(_)) | Err(_) => Err(ApiError::invalid_request(format!(
            "Invalid currency: {value}. Stripe currently supports these currencies: see \
             https://docs.stripe.com/currencies"
        ))
        .param("currency")),
        Ok(_) => Ok(code),
    }
}

/// `Ok(None)` for an empty value ("unset": the default applies).
fn parse_bool(key: &str, value: &str) -> Result<Option<bool>, ApiError> {
    match value {
        "" => Ok(None),
        "true" => Ok(Some(true)),
        "false" => Ok(Some(false)),
        _ => Err(ApiError::invalid_request(format!("Invalid boolean: {value}")).param(key)),
    }
}

fn parse_capture_method(value: &str) -> Result<&'static str, ApiError> {
    match value {
        "" | "automatic_async" => Ok("automatic_async"),
        "automatic" => Ok("automatic"),
        "manual" => Err(ApiError::invalid_request(
            "capture_method=manual is not supported by the payonce Stripe simulator: it \
             captures every successful confirmation immediately.",
        )
        .param("capture_method")),
        _ => Err(invalid_enum("capture_method", value, "automatic, automatic_async, manual")),
    }
}

fn invalid_enum(key: &str, value: &str, allowed: &str) -> ApiError {
    ApiError::invalid_request(format!("Invalid {key}: must be one of {allowed} (got '{value}')")).param(key)
}

fn set_metadata(metadata: &mut BTreeMap<String, String>, key: &str, value: &str) -> Result<(), ApiError> {
    let param = format!("metadata[{key}]");
    if key.is_empty() {
        return Err(ApiError::invalid_request("Metadata keys must not be empty.").param(param));
    }
    if key.chars().count() > METADATA_KEY_MAX_CHARS {
        return Err(ApiError::invalid_request(format!(
            "Metadata keys can have up to {METADATA_KEY_MAX_CHARS} characters."
        ))
        .param(param));
    }
    if value.chars().count() > METADATA_VALUE_MAX_CHARS {
        return Err(ApiError::invalid_request(format!(
            "Metadata values can have up to {METADATA_VALUE_MAX_CHARS} characters."
        ))
        .param(param));
    }
    // An empty value unsets the key.
    if value.is_empty() {
        metadata.remove(key);
        return Ok(());
    }
    metadata.insert(key.to_owned(), value.to_owned());
    if metadata.len() > METADATA_MAX_KEYS {
        return Err(ApiError::invalid_request(format!("You can have up to {METADATA_MAX_KEYS} metadata keys."))
            .param("metadata"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use stripe::StripeRequest;
    use stripe_core::payment_intent::{CreatePaymentIntent, CreatePaymentIntentAutomaticPaymentMethods};

    use super::*;

    fn params(body: &str) -> Result<CreateParams, ApiError> {
        CreateParams::from_form(&Form::parse(body.as_bytes()))
    }

    fn error_code(body: &str) -> (Option<&'static str>, Option<String>) {
        let error = params(body).expect_err("the request is invalid").error;
        (error.code, error.param)
    }

    /// The body async-stripe builds (via serde_qs: `+` for space, `%2B` for plus, raw brackets,
    /// indexed arrays, percent-encoded brackets inside keys) decodes to what was set.
    #[test]
    fn decodes_what_async_stripe_encodes() {
        let metadata =
            HashMap::from([("order id".to_owned(), "a+b&c=d é [x]".to_owned()), ("k[1]".to_owned(), "v".to_owned())]);
        let request = CreatePaymentIntent::new(1234, Currency::EUR)
            .confirm(true)
            .payment_method("pm_card_visa")
            .description("two words+1")
            .metadata(metadata)
            .expand(vec!["latest_charge".to_owned(), "customer".to_owned()])
            .automatic_payment_methods(CreatePaymentIntentAutomaticPaymentMethods::new(true));
        let body = request.build().body.expect("a create call has a form body");

        let parsed = params(&body).expect("async-stripe's encoding is valid");

        assert_eq!(parsed.amount, 1234);
        assert_eq!(parsed.currency, "eur");
        assert!(parsed.confirm);
        assert_eq!(parsed.payment_method.as_deref(), Some("pm_card_visa"));
        assert_eq!(parsed.description.as_deref(), Some("two words+1"));
        assert_eq!(parsed.metadata["order id"], "a+b&c=d é [x]");
        assert_eq!(parsed.metadata["k[1]"], "v");
        assert_eq!(
            parsed.automatic_payment_methods,
            Some(AutomaticPaymentMethods { enabled: true, allow_redirects: None })
        );
    }

    /// The forms curl and other clients send: `expand[]`, an upper-case currency, `false`.
    #[test]
    fn accepts_other_client_spellings() {
        let parsed = params("amount=50&currency=USD&confirm=false&expand[]=latest_charge").expect("valid request");
        assert_eq!(parsed.currency, "usd");
        assert!(!parsed.confirm);
        assert_eq!(parsed.capture_method, "automatic_async");
    }

    /// Parameter order does not change the canonical form (the idempotency fingerprint).
    #[test]
    fn canonical_form_ignores_order() {
        let a = Form::parse(b"amount=1&currency=usd&metadata[a]=1&metadata[b]=2");
        let b = Form::parse(b"metadata[b]=2&currency=usd&amount=1&metadata[a]=1");
        assert_eq!(a.canonical(), b.canonical());
        assert_ne!(a.canonical(), Form::parse(b"amount=2&currency=usd").canonical());
    }

    /// Each kind of bad input gets Stripe's code and names the parameter.
    #[test]
    fn rejects_bad_parameters_like_stripe() {
        let missing = (Some("parameter_missing"), Some("amount".to_owned()));
        assert_eq!(error_code("currency=usd"), missing);
        let missing = (Some("parameter_missing"), Some("currency".to_owned()));
        assert_eq!(error_code("amount=100"), missing);
        let not_integer = (Some("parameter_invalid_integer"), Some("amount".to_owned()));
        assert_eq!(error_code("amount=12.5&currency=usd"), not_integer);
        assert_eq!(error_code("amount=0&currency=usd"), not_integer);
        let empty = (Some("parameter_invalid_empty"), Some("amount".to_owned()));
        assert_eq!(error_code("amount=&currency=usd"), empty);
        let unknown = (Some("parameter_unknown"), Some("customer".to_owned()));
        assert_eq!(error_code("amount=1&currency=usd&customer=cus_1"), unknown);
        let unknown = (Some("parameter_unknown"), Some("automatic_payment_methods[x]".to_owned()));
        assert_eq!(error_code("amount=1&currency=usd&automatic_payment_methods[x]=1"), unknown);
        assert_eq!(error_code("amount=1&currency=xyz"), (None, Some("currency".to_owned())));
        assert_eq!(error_code("amount=1&currency=usd&confirm=yes"), (None, Some("confirm".to_owned())));
        assert_eq!(error_code("amount=1&currency=usd&a]=1"), (None, Some("a]".to_owned())));
        let no_pm = (Some("payment_intent_unexpected_state"), None);
        assert_eq!(error_code("amount=1&currency=usd&confirm=true"), no_pm);
    }

    /// Metadata follows Stripe's limits and its "empty value unsets" rule.
    #[test]
    fn metadata_limits() {
        let parsed = params("amount=1&currency=usd&metadata[a]=1&metadata[a]=").expect("valid");
        assert!(parsed.metadata.is_empty());
        let long_key = format!("amount=1&currency=usd&metadata[{}]=1", "k".repeat(41));
        assert!(params(&long_key).is_err());
        let too_many: String = (0..51).map(|i| format!("&metadata[k{i}]=v")).collect();
        assert!(params(&format!("amount=1&currency=usd{too_many}")).is_err());
    }
}
