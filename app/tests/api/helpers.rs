//! The test harness: a real payonce server on a free port, against its own fresh PostgreSQL
//! database and its own Stripe simulator, driven over HTTP.
//!
//! The database server is `DATABASE_URL` when it is set (CI points it at the machine's
//! PostgreSQL), otherwise the zero-config local PostgreSQL under `target/`, started on first use
//! and left running for the next run. Every test gets a database of its own, dropped afterwards.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use payonce::config::{DatabaseConfig, GatewayConfig, Secret, ServeConfig, StripeConfig};
use payonce::db::local::LocalPostgres;
use payonce::idempotency::EngineSettings;
use payonce::server::Server;
use payonce::simulator::{self, RunningSimulator};
use payonce::sweeper::SweeperSettings;
use reqwest::{RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::{OnceCell, oneshot};
use uuid::Uuid;

/// A valid payment body.
pub fn payment(amount: i64) -> Value {
    json!({"amount": amount, "currency": "usd", "payment_method": "pm_card_visa"})
}

/// A fresh idempotency key.
pub fn new_key() -> String {
    Uuid::now_v7().to_string()
}

/// The server URL of the PostgreSQL that test databases are created on.
static SERVER: OnceCell<String> = OnceCell::const_new();

async fn database_server() -> &'static str {
    SERVER
        .get_or_init(|| async {
            if let Ok(url) = std::env::var("DATABASE_URL")
                && !url.is_empty()
            {
                return url;
            }
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("postgres");
            let local = LocalPostgres::start(&dir)
                .await
                .unwrap_or_else(|err| panic!("no DATABASE_URL and no local PostgreSQL: {err}"));
            // The handle is not stopped: the server keeps running for the next test run to reuse.
            local.url("postgres")
        })
        .await
}

/// Creates an empty database and returns its URL.
async fn create_database(name: &str) -> String {
    let server = database_server().await;
    let mut admin = PgConnection::connect(server).await.expect("connect to the test PostgreSQL");
    sqlx::query(&format!("create database {name}")).execute(&mut admin).await.expect("create the test database");
    let mut url = url_with_database(server, name);
    url.push_str(if url.contains('?') { "&" } else { "?" });
    url.push_str("application_name=payonce-test");
    url
}

/// `url` with its database path replaced by `name`.
fn url_with_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[scheme_end..].find('/').map_or(base.len(), |i| scheme_end + i);
    let mut out = format!("{}/{name}", &base[..host_end]);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

/// Knobs a test may turn before the server starts.
pub struct Options {
    pub lease: Duration,
    pub gateway_timeout: Duration,
    /// Use the built-in simulator instead of the test's own (as `payonce serve` does without keys).
    pub builtin_simulator: bool,
    /// The in-server sweeper's settings. By default it passes once at startup and then sleeps for
    /// an hour, so that it cannot race a test that is not about it.
    pub sweeper: SweeperSettings,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(60),
            gateway_timeout: Duration::from_secs(10),
            builtin_simulator: false,
            sweeper: SweeperSettings { interval: Duration::from_secs(3600), ..SweeperSettings::default() },
        }
    }
}

/// One running payonce and everything around it.
pub struct TestApp {
    pub addr: SocketAddr,
    pub client: reqwest::Client,
    /// A direct pool on the test database, for asserting on rows.
    pub db: PgPool,
    /// The simulator's base URL (`http://…/`).
    pub sim_url: String,
    _sim: Option<RunningSimulator>,
    database: String,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl TestApp {
    pub async fn spawn() -> Self {
        Self::spawn_with(Options::default()).await
    }

    pub async fn spawn_with(options: Options) -> Self {
        let database = format!("payonce_test_{}", Uuid::new_v4().simple());
        let url = create_database(&database).await;
        let sim = if options.builtin_simulator {
            None
        } else {
            Some(simulator::start("127.0.0.1:0".parse().unwrap()).await.expect("start the simulator"))
        };
        let config = ServeConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            database: DatabaseConfig {
                url: Some(Secret::new(url.clone())),
                local_dir: ".payonce".into(),
                pool_size: 10,
            },
            engine: EngineSettings { lease: options.lease, key_ttl: Duration::from_secs(86_400) },
            gateway: GatewayConfig {
                stripe: sim.as_ref().map(|sim| StripeConfig {
                    secret_key: Secret::new("sk_test_payonce"),
                    api_base: Some(sim.base_url()),
                }),
                simulator_addr: "127.0.0.1:0".parse().unwrap(),
                timeout: options.gateway_timeout,
            },
            sweeper: options.sweeper,
            web: Default::default(),
        };
        let server = Server::start(config).await.expect("start payonce");
        let addr = server.local_addr();
        let sim_url = match &sim {
            Some(sim) => sim.base_url(),
            None => server.simulator_url().expect("the built-in simulator runs"),
        };
        let (shutdown, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        let db = PgPool::connect(&url).await.expect("connect to the test database");
        Self {
            addr,
            client: reqwest::Client::new(),
            db,
            sim_url,
            _sim: sim,
            database,
            shutdown: Some(shutdown),
            server: Some(server),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Creates a customer through the library, as `payonce customers create` does; returns its key.
    pub async fn customer(&self, name: &str) -> String {
        let (_, key) = payonce::customers::create(&self.db, name).await.expect("create a customer");
        key.expose().to_owned()
    }

    /// `POST /v1/payments` with an API key and (optionally) an idempotency key.
    pub fn post_payment(&self, api_key: &str, idempotency_key: Option<&str>, body: &Value) -> RequestBuilder {
        let request = self.client.post(self.url("/v1/payments")).bearer_auth(api_key).json(body);
        match idempotency_key {
            Some(key) => request.header("Idempotency-Key", key),
            None => request,
        }
    }

    /// `GET` with an API key.
    pub fn get(&self, api_key: &str, path: &str) -> RequestBuilder {
        self.client.get(self.url(path)).bearer_auth(api_key)
    }

    /// Every successful charge in the simulator's ledger.
    pub async fn charges(&self) -> Vec<Value> {
        let ledger: Value = self
            .client
            .get(format!("{}_sim/charges", self.sim_url))
            .send()
            .await
            .expect("read the ledger")
            .json()
            .await
            .expect("the ledger is JSON");
        ledger["charges"].as_array().cloned().expect("a charges array")
    }

    /// Charges made for one client idempotency key.
    pub async fn charges_for(&self, idempotency_key: &str) -> Vec<Value> {
        self.charges()
            .await
            .into_iter()
            .filter(|c| c["metadata"]["payonce_idempotency_key"] == idempotency_key)
            .collect()
    }

    /// Replaces the simulator's faults.
    pub async fn set_faults(&self, faults: Value) {
        let response =
            self.client.put(format!("{}_sim/faults", self.sim_url)).json(&faults).send().await.expect("set faults");
        assert_eq!(response.status(), StatusCode::OK, "faults refused: {}", response.text().await.unwrap_or_default());
    }

    /// Stops the server gracefully and waits for it.
    pub async fn stop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(server) = self.server.take() {
            server.await.expect("server task").expect("server stopped cleanly");
        }
    }

    /// The number of rows of a table (for "exactly one payment" assertions).
    pub async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(&format!("select count(*) from {table}")).fetch_one(&self.db).await.unwrap()
    }

    /// Kinds of the events of a key, oldest first (waits briefly for batched observations).
    pub async fn event_kinds(&self, idempotency_key: &str) -> Vec<String> {
        tokio::time::sleep(Duration::from_millis(100)).await;
        sqlx::query_scalar(
            "select e.kind from idempotency_events e join idempotency_keys k on k.id = e.key_id
             where k.key = $1 order by e.id",
        )
        .bind(idempotency_key)
        .fetch_all(&self.db)
        .await
        .unwrap()
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        // Drop the database from a thread of its own: Drop cannot await, and the test's runtime
        // may already be shutting down.
        let database = std::mem::take(&mut self.database);
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let Some(server) = SERVER.get() else { return };
                if let Ok(mut admin) = PgConnection::connect(server).await {
                    let _ = sqlx::query(&format!("drop database if exists {database} with (force)"))
                        .execute(&mut admin)
                        .await;
                }
            });
        })
        .join();
    }
}

/// Reads a response as (status, headers, JSON body).
pub async fn parts(response: Response) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.bytes().await.expect("a body");
    let json = if body.is_empty() { Value::Null } else { serde_json::from_slice(&body).expect("a JSON body") };
    (status, headers, json)
}

/// Asserts that a response is an RFC 9457 problem of the given status and type slug.
pub async fn assert_problem(response: Response, status: StatusCode, slug: &str) -> Value {
    let (got, headers, body) = parts(response).await;
    assert_eq!(got, status, "unexpected status; body: {body}");
    assert_eq!(headers["content-type"], "application/problem+json");
    assert_eq!(body["type"], format!("https://payonce.dev/problems/{slug}"), "body: {body}");
    assert_eq!(body["status"], status.as_u16());
    assert!(body["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(body["detail"].as_str().is_some_and(|d| !d.is_empty()));
    body
}
