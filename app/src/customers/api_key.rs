//! API keys: `po_<lookup>_<secret>`.
//!
//! The lookup part (16 hex digits) finds the customer's row through a unique index. Only the
//! SHA-256 of the whole key is stored; the presented key's digest is compared with it in constant
//! time, so response timing says nothing about how much of a guess was right. A fast hash is the
//! right tool here: the secret is 256 random bits, not a password a person chose.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

const PREFIX: &str = "po_";
const LOOKUP_BYTES: usize = 8;
const SECRET_BYTES: usize = 32;

/// A freshly generated key. Its text is shown once, to the operator who created it.
pub struct ApiKey {
    text: String,
}

impl ApiKey {
    /// A new random key.
    pub fn generate() -> Result<Self, getrandom::Error> {
        let mut lookup = [0u8; LOOKUP_BYTES];
        let mut secret = [0u8; SECRET_BYTES];
        getrandom::fill(&mut lookup)?;
        getrandom::fill(&mut secret)?;
        Ok(Self { text: format!("{PREFIX}{}_{}", hex::encode(lookup), hex::encode(secret)) })
    }

    /// The key as the client will send it.
    pub fn expose(&self) -> &str {
        &self.text
    }

    /// The part stored in the clear.
    pub fn lookup(&self) -> &str {
        lookup_of(&self.text).expect("a generated key has a lookup part")
    }

    /// What is stored instead of the key.
    pub fn digest(&self) -> [u8; 32] {
        digest(&self.text)
    }
}

// Never print a key by accident.
impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(..)")
    }
}

/// The lookup part of a presented key, if it has the right shape.
pub fn lookup_of(presented: &str) -> Option<&str> {
    let rest = presented.strip_prefix(PREFIX)?;
    let (lookup, secret) = rest.split_once('_')?;
    let hex_of = |s: &str, bytes: usize| s.len() == bytes * 2 && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex_of(lookup, LOOKUP_BYTES) && hex_of(secret, SECRET_BYTES)).then_some(lookup)
}

/// SHA-256 of a key.
pub fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Whether `presented` is the key whose digest is `stored`, in constant time.
pub fn matches(presented: &str, stored: &[u8]) -> bool {
    digest(presented).ct_eq(stored).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A generated key parses, matches its digest, and a one-character change does not.
    #[test]
    fn generated_keys_verify() {
        let key = ApiKey::generate().unwrap();
        assert_eq!(lookup_of(key.expose()), Some(key.lookup()));
        assert!(matches(key.expose(), &key.digest()));
        let mut wrong = key.expose().to_owned();
        let last = wrong.pop().unwrap();
        wrong.push(if last == '0' { '1' } else { '0' });
        assert!(!matches(&wrong, &key.digest()));
        assert_eq!(format!("{key:?}"), "ApiKey(..)");
    }

    /// Anything not shaped like a key has no lookup part.
    #[test]
    fn malformed_keys() {
        for bad in ["", "po_", "po_abc_def", "sk_test_123", "po_0123456789abcdef", "po_0123456789abcdeg_00"] {
            assert_eq!(lookup_of(bad), None, "{bad}");
        }
    }
}
