//! The `Idempotency-Key` parser on arbitrary header bytes.
//!
//! Properties: it never panics; whatever it accepts is 1–255 printable ASCII characters; the
//! accepted key survives serialising it as a Structured Field String and parsing that again
//! (parse ∘ serialise is the identity); surrounding spaces do not change the result; reading
//! the key from a header map gives the same answer as parsing the field.
#![no_main]

use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use payonce_fuzz::key::{HEADER, IdempotencyKey};

fuzz_target!(|field: &[u8]| {
    let parsed = IdempotencyKey::parse(field);
    if let Ok(key) = &parsed {
        let text = key.as_str();
        assert!((1..=IdempotencyKey::MAX_LEN).contains(&text.len()), "{text:?}");
        assert!(text.bytes().all(|b| (0x20..=0x7e).contains(&b)), "{text:?}");
        let sf = key.to_sf_string();
        assert_eq!(IdempotencyKey::parse(sf.as_bytes()).as_ref(), Ok(key), "round trip of {sf:?}");
        assert_eq!(IdempotencyKey::new(text.to_owned()).as_ref(), Ok(key));
    }
    let mut padded = b"  ".to_vec();
    padded.extend_from_slice(field);
    padded.extend_from_slice(b" ");
    assert_eq!(IdempotencyKey::parse(&padded), parsed, "spaces around the field are not part of it");
    if let Ok(value) = HeaderValue::from_bytes(field) {
        let mut headers = HeaderMap::new();
        headers.insert(HEADER, value);
        assert_eq!(IdempotencyKey::from_headers(&headers), parsed);
    }
});
