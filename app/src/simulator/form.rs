//! Stripe's request encoding, and the parsing rules every route shares.
//!
//! Stripe takes `application/x-www-form-urlencoded` bodies (and query strings) whose keys nest
//! with brackets: `metadata[order_id]=42`, `expand[0]=latest_charge` (async-stripe, via
//! `serde_qs`, and Stripe's Python library) or `expand[]=latest_charge` (curl),
//! `automatic_payment_methods[enabled]=true`. Booleans are the words `true`/`false`. An empty
//! value means "unset", so an empty optional parameter is simply absent and an empty required one
//! is an error.
//!
//! Validation happens before the idempotency layer, so a 400 from parsing is never saved: fixing
//! the request and retrying with the same key works, as on Stripe.

use std::collections::BTreeMap;

use super::error::ApiError;
use crate::money::{Currency, Step};

/// A decoded form body or query string: its `(key, value)` pairs in the order they were sent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Form {
    pairs: Vec<(String, String)>,
}

/// One parameter, its key split at the first bracket: `metadata[order_id]` is `name: "metadata",
/// inner: Some("order_id")`; `expand[]` has `inner: Some("")`.
pub(crate) struct Param<'a> {
    pub key: &'a str,
    pub name: &'a str,
    pub inner: Option<&'a str>,
    pub value: &'a str,
}

impl Form {
    /// Decodes a form body. Decoding cannot fail: invalid UTF-8 becomes U+FFFD, which at worst
    /// makes a parameter unknown or invalid, and so a 400.
    pub fn parse(body: &[u8]) -> Self {
        let pairs = form_urlencoded::parse(body).into_owned().collect();
        Self { pairs }
    }

    /// Decodes a URL's query string (none is an empty form).
    pub fn query(query: Option<&str>) -> Self {
        Self::parse(query.unwrap_or_default().as_bytes())
    }

    /// The pairs sorted, so that two requests with the same parameters in another order compare
    /// equal (the idempotency fingerprint).
    pub fn canonical(&self) -> Vec<(String, String)> {
        let mut pairs = self.pairs.clone();
        pairs.sort();
        pairs
    }

    /// The parameters in order, each split into name and bracketed part; a malformed key
    /// (`a[b`, `a]`) is a 400 naming it.
    pub fn params(&self) -> Result<Vec<Param<'_>>, ApiError> {
        self.pairs
            .iter()
            .map(|(key, value)| {
                let (name, inner) = split_key(key).ok_or_else(|| {
                    ApiError::invalid_request(format!("Invalid parameter name: {key}")).param(key.as_str())
                })?;
                Ok(Param { key, name, inner, value })
            })
            .collect()
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

/// Whether a bracketed part is a list index: `[]` or `[3]`.
pub(crate) fn is_list_index(inner: Option<&str>) -> bool {
    inner.is_some_and(|inner| inner.bytes().all(|byte| byte.is_ascii_digit()))
}

pub(crate) fn non_empty(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

/// A positive amount in the currency's smallest unit.
pub(crate) fn parse_amount(param: &str, value: &str) -> Result<i64, ApiError> {
    if value.is_empty() {
        return Err(ApiError::parameter_empty(param));
    }
    let amount: i64 = value.parse().map_err(|_| {
        ApiError::invalid_request(format!("Invalid integer: {value}")).code("parameter_invalid_integer").param(param)
    })?;
    if amount < 1 {
        return Err(ApiError::invalid_request("This value must be greater than or equal to 1.")
            .code("parameter_invalid_integer")
            .param(param));
    }
    Ok(amount)
}

/// A currency Stripe supports, lowercased.
pub(crate) fn parse_currency(value: &str) -> Result<String, ApiError> {
    if value.is_empty() {
        return Err(ApiError::parameter_empty("currency"));
    }
    // The currencies payonce knows Stripe supports (crate::money: async-stripe's list and the
    // three-decimal ones).
    match Currency::of(value) {
        None => Err(ApiError::invalid_request(format!(
            "Invalid currency: {value}. Stripe currently supports these currencies: see \
             https://docs.stripe.com/currencies"
        ))
        .param("currency")),
        Some(_) => Ok(value.to_ascii_lowercase()),
    }
}

/// Stripe's refusal of an amount its currency cannot take ([`crate::money`]), for a charge or a
/// refund. ISK and UGX amounts that are not whole get Stripe's own code and words (quoted in
/// <https://support.stripe.com/questions/deprecation-of-fractional-isk-charges-and-refunds>).
/// For a three-decimal amount not ending in 0, Stripe documents the rule
/// (<https://docs.stripe.com/currencies#three-decimal>) but not its answer: the words are the
/// simulator's, and it names no code rather than guess one.
pub(crate) fn check_amount(param: &str, amount: i64, currency: &str) -> Result<(), ApiError> {
    let Some(stripe) = Currency::of(currency) else { return Ok(()) };
    if stripe.check(amount).is_ok() {
        return Ok(());
    }
    let code = stripe.code();
    let refusal = match stripe.step() {
        Step::WholeUnits => ApiError::invalid_request(format!(
            "Invalid amount. Currency {code} has become effectively zero-decimal and charged amounts must be \
             evenly divisible by 100. See https://stripe.com/docs/currencies#special-cases for more information."
        ))
        .code("invalid_charge_amount_no_decimal_compatible"),
        Step::LastDigitZero | Step::Any => ApiError::invalid_request(format!(
            "Invalid amount. {code} is a three-decimal currency: amounts must have 0 as their last digit (round \
             5124 to 5120 or 5130). See https://stripe.com/docs/currencies#three-decimal for more information."
        )),
    };
    Err(refusal.param(param))
}

/// `Ok(None)` for an empty value ("unset": the default applies).
pub(crate) fn parse_bool(key: &str, value: &str) -> Result<Option<bool>, ApiError> {
    match value {
        "" => Ok(None),
        "true" => Ok(Some(true)),
        "false" => Ok(Some(false)),
        _ => Err(ApiError::invalid_request(format!("Invalid boolean: {value}")).param(key)),
    }
}

/// A positive integer no larger than `max` (a list's `limit`).
pub(crate) fn parse_limit(key: &str, value: &str, max: i64) -> Result<usize, ApiError> {
    let limit: i64 = value.parse().map_err(|_| {
        ApiError::invalid_request(format!("Invalid integer: {value}")).code("parameter_invalid_integer").param(key)
    })?;
    if !(1..=max).contains(&limit) {
        return Err(ApiError::invalid_request(format!("This value must be between 1 and {max}."))
            .code("parameter_invalid_integer")
            .param(key));
    }
    Ok(usize::try_from(limit).unwrap_or(1))
}

pub(crate) fn invalid_enum(key: &str, value: &str, allowed: &str) -> ApiError {
    ApiError::invalid_request(format!("Invalid {key}: must be one of {allowed} (got '{value}')")).param(key)
}

/// Stripe's documented metadata limits.
const METADATA_MAX_KEYS: usize = 50;
const METADATA_KEY_MAX_CHARS: usize = 40;
const METADATA_VALUE_MAX_CHARS: usize = 500;

/// Applies one `metadata[key]=value` pair (or `metadata=`, which unsets everything) with Stripe's
/// limits and its "empty value unsets" rule.
pub(crate) fn apply_metadata(
    metadata: &mut BTreeMap<String, String>,
    inner: Option<&str>,
    value: &str,
) -> Result<(), ApiError> {
    let Some(key) = inner else {
        // `metadata=` (empty) unsets all metadata; a non-empty scalar is not a hash.
        return if value.is_empty() {
            metadata.clear();
            Ok(())
        } else {
            Err(ApiError::invalid_request("Invalid hash").param("metadata"))
        };
    };
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
    use super::*;

    /// Parameter order does not change the canonical form (the idempotency fingerprint).
    #[test]
    fn canonical_form_ignores_order() {
        let a = Form::parse(b"amount=1&currency=usd&metadata[a]=1&metadata[b]=2");
        let b = Form::parse(b"metadata[b]=2&currency=usd&amount=1&metadata[a]=1");
        assert_eq!(a.canonical(), b.canonical());
        assert_ne!(a.canonical(), Form::parse(b"amount=2&currency=usd").canonical());
    }

    /// Keys split at the first bracket; malformed keys are refused; list indexes are recognised.
    #[test]
    fn keys_split_at_brackets() {
        let form = Form::parse(b"metadata[k[1]]=v&expand[]=x&expand[0]=y&amount=1");
        let params = form.params().expect("well-formed");
        let split: Vec<_> = params.iter().map(|p| (p.name, p.inner)).collect();
        assert_eq!(split, [("metadata", Some("k[1]")), ("expand", Some("")), ("expand", Some("0")), ("amount", None)]);
        assert!(is_list_index(Some("")) && is_list_index(Some("12")) && !is_list_index(Some("a")));
        assert!(Form::parse(b"a]=1").params().is_err());
        assert!(Form::parse(b"a[b=1").params().is_err());
    }

    /// Metadata follows Stripe's limits and its "empty value unsets" rule.
    #[test]
    fn metadata_limits() {
        let mut metadata = BTreeMap::new();
        apply_metadata(&mut metadata, Some("a"), "1").expect("valid");
        apply_metadata(&mut metadata, Some("a"), "").expect("unset");
        assert!(metadata.is_empty());
        assert!(apply_metadata(&mut metadata, Some(&"k".repeat(41)), "1").is_err());
        assert!(apply_metadata(&mut metadata, None, "x").is_err());
        for i in 0..50 {
            apply_metadata(&mut metadata, Some(&format!("k{i}")), "v").expect("up to 50");
        }
        assert!(apply_metadata(&mut metadata, Some("k50"), "v").is_err());
    }
}
