//! payonce: a reference payments service that makes every payment request happen exactly once.
//!
//! A client sends `POST /v1/payments` with an `Idempotency-Key` header. However many times that
//! request arrives (double clicks, client retries, two servers racing, a server killed halfway),
//! the customer is charged once and every retry gets the same answer.
//!
//! # Layout
//!
//! Top to bottom: a module imports only modules listed below it, so there is no import circle
//! (tests/api/architecture.rs fails on one) and each can be read from those beneath it. The
//! composition root (`cli`, `server`, `config`, `app`) is on top; the engine (`idempotency`) at
//! the bottom imports nothing of payonce's own.
//!
//! ```text
//! cli            the `payonce` command line: serve, sweep, migrate, customers, admins, stripe-sim,
//!                db, batch
//! server         `payonce serve`: startup and orderly shutdown of everything below
//! config         runtime configuration resolved from flags and environment; each part's settings
//!                are defined beside their users (db, gateway, listener, web, …) and gathered here
//! app            the whole application: the API, the dashboard, the shop and the assets, behind
//!                the middleware every response goes through
//! admin          the operators' dashboard at /admin (docs/dashboard.md)
//! shop           a demo shop at / with a double-click-proof checkout (and authorize-only)
//! http           the JSON API: routes, extractors, the error type (domain outcomes become problem
//!                documents here, and only here), the edge's refusals, `POST /webhooks/stripe`
//!                (the signature checked, then the inbox), the OpenAPI description
//!   idempotent   one operation's request run by the engine (or a lab strategy) to its answer
//! state          `AppState`: what every handler, the API's and the pages', can reach
//! web            what the HTML side shares: sessions, CSRF, flash messages, number formats, assets
//! batch          `payonce batch charge FILE.csv`: a resumable bulk charge client of the HTTP API,
//!                one Idempotency-Key per row derived before the first request, each 202 followed
//!                until its payment is final (docs/batch.md)
//! sweeper        the background worker: completes abandoned keys, reconciles spent keys and
//!                pending payments and refunds, deletes expired keys, keeps the history bounded
//! lab            the claim-strategy lab: for-update, redis and check-then-insert beside the
//!                engine's on-conflict (`PAYONCE_CLAIM_STRATEGY`, docs/strategies.md), chosen
//!                once at startup (`lab::Claims`)
//! operations     the registry: every idempotent operation (payment, refund, capture, cancel) in
//!                one closed enum (`Op`) with its route, method, phases and driver
//! captures       capture and cancel of an authorized payment: operations written against the
//!                engine's seam alone (docs/architecture.md works the capture through)
//! refunds        the refund resource: its amount reserved on the payment at the first write (the
//!                claim's transaction), so different keys never refund more than was captured
//!   webhook      Stripe's refund events, applied forward only (a handler of the inbox)
//!   reconcile    pending refunds looked up at the gateway when due (the net under webhooks)
//! payments       the payment resource:
//!   process      its recovery points (started → payment_created → finished): one short
//!                statement each, the gateway call between them
//!   reconcile    asking the gateway what became of it: spent keys, pending payments
//!   webhook      Stripe's PaymentIntent events, applied forward only (a handler of the inbox)
//! inbox          the webhook inbox: each Stripe event recorded once (`webhook_events`) in the
//!                transaction of its effect, handed by type to payments::webhook or
//!                refunds::webhook, redeliveries noted on the timeline it went on
//! simulator      a Stripe-wire-compatible simulator: PaymentIntents (manual capture too),
//!                refunds, search, events and signed webhook deliveries, a ledger, faults
//! gateway        Stripe through async-stripe (over a pooled transport), with a deterministic
//!                downstream idempotency key
//!   outcome      every answer as one of succeeded, authorized, canceled, declined, pending,
//!                refused, unknown
//! listener       the HTTP/1.1 accept loop: connection cap, header, idle and body timeouts
//! telemetry      tracing setup (pretty or JSON lines, a request id on every line)
//! metrics        Prometheus counters and histograms (`GET /metrics`)
//! failpoint      named crash points for the crash tests (`PAYONCE_FAILPOINT`)
//! db             the connection pool, migrations, and the zero-config local PostgreSQL (which
//!                keeps its port across restarts: `payonce db url|start|stop`)
//! retention      the history tables (key events, webhook inbox) partitioned by day: the coming
//!                days made ahead, the days past the retention detached and dropped whole
//! customers      API customers and their keys (hashed, compared in constant time, cached 30 s)
//! body           a request body that could not be read (413, 408, 400), for API and forms alike
//! problem        RFC 9457 problem documents, every problem type, and the invalid-field vocabulary
//!                (`FieldError`): the domain stores problems as final answers, the API sends them
//! money          amounts in each currency's minor unit as Stripe defines it (ISO 4217 plus
//!                Stripe's exceptions): formatting, parsing, the amounts Stripe refuses, the
//!                largest amount accepted
//! secret         a value that never reaches a log
//! idempotency    the engine, independent of what a request does:
//!   key          `Idempotency-Key` header → `IdempotencyKey` (Structured Field String or token)
//!   fingerprint  canonical JSON and the SHA-256 request fingerprint
//!   claim        INSERT … ON CONFLICT DO NOTHING, and the decision taken on conflict
//!   budget       one backoff, attempts and the downstream key's horizon, for every path
//!   lease        the fencing token, the heartbeat, releasing a key, the key's final write
//!   recovery     taking over abandoned and spent keys, reaping expired ones (SKIP LOCKED)
//!   response     the stored response, replayed byte for byte
//!   replays      final answers replayed recently, kept in memory for a few seconds
//!   events       the append-only `idempotency_events` log
//!   operator     the dashboard's fenced actions: release a stuck key, expire a final one
//!   operation    the seam an operation implements (`Idempotent`: route, phases, first write,
//!                resume, pending look-up) and the registry the sweeper drives every key through
//!   downstream   the provider-neutral answers of a downstream call (unknown, refused, declined)
//!   identity     the request's identity, stable across a restore of the database
//! ```
//!
//! # Data flow of one payment
//!
//! ```text
//! request ─► http::payments ─► idempotency::claim ──new──► payments::process ─► gateway ─► Stripe
//!                                  │  │                       (lease held, heartbeat running,
//!                                  │  └─ in flight ─► 409       no transaction open)
//!                                  └─ completed ─► stored response replayed
//!
//! sweeper ─► idempotency::recovery (abandoned keys) ─► payments::process (the same code)
//!        ├─► spent keys, pending payments ─► payments::reconcile ─► gateway (retrieve, replay, search)
//!        └─► pending refunds ─► refunds::reconcile ─► gateway (retrieve)
//! Stripe ─► POST /webhooks/stripe ─► inbox ─► payments::webhook | refunds::webhook
//!                                         (the event's id and its effect, one transaction)
//! ```
//!
//! Every gateway answer is one [`gateway::Outcome`]: succeeded and declined are the customer's
//! final outcome (201, 402), pending is answered 202 and moves on later, refused (payonce's own
//! configuration) and unknown are never stored: the key is released and retried within its
//! budget, then reconciled.
//!
//! Every write after the claim carries the lease's fencing token, so a worker that lost its lease
//! (it was slow, paused, or presumed dead) can never overwrite the work of the one that took over.
//! See `docs/lifecycle.md` for the full state machine.

pub mod admin;
pub mod app;
pub mod batch;
pub mod body;
pub mod captures;
pub mod cli;
pub mod config;
pub mod customers;
pub mod db;
pub mod failpoint;
pub mod gateway;
pub mod http;
pub mod idempotency;
pub mod inbox;
pub mod lab;
pub mod listener;
pub mod metrics;
pub mod money;
pub mod operations;
pub mod payments;
pub mod problem;
pub mod refunds;
pub mod retention;
pub mod secret;
pub mod server;
pub mod shop;
pub mod simulator;
pub mod state;
pub mod sweeper;
pub mod telemetry;
pub mod web;
