// Present so that Cargo resolves this crate's [build-dependencies] (the host-side features).
fn main() {}
