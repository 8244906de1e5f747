//! Integration tests: the real HTTP server, a real PostgreSQL, the real simulator.
//!
//! One test binary (one link step); one module per area of the contract.

mod admin;
mod admin_refunds;
mod architecture;
mod batch;
mod browser;
mod budget;
mod captures;
mod chromium;
mod concurrency;
mod conformance;
mod connections;
mod contract;
mod crash;
mod currencies;
mod database;
mod failover;
mod forgetting;
mod helpers;
mod input;
mod keys;
mod lab;
mod login;
mod openapi;
mod operations;
mod outage;
mod pending;
mod pending_refunds;
mod reconcile;
mod recovery;
mod refunds;
mod refusals;
mod retention;
mod scale;
mod schema;
mod scoping;
mod shop;
mod sweeper;
mod webhooks;
