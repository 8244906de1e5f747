//! The `Idempotency-Key` request header, parsed into an [`IdempotencyKey`].
//!
//! The IETF draft "The Idempotency-Key HTTP Header Field" defines the field as an RFC 8941
//! Structured Field *String*: `Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`. Stripe's
//! client libraries (and most hand-written clients) send the value bare, without quotes, so a bare
//! token is accepted too. Parse, don't validate: once a handler holds an `IdempotencyKey`, it is
//! known to be 1–255 printable ASCII characters.
//!
//! `fuzz/` compiles this file on its own (without the rest of payonce): keep its imports to
//! external crates.

use http::HeaderMap;

/// The header's name.
pub const HEADER: &str = "idempotency-key";

/// A client's idempotency key, decoded (quotes and escapes removed).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why an `Idempotency-Key` was refused. Each is a 400 with this text as the problem's detail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error(
        "this endpoint requires an Idempotency-Key header; send a unique value (a UUID is ideal) and reuse it when you retry"
    )]
    Missing,
    #[error("the Idempotency-Key header appears more than once; send exactly one key")]
    Repeated,
    #[error("the Idempotency-Key is empty")]
    Empty,
    #[error("the Idempotency-Key is {0} characters long; at most 255 are allowed")]
    TooLong(usize),
    #[error("the Idempotency-Key contains a character that is not printable ASCII")]
    NotPrintable,
    #[error("the Idempotency-Key is not a valid Structured Field String: {0}")]
    Malformed(&'static str),
}

impl IdempotencyKey {
    /// The longest key accepted, in characters (the same limit as Stripe's).
    pub const MAX_LEN: usize = 255;

    /// Reads the key from a request's headers: exactly one `Idempotency-Key` field.
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, KeyError> {
        let mut fields = headers.get_all(HEADER).iter();
        let field = fields.next().ok_or(KeyError::Missing)?;
        if fields.next().is_some() {
            return Err(KeyError::Repeated);
        }
        Self::parse(field.as_bytes())
    }

    /// Parses one field value: an sf-string (`"…"`, with `\"` and `\\` escapes) or a bare token.
    pub fn parse(field: &[u8]) -> Result<Self, KeyError> {
        // RFC 8941 §4.2: leading and trailing spaces are not part of the value.
        let field = field.trim_ascii();
        if field.is_empty() {
            return Err(KeyError::Empty);
        }
        // A tab inside the value is a control character like any other.
        if !field.iter().all(|&b| is_printable(b)) {
            return Err(KeyError::NotPrintable);
        }
        let key = match field {
            [b'"', rest @ ..] => parse_sf_string(rest)?,
            bare => parse_bare(bare)?,
        };
        Self::new(key)
    }

    /// Wraps an already-decoded key, checking its length and alphabet.
    pub fn new(key: String) -> Result<Self, KeyError> {
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if !key.bytes().all(is_printable) {
            return Err(KeyError::NotPrintable);
        }
        if key.len() > Self::MAX_LEN {
            return Err(KeyError::TooLong(key.len()));
        }
        Ok(Self(key))
    }

    /// The decoded key.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as an RFC 8941 sf-string, the form the IETF draft asks clients to send.
    pub fn to_sf_string(&self) -> String {
        let mut out = String::with_capacity(self.0.len() + 2);
        out.push('"');
        for c in self.0.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
        out
    }
}

impl std::fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Printable ASCII: `%x20-7E`, the alphabet of an sf-string.
fn is_printable(b: u8) -> bool {
    (0x20..=0x7e).contains(&b)
}

/// RFC 8941 §4.2.5, after the opening quote: `\"` and `\\` are the only escapes, and the string
/// must end with the closing quote. Parameters are not defined for this field and are refused.
fn parse_sf_string(input: &[u8]) -> Result<String, KeyError> {
    let mut out = String::with_capacity(input.len());
    let mut bytes = input.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&escaped @ (b'"' | b'\\')) => out.push(char::from(escaped)),
                Some(_) => {
                    return Err(KeyError::Malformed("a backslash may only escape '\"' or '\\'"));
                }
                None => return Err(KeyError::Malformed("the value ends inside an escape")),
            },
            b'"' => {
                return if bytes.as_slice().is_empty() {
                    Ok(out)
                } else {
                    Err(KeyError::Malformed("unexpected characters after the closing quote (only one key may be sent)"))
                };
            }
            other => out.push(char::from(other)),
        }
    }
    Err(KeyError::Malformed("the closing quote is missing"))
}

/// A bare (unquoted) key, as Stripe's clients send it: visible characters only, and none of the
/// characters that would make it ambiguous as a Structured Field.
fn parse_bare(input: &[u8]) -> Result<String, KeyError> {
    for &b in input {
        match b {
            b' ' => {
                return Err(KeyError::Malformed("spaces are only allowed inside a quoted key"));
            }
            b',' => {
                return Err(KeyError::Malformed("a comma separates several keys; send exactly one"));
            }
            b'"' | b'\\' | b';' => {
                return Err(KeyError::Malformed("quote the key (\"…\") to use '\"', '\\' or ';' in it"));
            }
            _ => {}
        }
    }
    // Every byte is printable ASCII (checked by the caller), so this is valid UTF-8.
    Ok(input.iter().map(|&b| char::from(b)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn parse(s: &str) -> Result<String, KeyError> {
        IdempotencyKey::parse(s.as_bytes()).map(|k| k.0)
    }

    /// The forms a client may send.
    #[test]
    fn accepts_sf_strings_and_bare_tokens() {
        assert_eq!(parse(r#""abc-123""#).unwrap(), "abc-123");
        assert_eq!(parse("abc-123").unwrap(), "abc-123");
        assert_eq!(parse("8e03978e-40d5-43e8-bc93-6894a57f9324").unwrap(), "8e03978e-40d5-43e8-bc93-6894a57f9324");
        assert_eq!(parse(r#""with \"quotes\" and \\ and spaces""#).unwrap(), r#"with "quotes" and \ and spaces"#);
        assert_eq!(parse(r#"  "padded"  "#).unwrap(), "padded");
    }

    /// Every row of the "malformed key" line of the contract.
    #[test]
    fn refuses_malformed_keys() {
        assert_eq!(parse(""), Err(KeyError::Empty));
        assert_eq!(parse("   "), Err(KeyError::Empty));
        assert_eq!(parse(r#""""#), Err(KeyError::Empty));
        assert_eq!(parse(&"k".repeat(256)), Err(KeyError::TooLong(256)));
        assert!(parse(&"k".repeat(255)).is_ok());
        assert_eq!(parse(&format!("\"{}\"", "k".repeat(256))), Err(KeyError::TooLong(256)));
        assert_eq!(IdempotencyKey::parse(b"ab\x01c"), Err(KeyError::NotPrintable));
        assert_eq!(IdempotencyKey::parse("cl\u{e9}".as_bytes()), Err(KeyError::NotPrintable));
        assert_eq!(IdempotencyKey::parse(b"a\tb"), Err(KeyError::NotPrintable));
        // NUL, which PostgreSQL cannot store, in either form (hyper refuses it in a header first).
        assert_eq!(IdempotencyKey::parse(b"a\0b"), Err(KeyError::NotPrintable));
        assert_eq!(IdempotencyKey::parse(b"\"a\0b\""), Err(KeyError::NotPrintable));
        assert!(matches!(parse(r#""unterminated"#), Err(KeyError::Malformed(_))));
        assert!(matches!(parse(r#""bad \n escape""#), Err(KeyError::Malformed(_))));
        assert!(matches!(parse(r#""a", "b""#), Err(KeyError::Malformed(_))));
        assert!(matches!(parse(r#""a";p=1"#), Err(KeyError::Malformed(_))));
        assert!(matches!(parse("a,b"), Err(KeyError::Malformed(_))));
        assert!(matches!(parse("two words"), Err(KeyError::Malformed(_))));
        assert!(matches!(parse(r#"ab"c"#), Err(KeyError::Malformed(_))));
    }

    /// Missing and repeated header fields.
    #[test]
    fn needs_exactly_one_header_field() {
        let mut headers = HeaderMap::new();
        assert_eq!(IdempotencyKey::from_headers(&headers), Err(KeyError::Missing));
        headers.append(HEADER, HeaderValue::from_static("a"));
        assert_eq!(IdempotencyKey::from_headers(&headers).unwrap().as_str(), "a");
        headers.append(HEADER, HeaderValue::from_static("a"));
        assert_eq!(IdempotencyKey::from_headers(&headers), Err(KeyError::Repeated));
    }

    proptest! {
        /// Any valid key survives a round trip through its sf-string form.
        #[test]
        fn sf_string_round_trip(key in "[ -~]{1,255}") {
            let parsed = IdempotencyKey::parse(IdempotencyKey::new(key.clone()).unwrap().to_sf_string().as_bytes());
            // Leading/trailing spaces inside the quotes are part of the key and must survive.
            prop_assert_eq!(parsed.unwrap().as_str().to_owned(), key);
        }

        /// A bare token of safe characters is taken as it is.
        #[test]
        fn bare_tokens_are_verbatim(key in "[A-Za-z0-9_.:/+=*!#$%&'()<>?@^`{|}~-]{1,255}") {
            prop_assert_eq!(parse(&key).unwrap(), key);
        }

        /// Arbitrary bytes never panic, and whatever is accepted is 1–255 printable characters.
        #[test]
        fn arbitrary_input_is_safe(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(key) = IdempotencyKey::parse(&bytes) {
                prop_assert!((1..=255).contains(&key.as_str().len()));
                prop_assert!(key.as_str().bytes().all(is_printable));
            }
        }
    }
}
