//! No code: this crate only unifies dependency features between `cargo run` and
//! `cargo test --workspace`, so that the second reuses what the first built (see its Cargo.toml).
