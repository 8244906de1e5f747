//! Canonical JSON and the request fingerprint on arbitrary JSON text.
//!
//! Properties, for every input that is JSON: canonicalising never panics; the canonical text is
//! JSON for the same value; canonicalising is idempotent; it does not depend on member order or
//! whitespace (the value re-serialised with members reversed and extra spaces, or pretty-printed,
//! canonicalises to the same text and has the same fingerprint).
#![no_main]

use libfuzzer_sys::fuzz_target;
use payonce_fuzz::fingerprint::{Fingerprint, canonical_json};
use serde_json::Value;

/// `value` as a sloppy client might send it: members in reverse order, spaces everywhere.
fn reserialised(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let members: Vec<String> = map
                .iter()
                .rev()
                .map(|(k, v)| format!(" {} :\t{} ", Value::String(k.clone()), reserialised(v)))
                .collect();
            format!("{{ {} }}", members.join(" ,\n"))
        }
        Value::Array(items) => format!("[ {} ]", items.iter().map(reserialised).collect::<Vec<_>>().join(" , ")),
        scalar => scalar.to_string(),
    }
}

fuzz_target!(|text: &[u8]| {
    let Ok(value) = serde_json::from_slice::<Value>(text) else { return };
    let canonical = canonical_json(&value);
    let reparsed: Value = serde_json::from_str(&canonical).expect("canonical JSON is JSON");
    assert_eq!(reparsed, value, "canonical JSON is the same value");
    assert_eq!(canonical_json(&reparsed), canonical, "canonicalising is idempotent");
    for other in [reserialised(&value), serde_json::to_string_pretty(&value).unwrap()] {
        let other: Value = serde_json::from_str(&other).expect("a re-serialisation is JSON");
        assert_eq!(canonical_json(&other), canonical, "member order and whitespace do not matter");
        assert_eq!(Fingerprint::of("POST", "/v1/payments", &other), Fingerprint::of("POST", "/v1/payments", &value));
    }
});
