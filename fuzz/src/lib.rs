//! payonce's parsers of client input, compiled from payonce's own source files for fuzzing.
//!
//! The files are included as they are (they depend on external crates only), so the fuzzers
//! exercise exactly the code the server runs.

#[path = "../../app/src/idempotency/key.rs"]
pub mod key;

#[path = "../../app/src/idempotency/fingerprint.rs"]
pub mod fingerprint;
