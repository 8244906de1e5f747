//! Request fingerprints: how payonce tells "the same request again" from "another request that
//! reuses a key".
//!
//! The fingerprint is SHA-256 over the method, the route and the *canonical JSON* of the request.
//! Canonical means: object members sorted by key, no insignificant whitespace, one spelling per
//! value. A client that retries by re-serialising its payload (keys in another order, other
//! spacing) therefore produces the same fingerprint and gets a replay, not a 422.
//!
//! `fuzz/` compiles this file on its own (without the rest of payonce): keep its imports to
//! external crates.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// SHA-256 of `method \n route \n canonical-json`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of one request.
    pub fn of(method: &str, route: &str, request: &Value) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(method.as_bytes());
        hasher.update(b"\n");
        hasher.update(route.as_bytes());
        hasher.update(b"\n");
        hasher.update(canonical_json(request).as_bytes());
        Self(hasher.finalize().into())
    }

    /// A stored digest (the `fingerprint` column), if it has the digest's length.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    /// The digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The first 12 hex digits: enough to correlate log lines, too little to matter if leaked.
    pub fn short(&self) -> String {
        hex::encode(&self.0[..6])
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fingerprint({})", self.short())
    }
}

/// The canonical JSON text of `value`: members sorted by key (by their UTF-8 bytes, which for the
/// ASCII keys of this API is also RFC 8785's order), compact, strings escaped as `serde_json`
/// escapes them.
///
/// The sort is done here rather than relied upon from `serde_json::Map`, because any crate in the
/// dependency graph can switch that map to insertion order (the `preserve_order` feature).
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut members: Vec<_> = map.iter().collect();
            members.sort_unstable_by(|(a, _), (b, _)| a.as_bytes().cmp(b.as_bytes()));
            out.push('{');
            for (i, (key, member)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write_canonical(member, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::String(s) => write_string(s, out),
        // null, booleans and numbers have one compact spelling in serde_json.
        scalar => out.push_str(&scalar.to_string()),
    }
}

fn write_string(s: &str, out: &mut String) {
    out.push_str(&Value::String(s.to_owned()).to_string());
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// Key order and whitespace do not change the canonical form; values do.
    #[test]
    fn canonical_form_ignores_order_and_whitespace() {
        let a: Value = serde_json::from_str(r#"{"b": 1, "a": {"y": [1, 2], "x": "s"}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":"s","y":[1,2]},"b":1}"#).unwrap();
        assert_eq!(canonical_json(&a), r#"{"a":{"x":"s","y":[1,2]},"b":1}"#);
        assert_eq!(canonical_json(&a), canonical_json(&b));
        assert_ne!(canonical_json(&json!({"a": [1, 2]})), canonical_json(&json!({"a": [2, 1]})));
    }

    /// Numbers that only a float holds keep their value through the canonical text, so
    /// canonicalising is idempotent for them too. serde_json's default float parser is off by
    /// an ulp for some inputs; the workspace enables its `float_roundtrip` (found by fuzz/).
    #[test]
    fn floats_survive_canonicalisation() {
        for text in
            ["184467446744037790551615", "-92233720368547758223372036854775808", "1.8446744674403778e23", "0.1", "1e-7"]
        {
            let value: Value = serde_json::from_str(text).unwrap();
            let canonical = canonical_json(&value);
            assert_eq!(serde_json::from_str::<Value>(&canonical).unwrap(), value, "{text} → {canonical}");
            assert_eq!(canonical_json(&serde_json::from_str(&canonical).unwrap()), canonical);
        }
    }

    /// The method and route are part of the fingerprint, not only the body.
    #[test]
    fn fingerprint_covers_method_and_route() {
        let body = json!({"amount": 100});
        let base = Fingerprint::of("POST", "/v1/payments", &body);
        assert_eq!(base, Fingerprint::of("POST", "/v1/payments", &body));
        assert_ne!(base, Fingerprint::of("POST", "/v1/refunds", &body));
        assert_ne!(base, Fingerprint::of("PUT", "/v1/payments", &body));
        assert_ne!(base, Fingerprint::of("POST", "/v1/payments", &json!({"amount": 101})));
    }

    /// JSON values with string keys, as a client could send them.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            "[a-z \"\\\\é\u{1F600}]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map("[a-zA-Z_]{1,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Serialises `value` the way a sloppy client might: members in reverse order, extra spaces.
    fn reserialise_differently(value: &Value) -> String {
        match value {
            Value::Object(map) => {
                let members: Vec<String> = map
                    .iter()
                    .rev()
                    .map(|(k, v)| format!(" {} :  {} ", Value::String(k.clone()), reserialise_differently(v)))
                    .collect();
                format!("{{ {} }}", members.join(" , "))
            }
            Value::Array(items) => {
                let items: Vec<String> = items.iter().map(reserialise_differently).collect();
                format!("[ {} ]", items.join(" ,\n "))
            }
            scalar => scalar.to_string(),
        }
    }

    proptest! {
        /// A re-serialised payload has the same canonical form (a retry is a replay, not a 422).
        #[test]
        fn reserialisation_is_invisible(value in json_value()) {
            let reparsed: Value = serde_json::from_str(&reserialise_differently(&value)).unwrap();
            prop_assert_eq!(canonical_json(&value), canonical_json(&reparsed));
        }

        /// The canonical text is itself JSON that parses back to the same value.
        #[test]
        fn canonical_text_round_trips(value in json_value()) {
            let reparsed: Value = serde_json::from_str(&canonical_json(&value)).unwrap();
            prop_assert_eq!(reparsed, value);
        }

        /// Different values have different canonical forms (and so different fingerprints).
        #[test]
        fn different_values_differ(a in json_value(), b in json_value()) {
            prop_assume!(a != b);
            prop_assert_ne!(canonical_json(&a), canonical_json(&b));
            prop_assert_ne!(Fingerprint::of("POST", "/r", &a), Fingerprint::of("POST", "/r", &b));
        }
    }
}
