//! Integration tests: the real HTTP server, a real PostgreSQL, the real simulator.
//!
//! One test binary (one link step); one module per area of the contract.

mod admin;
mod browser;
mod chromium;
mod concurrency;
mod contract;
mod helpers;
mod keys;
mod recovery;
mod scoping;
mod shop;
