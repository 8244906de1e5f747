//! The body of `POST /v1/payments`, and its validation into the canonical [`NewPayment`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::db::can_store;
use crate::money::{self, Currency};
use crate::payments::model::CaptureMethod;
use crate::problem::FieldError;

/// Metadata keys reserved for payonce's own audit trail on the PaymentIntent.
pub const RESERVED_METADATA_PREFIX: &str = "payonce_";
/// Stripe allows 50 metadata keys; payonce adds three of its own.
pub const MAX_METADATA_KEYS: usize = 47;
const MAX_METADATA_KEY_LEN: usize = 40;
const MAX_METADATA_VALUE_LEN: usize = 500;
const MAX_DESCRIPTION_LEN: usize = 1000;
const MAX_PAYMENT_METHOD_LEN: usize = 255;
/// Why a text with a NUL character is refused (payment_method and currency refuse it by their
/// alphabets already).
const NUL: &str = "must not contain the NUL character (\\u0000)";

/// The request body exactly as the client may send it: a JSON object (see the `Deserialize`
/// impl below). Unknown fields are refused rather than ignored: a typo in an optional field
/// (`"metdata"`) should not silently charge without it.
///
/// Its OpenAPI schema (the `schema` attributes) says exactly what [`CreatePayment::validate`]
/// accepts, except the currency: any three letters pass the schema, and one Stripe does not
/// support is a 400.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, remote = "Self")]
pub struct CreatePayment {
    /// Amount in the currency's minor unit as Stripe defines it: cents for USD, yen for JPY,
    /// thousandths ending in 0 for the three-decimal dinars (KWD …), hundredths that are always
    /// `00` for ISK and UGX.
    #[schema(minimum = 1, maximum = 99_999_999)]
    pub amount: i64,
    /// ISO 4217 code, any case, of a currency Stripe supports.
    #[schema(pattern = "^[A-Za-z]{3}$", example = "usd")]
    pub currency: String,
    /// A Stripe PaymentMethod id (`pm_…`).
    #[schema(pattern = "^pm_[A-Za-z0-9_]{1,252}$", example = "pm_card_visa")]
    pub payment_method: String,
    /// Free text, shown on the PaymentIntent.
    #[serde(default)]
    #[schema(max_length = 1000, pattern = "^[^\\u0000]*$")]
    pub description: Option<String>,
    /// Your own keys and values, kept on the PaymentIntent.
    #[serde(default)]
    #[schema(schema_with = metadata_schema)]
    pub metadata: Option<BTreeMap<String, String>>,
    /// `automatic` (the default): charge now. `manual`: authorize only; the money moves when the
    /// payment is captured (`POST /v1/payments/{id}/capture`), or the hold is released
    /// (`POST /v1/payments/{id}/cancel`).
    #[serde(default)]
    pub capture: Option<CaptureMethod>,
}

/// A text without NUL, as a JSON Schema pattern (PostgreSQL cannot store `\u0000`).
const NUL_FREE: &str = "^[^\\u0000]*$";

/// The OpenAPI schema of `metadata`: exactly what [`CreatePayment::validate`] accepts.
fn metadata_schema() -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
    let name = ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(MAX_METADATA_KEY_LEN))
        .pattern(Some(format!("^(?!{RESERVED_METADATA_PREFIX})[^\\[\\]\\u0000]*$")));
    let value =
        ObjectBuilder::new().schema_type(Type::String).max_length(Some(MAX_METADATA_VALUE_LEN)).pattern(Some(NUL_FREE));
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .description(Some(
            "Up to 47 keys of your own (Stripe allows 50; payonce adds three): names of 1 to 40 characters, without \
             `[` or `]` and not starting with `payonce_`; values of at most 500 characters.",
        ))
        .max_properties(Some(MAX_METADATA_KEYS))
        .property_names(Some(name))
        .additional_properties(Some(value))
        .build()
}

/// Only from a JSON object. serde's derive also accepts a struct as a sequence of its fields in
/// order, so `[100, "usd", "pm_card_visa", null, {}]` would otherwise be a payment.
impl<'de> Deserialize<'de> for CreatePayment {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> serde::de::Visitor<'de> for Object {
            type Value = CreatePayment;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("the payment as a JSON object, e.g. {\"amount\": 100, \"currency\": \"usd\", …}")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                CreatePayment::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        deserializer.deserialize_map(Object)
    }
}

/// A validated payment request in canonical form: what the fingerprint covers, what is stored with
/// the key, and what the sweeper replays to finish abandoned work.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewPayment {
    pub amount: i64,
    /// Lowercase, as Stripe spells currencies.
    pub currency: String,
    pub payment_method: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Always present (possibly empty), so `{}` and an absent `metadata` are the same request.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Left out when automatic, so that the canonical form (and the fingerprint) of every
    /// payment request made before manual capture existed is unchanged.
    #[serde(default, skip_serializing_if = "is_automatic")]
    pub capture: CaptureMethod,
}

fn is_automatic(capture: &CaptureMethod) -> bool {
    *capture == CaptureMethod::Automatic
}

impl NewPayment {
    /// Authorize only.
    pub fn manual_capture(&self) -> bool {
        self.capture == CaptureMethod::Manual
    }
}

impl CreatePayment {
    /// Checks every field and reports all problems at once, so a client fixes its request in one go.
    pub fn validate(self) -> Result<NewPayment, Vec<FieldError>> {
        let mut errors = Vec::new();

        let amount_error = money::out_of_range(self.amount);
        let amount_in_range = amount_error.is_none();
        errors.extend(amount_error.map(|why| FieldError::new("amount", why)));

        let currency = self.currency.to_ascii_lowercase();
        match Currency::of(&currency) {
            // An amount Stripe would refuse for its currency (a dinar amount not ending in 0, a
            // fraction of a króna) is refused here, before it could reach the gateway.
            Some(stripe) if amount_in_range => {
                if let Err(why) = stripe.check(self.amount) {
                    errors.push(FieldError::new("amount", why));
                }
            }
            Some(_) => {}
            None => errors.push(FieldError::new(
                "currency",
                "must be a three-letter ISO 4217 code that Stripe supports, e.g. \"usd\"",
            )),
        }

        let pm = &self.payment_method;
        if !(pm.starts_with("pm_")
            && pm.len() > 3
            && pm.len() <= MAX_PAYMENT_METHOD_LEN
            && pm.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
        {
            errors.push(FieldError::new("payment_method", "must be a PaymentMethod id such as \"pm_card_visa\""));
        }

        if let Some(description) = &self.description {
            if description.chars().count() > MAX_DESCRIPTION_LEN {
                errors
                    .push(FieldError::new("description", format!("must be at most {MAX_DESCRIPTION_LEN} characters")));
            } else if !can_store(description) {
                errors.push(FieldError::new("description", NUL));
            }
        }

        let metadata = self.metadata.unwrap_or_default();
        check_metadata(&metadata, MAX_METADATA_KEYS, &mut errors);

        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(NewPayment {
            amount: self.amount,
            currency,
            payment_method: self.payment_method,
            description: self.description,
            metadata,
            capture: self.capture.unwrap_or_default(),
        })
    }
}

/// Stripe's metadata limits, and payonce's reserved prefix, for a request that allows
/// `max_keys` client keys (Stripe's 50 minus payonce's own). Each problem goes to `errors`.
pub(crate) fn check_metadata(metadata: &BTreeMap<String, String>, max_keys: usize, errors: &mut Vec<FieldError>) {
    if metadata.len() > max_keys {
        errors.push(FieldError::new("metadata", format!("may hold at most {max_keys} keys")));
    }
    for (key, value) in metadata {
        let field = format!("metadata.{key}");
        if key.is_empty() || key.chars().count() > MAX_METADATA_KEY_LEN || key.contains(['[', ']']) {
            errors.push(FieldError::new(
                field,
                format!("keys must be 1 to {MAX_METADATA_KEY_LEN} characters, without '[' or ']'"),
            ));
        } else if key.starts_with(RESERVED_METADATA_PREFIX) {
            errors.push(FieldError::new(
                field,
                format!("keys starting with \"{RESERVED_METADATA_PREFIX}\" are reserved"),
            ));
        } else if value.chars().count() > MAX_METADATA_VALUE_LEN {
            errors.push(FieldError::new(field, format!("values must be at most {MAX_METADATA_VALUE_LEN} characters")));
        } else if !can_store(key) || !can_store(value) {
            errors.push(FieldError::new(field, NUL));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::fingerprint::canonical_json;

    fn body(json: &str) -> CreatePayment {
        serde_json::from_str(json).unwrap()
    }

    /// Currency case and absent optional members do not make a different request.
    #[test]
    fn canonical_form_normalises() {
        let a = body(r#"{"amount": 100, "currency": "USD", "payment_method": "pm_card_visa"}"#).validate().unwrap();
        let b = body(r#"{"payment_method": "pm_card_visa", "metadata": {}, "currency": "usd", "amount": 100, "description": null}"#)
            .validate()
            .unwrap();
        assert_eq!(a, b);
        let canonical = canonical_json(&serde_json::to_value(&a).unwrap());
        assert_eq!(canonical, r#"{"amount":100,"currency":"usd","metadata":{},"payment_method":"pm_card_visa"}"#);
    }

    /// Every invalid field is reported, each with its path.
    #[test]
    fn reports_every_invalid_field() {
        let errors = body(
            r#"{"amount": 0, "currency": "usdx", "payment_method": "card", "metadata": {"payonce_x": "1", "ok": "1"}}"#,
        )
        .validate()
        .unwrap_err();
        let fields: Vec<_> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["amount", "currency", "payment_method", "metadata.payonce_x"]);
    }

    /// Currencies Stripe does not know are refused, known ones in any case accepted.
    #[test]
    fn currencies() {
        let with = |c: &str| {
            body(&format!(r#"{{"amount": 1, "currency": "{c}", "payment_method": "pm_card_visa"}}"#)).validate()
        };
        assert!(with("eur").is_ok());
        assert!(with("JPY").is_ok());
        assert!(with("xyz").is_err());
        assert!(with("").is_err());
        assert!(with("us").is_err());
    }

    /// Only an object is a payment: not its fields as an array, nor any other JSON value.
    #[test]
    fn only_an_object() {
        for json in
            [r#"[100, "usd", "pm_card_visa", null, {}]"#, r#"[100, "usd", "pm_card_visa"]"#, "null", "1", r#""x""#]
        {
            let err = serde_json::from_str::<CreatePayment>(json).unwrap_err();
            assert!(err.to_string().contains("JSON object"), "{json}: {err}");
        }
        assert!(
            serde_json::from_str::<CreatePayment>(r#"{"amount": 1, "currency": "usd", "payment_method": "pm_x"}"#)
                .is_ok()
        );
    }

    /// A NUL character, which PostgreSQL cannot store, is refused in every text field, by name.
    #[test]
    fn nul_characters() {
        let errors = body(
            r#"{"amount": 1, "currency": "usd", "payment_method": "pm_card_visa", "description": "a\u0000",
                "metadata": {"k\u0000": "v", "ok": "v\u0000", "fine": "v"}}"#,
        )
        .validate()
        .unwrap_err();
        let fields: Vec<_> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["description", "metadata.k\0", "metadata.ok"]);
        // A lone surrogate cannot even be parsed into a string.
        assert!(
            serde_json::from_str::<CreatePayment>(
                r#"{"amount": 1, "currency": "usd", "payment_method": "pm_x", "description": "\ud800"}"#
            )
            .is_err()
        );
    }

    /// Unknown members and wrong types are refused by the deserializer.
    #[test]
    fn strict_shape() {
        assert!(
            serde_json::from_str::<CreatePayment>(
                r#"{"amount": 1, "currency": "usd", "payment_method": "pm_x", "extra": 1}"#
            )
            .is_err()
        );
        assert!(
            serde_json::from_str::<CreatePayment>(r#"{"amount": "1", "currency": "usd", "payment_method": "pm_x"}"#)
                .is_err()
        );
        assert!(
            serde_json::from_str::<CreatePayment>(r#"{"amount": 1.5, "currency": "usd", "payment_method": "pm_x"}"#)
                .is_err()
        );
    }
}
