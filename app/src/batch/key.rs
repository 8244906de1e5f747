//! The batch id and each row's `Idempotency-Key`, derived before the first request is sent.
//!
//! The client's half of the idempotency contract: a key must exist *before* the network call it
//! protects, and a re-run must produce the same keys. Both hold here because a row's key is a
//! pure function of two values that a re-run of the same file has again:
//!
//! ```text
//! batch id  = --batch-id, or the first 16 hex digits of SHA-256(the file's bytes)
//! row key   = "batch:" + batch id + ":" + row_id
//! ```
//!
//! `batch id` never contains `:`, so the first `:` after the prefix ends it: two different
//! (batch id, row_id) pairs can never give the same key. The prefix makes a batch's keys easy
//! to find on the dashboard (search for `batch:<id>:`). docs/batch.md documents this for users.

use sha2::{Digest, Sha256};

use crate::idempotency::IdempotencyKey;

/// What every key of a batch starts with.
pub const PREFIX: &str = "batch:";
/// The longest `--batch-id`.
pub const MAX_BATCH_ID_LEN: usize = 64;
/// How many hex digits of the file's SHA-256 make the default batch id (64 bits).
const DIGEST_HEX_LEN: usize = 16;

/// A batch's id: 1–64 characters of `A–Z a–z 0–9 . _ -`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchId(String);

impl BatchId {
    /// The default id: the first 16 hex digits of the SHA-256 of the file's bytes, so that
    /// `sha256sum FILE | cut -c1-16` prints it too. The same bytes are the same batch; any edit
    /// (even a line ending) makes a new one, which is why an edited file must be re-run with
    /// `--batch-id` (docs/batch.md).
    pub fn from_content(bytes: &[u8]) -> Self {
        let digest = hex::encode(Sha256::digest(bytes));
        Self(digest[..DIGEST_HEX_LEN].to_owned())
    }

    /// An id chosen by the operator (`--batch-id`).
    pub fn parse(id: &str) -> Result<Self, String> {
        if id.is_empty() || id.len() > MAX_BATCH_ID_LEN {
            return Err(format!("a batch id is 1 to {MAX_BATCH_ID_LEN} characters long"));
        }
        if !id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
            return Err("a batch id may only hold letters, digits, '.', '_' and '-'".to_owned());
        }
        Ok(Self(id.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The `Idempotency-Key` of the row `row_id` of this batch.
    pub fn row_key(&self, row_id: &RowId) -> IdempotencyKey {
        let key = format!("{PREFIX}{}:{}", self.0, row_id.0);
        // At most 6 + 64 + 1 + 128 = 199 printable ASCII characters: always a valid key.
        IdempotencyKey::new(key).expect("a batch key is 1-255 printable ASCII characters")
    }
}

impl std::fmt::Display for BatchId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A row's `row_id`: 1–128 printable ASCII characters (space to `~`), unique in its file.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RowId(String);

impl RowId {
    /// The longest row id.
    pub const MAX_LEN: usize = 128;

    /// Parses a cell of the `row_id` column (already trimmed by the reader).
    pub fn parse(id: &str) -> Result<Self, String> {
        if id.is_empty() {
            return Err("is empty".to_owned());
        }
        if id.len() > Self::MAX_LEN {
            return Err(format!("is {} characters long; at most {} are allowed", id.len(), Self::MAX_LEN));
        }
        if !id.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            return Err("may only hold printable ASCII characters (space to '~')".to_owned());
        }
        Ok(Self(id.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for RowId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The default id is what `sha256sum FILE | cut -c1-16` prints.
    #[test]
    fn default_id_is_the_content_hash() {
        let id = BatchId::from_content(b"");
        assert_eq!(id.as_str(), "e3b0c44298fc1c14", "SHA-256 of the empty input");
        assert_eq!(BatchId::from_content(b"a,b\n1,2\n"), BatchId::from_content(b"a,b\n1,2\n"));
        assert_ne!(BatchId::from_content(b"a,b\n1,2\n"), BatchId::from_content(b"a,b\r\n1,2\r\n"));
    }

    /// The documented key, byte for byte.
    #[test]
    fn row_keys_are_documented_and_stable() {
        let batch = BatchId::parse("2026-12_invoices").unwrap();
        let key = batch.row_key(&RowId::parse("INV-0001").unwrap());
        assert_eq!(key.as_str(), "batch:2026-12_invoices:INV-0001");
        // Sent as a Structured Field String, which the server's parser reads back unchanged.
        let odd = batch.row_key(&RowId::parse(r#"a "quoted" \ id"#).unwrap());
        let parsed = IdempotencyKey::parse(odd.to_sf_string().as_bytes()).unwrap();
        assert_eq!(parsed, odd);
    }

    #[test]
    fn refuses_bad_batch_ids_and_row_ids() {
        assert!(BatchId::parse("").is_err());
        assert!(BatchId::parse(&"a".repeat(65)).is_err());
        assert!(BatchId::parse(&"a".repeat(64)).is_ok());
        assert!(BatchId::parse("a:b").is_err(), "':' would make keys ambiguous");
        assert!(BatchId::parse("a b").is_err());
        assert!(RowId::parse("").is_err());
        assert!(RowId::parse(&"r".repeat(129)).is_err());
        assert!(RowId::parse("caf\u{e9}").is_err());
        assert!(RowId::parse("tab\there").is_err());
        assert!(RowId::parse("a:b / c").is_ok());
    }

    proptest! {
        /// Every valid (batch id, row id) gives a key the server accepts, as sent (sf-string),
        /// and two different pairs never give the same key.
        #[test]
        fn keys_are_valid_and_injective(
            batch_a in "[A-Za-z0-9._-]{1,64}", row_a in "[ -~]{1,128}",
            batch_b in "[A-Za-z0-9._-]{1,64}", row_b in "[ -~]{1,128}",
        ) {
            let (a, b) = (BatchId::parse(&batch_a).unwrap(), BatchId::parse(&batch_b).unwrap());
            let (ra, rb) = (RowId::parse(&row_a).unwrap(), RowId::parse(&row_b).unwrap());
            let key = a.row_key(&ra);
            prop_assert_eq!(IdempotencyKey::parse(key.to_sf_string().as_bytes()).unwrap(), key.clone());
            if (&batch_a, &row_a) != (&batch_b, &row_b) {
                prop_assert_ne!(key, b.row_key(&rb));
            }
        }
    }
}
