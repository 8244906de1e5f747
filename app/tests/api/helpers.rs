//! The test harness: a real payonce server on a free port, against its own fresh PostgreSQL
//! database and its own Stripe simulator, driven over HTTP.
//!
//! The database server is `DATABASE_URL` when it is set (CI points it at the machine's
//! PostgreSQL), otherwise the zero-config local PostgreSQL under `target/` (started on first use
//! and left running for the next run), otherwise a PostgreSQL container through testcontainers:
//! see [`postgres`]. Every test gets a database of its own, dropped afterwards.
//!
//! Pieces, from small to large: [`TestDatabase`] (one fresh database), [`Ledger`] (the simulator's
//! controls over HTTP), [`ServerProcess`] (a real `payonce serve` process, for crash tests) and
//! [`TestApp`] (an in-process server with all of the above).

pub mod postgres;

use std::io::BufRead;
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use payonce::config::{DatabaseConfig, GatewayConfig, Secret, ServeConfig, StripeConfig};
use payonce::gateway::Gateway;
use payonce::idempotency::{Backoff, Budget, Engine, EngineSettings, EventLog, Horizon};
use payonce::server::Server;
use payonce::simulator::{self, RunningSimulator};
use payonce::sweeper::{Sweeper, SweeperSettings};
use reqwest::{RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::{OnceCell, mpsc, oneshot};
use uuid::Uuid;

/// The secret key tests give payonce for their simulator.
pub const SIM_SECRET_KEY: &str = "sk_test_payonce";

/// A valid payment body.
pub fn payment(amount: i64) -> Value {
    json!({"amount": amount, "currency": "usd", "payment_method": "pm_card_visa"})
}

/// A fresh idempotency key.
pub fn new_key() -> String {
    Uuid::now_v7().to_string()
}

/// The URL of the PostgreSQL server that test databases are created on.
static SERVER: OnceCell<String> = OnceCell::const_new();

async fn database_server() -> &'static str {
    SERVER.get_or_init(postgres::find_server).await
}

/// `url` with its database path replaced by `name`.
pub fn url_with_database(url: &str, name: &str) -> String {
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

/// The migrated database that [`TestDatabase::create`] copies, made once per day and migration
/// set on each server (see [`migrated_template`]).
static TEMPLATE: OnceCell<String> = OnceCell::const_new();

/// The name of a database on `server` that holds payonce's schema, migrated once and then copied
/// for every test (`CREATE DATABASE … TEMPLATE`, ~0.15 s) instead of each test's server running
/// the migrations on an empty one (~2 s). On two cores, ~200 tests paying that each made the API
/// tests 147 s and 283 CPU-seconds (PostgreSQL's 134); copied, 101–115 s and 209 (81): issue 19.
/// The name carries a hash of the migrations and today's date, so a changed migration, or a
/// history table's days ahead made on another day, gets a template of its own; older ones are
/// dropped when a new one is made. An advisory lock makes concurrent test processes build it
/// once.
async fn migrated_template(server: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut hash = std::collections::hash_map::DefaultHasher::new();
    for migration in payonce::db::MIGRATOR.iter() {
        (migration.version, &migration.checksum[..]).hash(&mut hash);
    }
    let prefix = "payonce_test_template_";
    let day = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() / 86_400;
    let name = format!("{prefix}{:016x}_{day}", hash.finish());
    let mut admin = PgConnection::connect(server).await.expect("connect to the test PostgreSQL");
    sqlx::query("select pg_advisory_lock(hashtext($1))").bind(prefix).execute(&mut admin).await.unwrap();
    let exists: bool = sqlx::query_scalar("select exists (select from pg_database where datname = $1)")
        .bind(&name)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    if !exists {
        let building = format!("{prefix}building");
        sqlx::query(&format!("drop database if exists {building} with (force)")).execute(&mut admin).await.unwrap();
        sqlx::query(&format!("create database {building}")).execute(&mut admin).await.unwrap();
        let mut conn = PgConnection::connect(&url_with_database(server, &building)).await.unwrap();
        payonce::db::MIGRATOR.run(&mut conn).await.expect("migrate the test template");
        payonce::retention::add_days_ahead(&mut conn).await.expect("the template's days ahead");
        conn.close().await.unwrap();
        sqlx::query(&format!("alter database {building} rename to {name}")).execute(&mut admin).await.unwrap();
        let old: Vec<String> =
            sqlx::query_scalar("select datname from pg_database where datname like $1 || '%' and datname <> $2")
                .bind(prefix)
                .bind(&name)
                .fetch_all(&mut admin)
                .await
                .unwrap();
        for old in old {
            // Another process may still be copying it; it is dropped next time then.
            let _ = sqlx::query(&format!("drop database if exists {old}")).execute(&mut admin).await;
        }
    }
    sqlx::query("select pg_advisory_unlock(hashtext($1))").bind(prefix).execute(&mut admin).await.unwrap();
    let _ = admin.close().await;
    name
}

/// One fresh database, dropped when this value is.
pub struct TestDatabase {
    /// Its URL (`…/payonce_test_<uuid>`).
    pub url: String,
    /// A pool on it, for asserting on rows.
    pub pool: PgPool,
    /// The server's URL, for dropping the database.
    server: String,
    name: String,
}

impl TestDatabase {
    /// A database on the tests' PostgreSQL server, already migrated (a copy of
    /// [`migrated_template`]).
    pub async fn create() -> Self {
        let server = database_server().await;
        let template = TEMPLATE.get_or_init(|| migrated_template(server)).await;
        Self::copy_of(server, template, false).await
    }

    /// An empty database on the PostgreSQL server at `server` (any database URL of that server).
    pub async fn create_on(server: &str) -> Self {
        Self::copy_of(server, "template1", false).await
    }

    /// A new database on `server` copied from `template`. PostgreSQL copies only a database
    /// nobody is connected to: with `end_sessions`, every session on it is ended first (a running
    /// server's pool reconnects by itself); a session that connects in between makes it try again.
    async fn copy_of(server: &str, template: &str, end_sessions: bool) -> Self {
        let name = format!("payonce_test_{}", Uuid::new_v4().simple());
        let mut admin = PgConnection::connect(server).await.expect("connect to the test PostgreSQL");
        for attempt in 0.. {
            if end_sessions {
                sqlx::query(
                    "select pg_terminate_backend(pid) from pg_stat_activity where datname = $1 and pid <> pg_backend_pid()",
                )
                .bind(template)
                .execute(&mut admin)
                .await
                .expect("end the sessions on the database");
            }
            match sqlx::query(&format!("create database {name} template {template}")).execute(&mut admin).await {
                Ok(_) => break,
                // 55006: the source database is being accessed by other users.
                Err(sqlx::Error::Database(err)) if err.code().as_deref() == Some("55006") && attempt < 50 => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(err) => panic!("create the test database from {template}: {err}"),
            }
        }
        let url = url_with_database(server, &name);
        let pool = PgPool::connect(&url).await.expect("connect to the test database");
        Self { url, pool, server: server.to_owned(), name }
    }

    /// Its name on the server.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A copy of this database as it is now (`CREATE DATABASE … TEMPLATE`): a backup to restore
    /// later, by starting a server on the copy. PostgreSQL copies only a database nobody is
    /// connected to, so every other session on it is ended first (a running server's pool
    /// reconnects by itself); a session that reconnects in between makes it try again.
    pub async fn snapshot(&self) -> TestDatabase {
        TestDatabase::copy_of(&self.server, &self.name, true).await
    }

    /// Creates a customer through the library, as `payonce customers create` does; returns its key.
    /// The database must be migrated (a server started on it does that).
    pub async fn customer(&self, name: &str) -> String {
        let (_, key) = payonce::customers::create(&self.pool, name).await.expect("create a customer");
        key.expose().to_owned()
    }

    /// The number of rows of a table.
    pub async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(&format!("select count(*) from {table}")).fetch_one(&self.pool).await.unwrap()
    }

    /// The state of a client key's row: (state, recovery point, lease token, attempts).
    pub async fn key_state(&self, key: &str) -> Option<(String, String, i64, i32)> {
        sqlx::query_as("select state, recovery_point, lease_token, attempts from idempotency_keys where key = $1")
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .unwrap()
    }

    /// Kinds of the events of a key, oldest first (waits briefly for batched observations).
    pub async fn event_kinds(&self, idempotency_key: &str) -> Vec<String> {
        tokio::time::sleep(Duration::from_millis(100)).await;
        sqlx::query_scalar(
            "select e.kind from idempotency_events e join idempotency_keys k on k.id = e.key_id
             where k.key = $1 order by e.id",
        )
        .bind(idempotency_key)
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }

    /// Waits until the key is final, or panics after `deadline`. Returns how long it took.
    pub async fn wait_until_final(&self, key: &str, deadline: Duration) -> Duration {
        let started = Instant::now();
        loop {
            if let Some((state, ..)) = self.key_state(key).await
                && state != "processing"
            {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < deadline,
                "key {key} still not final after {deadline:?}: {:?}",
                self.key_state(key).await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// An engine and a sweeper of our own on this database, charging through `sim_url`: a second
    /// worker racing the server's, with the engine `settings` (its budget and horizon).
    pub fn sweeper(&self, sim_url: &str, owner: &str, settings: EngineSettings) -> Sweeper {
        self.sweeper_with(sim_url, owner, settings, Duration::from_secs(10))
    }

    /// [`Self::sweeper`] with another gateway timeout.
    pub fn sweeper_with(&self, sim_url: &str, owner: &str, settings: EngineSettings, timeout: Duration) -> Sweeper {
        self.sweeper_paced(sim_url, owner, settings, timeout, SweeperSettings::default())
    }

    /// [`Self::sweeper_with`] with the sweeper's own settings too (its interval, its reaping rate).
    pub fn sweeper_paced(
        &self,
        sim_url: &str,
        owner: &str,
        settings: EngineSettings,
        timeout: Duration,
        sweeping: SweeperSettings,
    ) -> Sweeper {
        let (events, _writer) = EventLog::spawn(self.pool.clone());
        let engine = Engine::new(self.pool.clone(), settings, events);
        let gateway = Gateway::new(SIM_SECRET_KEY, Some(sim_url), timeout).expect("a gateway");
        Sweeper::new(engine, gateway, sweeping, owner.to_owned())
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // From a thread of its own: Drop cannot await, and the test's runtime may be shutting down.
        let (server, name) = (self.server.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                if let Ok(mut admin) = PgConnection::connect(&server).await {
                    let _ =
                        sqlx::query(&format!("drop database if exists {name} with (force)")).execute(&mut admin).await;
                }
            });
        })
        .join();
    }
}

/// The simulator's control endpoints, over HTTP, as a load test would use them.
#[derive(Clone)]
pub struct Ledger {
    client: reqwest::Client,
    /// The simulator's base URL (`http://…/`).
    pub sim_url: String,
}

impl Ledger {
    pub fn new(sim_url: &str) -> Self {
        Self { client: reqwest::Client::new(), sim_url: sim_url.to_owned() }
    }

    /// Every successful charge.
    pub async fn charges(&self) -> Vec<Value> {
        self.list("charges").await
    }

    /// Every refund the gateway made (money that moved back).
    pub async fn refunds(&self) -> Vec<Value> {
        self.list("refunds").await
    }

    /// `GET /_sim/<what>`: its `<what>` array.
    async fn list(&self, what: &str) -> Vec<Value> {
        let ledger: Value = self
            .client
            .get(format!("{}_sim/{what}", self.sim_url))
            .send()
            .await
            .expect("read the ledger")
            .json()
            .await
            .expect("the ledger is JSON");
        ledger[what].as_array().cloned().unwrap_or_else(|| panic!("a {what} array: {ledger}"))
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

    /// Replaces the simulator's settings (`processing_ms`, the webhook delivery policy).
    pub async fn set_settings(&self, settings: Value) {
        let response = self
            .client
            .put(format!("{}_sim/settings", self.sim_url))
            .json(&settings)
            .send()
            .await
            .expect("set settings");
        assert_eq!(
            response.status(),
            StatusCode::OK,
            "settings refused: {}",
            response.text().await.unwrap_or_default()
        );
    }

    /// A control call: `POST /_sim/{path}` with a JSON body; returns the JSON answer.
    pub async fn control(&self, path: &str, body: Value) -> Value {
        let response =
            self.client.post(format!("{}_sim/{path}", self.sim_url)).json(&body).send().await.expect("control call");
        assert_eq!(response.status(), StatusCode::OK, "{path}: {}", response.text().await.unwrap_or_default());
        response.json().await.expect("JSON")
    }

    /// Every event the simulator emitted, with its deliveries.
    pub async fn events(&self) -> Vec<Value> {
        let events: Value =
            self.client.get(format!("{}_sim/events", self.sim_url)).send().await.unwrap().json().await.unwrap();
        events["events"].as_array().cloned().expect("an events array")
    }
}

/// A free TCP port on 127.0.0.1, right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A real `payonce serve` process, for tests that kill it. Killed when dropped.
pub struct ServerProcess {
    child: Child,
    pub addr: SocketAddr,
    /// Lines the process writes to stderr.
    stderr: mpsc::UnboundedReceiver<String>,
}

impl ServerProcess {
    /// Starts `payonce serve` on a free port against `database_url`, charging through the
    /// simulator at `sim_url`, with extra environment `env`; returns once it is ready.
    pub async fn start(database_url: &str, sim_url: &str, env: &[(&str, &str)]) -> Self {
        Self::start_with_fd_limit(database_url, sim_url, env, None).await
    }

    /// [`ServerProcess::start`], with the process's file-descriptor limit (soft and hard
    /// `RLIMIT_NOFILE`) set to `fd_limit`, as `ulimit -n` would.
    pub async fn start_with_fd_limit(
        database_url: &str,
        sim_url: &str,
        env: &[(&str, &str)],
        fd_limit: Option<u64>,
    ) -> Self {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_payonce"));
        if let Some(limit) = fd_limit {
            use std::os::unix::process::CommandExt;
            let limit = libc::rlimit { rlim_cur: limit, rlim_max: limit };
            // SAFETY: between fork and exec only async-signal-safe calls are allowed; setrlimit is one.
            unsafe {
                command.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        let mut child = command
            .arg("serve")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("PAYONCE_ADDR", addr.to_string())
            .env("DATABASE_URL", database_url)
            .env("STRIPE_SECRET_KEY", SIM_SECRET_KEY)
            .env("STRIPE_API_BASE", sim_url)
            .env("RUST_LOG", "info,payonce=debug")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start payonce");
        let (lines, stderr) = mpsc::unbounded_channel();
        let pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let mut server = Self { child, addr, stderr };
        server.wait_until_ready().await;
        server
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The process's peak resident memory so far (`VmHWM` in `/proc/<pid>/status`), in KiB.
    pub fn peak_memory_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("read the status");
        let line = status.lines().find(|line| line.starts_with("VmHWM:")).expect("a VmHWM line");
        line.split_whitespace().nth(1).and_then(|kib| kib.parse().ok()).expect("VmHWM in kB")
    }

    /// The stderr lines written so far.
    pub fn lines(&mut self) -> Vec<String> {
        self.drain()
    }

    async fn wait_until_ready(&mut self) {
        let client = reqwest::Client::new();
        let started = Instant::now();
        loop {
            if let Ok(response) = client.get(self.url("/readyz")).send().await
                && response.status() == StatusCode::OK
            {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("payonce exited during startup ({status}): {}", self.drain().join("\n"));
            }
            assert!(started.elapsed() < Duration::from_secs(30), "payonce not ready: {}", self.drain().join("\n"));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the process writes a stderr line containing `needle`.
    pub async fn wait_for_line(&mut self, needle: &str, deadline: Duration) {
        let found = tokio::time::timeout(deadline, async {
            while let Some(line) = self.stderr.recv().await {
                if line.contains(needle) {
                    return true;
                }
            }
            false
        })
        .await;
        assert_eq!(found, Ok(true), "payonce never wrote {needle:?}");
    }

    /// SIGTERM, as `docker stop` or a service manager sends it; the process's exit status once it
    /// has stopped, or `None` if it is still running after `deadline`.
    pub async fn terminate(&mut self, deadline: Duration) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let started = Instant::now();
        while started.elapsed() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// `kill -9`: no shutdown, no cleanup, exactly like a crash.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn drain(&mut self) -> Vec<String> {
        std::iter::from_fn(|| self.stderr.try_recv().ok()).collect()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Knobs a test may turn before the server starts.
pub struct Options {
    pub lease: Duration,
    pub key_ttl: Duration,
    pub gateway_timeout: Duration,
    /// Use the built-in simulator instead of the test's own (as `payonce serve` does without keys).
    pub builtin_simulator: bool,
    /// Charge through this base URL (`http://…/`) instead of a simulator of the test's own: a
    /// gateway the test runs itself (the conformance test's recording proxy in front of one).
    /// The simulator controls ([`Ledger`]) go there too.
    pub stripe_api_base: Option<String>,
    /// The in-server sweeper's settings. By default its first pass comes an hour in (a sweeper
    /// passes an interval after it starts), so that it cannot race a test that is not about it.
    /// It used to pass once at startup: a startup pass that a loaded machine delayed took over a
    /// key the test had just seen released, and the test's own retry got a replay.
    pub sweeper: SweeperSettings,
    /// Another PostgreSQL server than the tests' shared one.
    pub database_server: Option<String>,
    /// `PAYONCE_READ_REPLICA_URL`: a database the dashboard reads from.
    pub read_replica: Option<String>,
    /// Mount the benchmark-only routes.
    pub bench_routes: bool,
    /// The retry budget. By default no backoff at all ([`no_backoff`]), so that tests not about
    /// timing may retry at once; the budget tests set their own.
    pub budget: Budget,
    pub horizon: Horizon,
    /// `STRIPE_WEBHOOK_SECRET`.
    pub webhook_secret: Option<String>,
    /// The secret key payonce gives the gateway (the simulator accepts any `sk_…`).
    pub stripe_secret_key: &'static str,
    /// The HTML side's settings (idle sign-out, workshop mode).
    pub web: payonce::config::WebConfig,
    /// The claim strategy and lab mode.
    pub lab: payonce::lab::LabSettings,
}

/// The budget with production's `max_attempts` and no waiting between attempts.
pub fn no_backoff() -> Budget {
    Budget { backoff: Backoff { base: Duration::ZERO, cap: Duration::ZERO }, ..Budget::default() }
}

impl Default for Options {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(60),
            key_ttl: Duration::from_secs(86_400),
            gateway_timeout: Duration::from_secs(10),
            builtin_simulator: false,
            stripe_api_base: None,
            sweeper: SweeperSettings { interval: Duration::from_secs(3600), ..SweeperSettings::default() },
            database_server: None,
            read_replica: None,
            bench_routes: false,
            budget: no_backoff(),
            horizon: Horizon::default(),
            webhook_secret: None,
            stripe_secret_key: SIM_SECRET_KEY,
            web: Default::default(),
            lab: Default::default(),
        }
    }
}

/// One running payonce and everything around it.
pub struct TestApp {
    pub addr: SocketAddr,
    pub client: reqwest::Client,
    /// A direct pool on the test database, for asserting on rows.
    pub db: PgPool,
    pub database: TestDatabase,
    /// The simulator's controls.
    pub ledger: Ledger,
    /// The simulator's base URL (`http://…/`).
    pub sim_url: String,
    _sim: Option<RunningSimulator>,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl TestApp {
    pub async fn spawn() -> Self {
        Self::spawn_with(Options::default()).await
    }

    pub async fn spawn_with(options: Options) -> Self {
        let database = match &options.database_server {
            Some(server) => TestDatabase::create_on(server).await,
            None => TestDatabase::create().await,
        };
        let sim = if options.builtin_simulator || options.stripe_api_base.is_some() {
            None
        } else {
            Some(simulator::start("127.0.0.1:0".parse().unwrap()).await.expect("start the simulator"))
        };
        let config = ServeConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            database: DatabaseConfig {
                url: Some(Secret::new(database.url.clone())),
                local_dir: ".payonce".into(),
                pool_size: 10,
                statement_timeout: Duration::from_secs(5),
                lock_timeout: Duration::from_secs(2),
                read_replica_url: options.read_replica.map(Secret::new),
            },
            engine: EngineSettings {
                lease: options.lease,
                key_ttl: options.key_ttl,
                budget: options.budget,
                horizon: options.horizon,
                gateway_timeout: options.gateway_timeout,
            },
            gateway: GatewayConfig {
                stripe: sim.as_ref().map(RunningSimulator::base_url).or(options.stripe_api_base.clone()).map(|base| {
                    StripeConfig { secret_key: Secret::new(options.stripe_secret_key), api_base: Some(base) }
                }),
                simulator_addr: "127.0.0.1:0".parse().unwrap(),
                timeout: options.gateway_timeout,
                webhook_secret: options.webhook_secret.map(Secret::new),
            },
            sweeper: options.sweeper,
            bench_routes: options.bench_routes,
            web: options.web,
            admin_only: false,
            http: Default::default(),
            lab: options.lab,
        };
        let server = Server::start(config).await.expect("start payonce");
        let addr = server.local_addr();
        let sim_url = match (&sim, options.stripe_api_base) {
            (Some(sim), _) => sim.base_url(),
            (None, Some(base)) => base,
            (None, None) => server.simulator_url().expect("the built-in simulator runs"),
        };
        let (shutdown, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        Self {
            addr,
            client: reqwest::Client::new(),
            db: database.pool.clone(),
            database,
            ledger: Ledger::new(&sim_url),
            sim_url,
            _sim: sim,
            shutdown: Some(shutdown),
            server: Some(server),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Creates a customer; returns its API key.
    pub async fn customer(&self, name: &str) -> String {
        self.database.customer(name).await
    }

    /// `POST /v1/payments` with an API key and (optionally) an idempotency key.
    pub fn post_payment(&self, api_key: &str, idempotency_key: Option<&str>, body: &Value) -> RequestBuilder {
        let request = self.client.post(self.url("/v1/payments")).bearer_auth(api_key).json(body);
        match idempotency_key {
            Some(key) => request.header("Idempotency-Key", key),
            None => request,
        }
    }

    /// `POST /v1/refunds` with an API key and (optionally) an idempotency key.
    pub fn post_refund(&self, api_key: &str, idempotency_key: Option<&str>, body: &Value) -> RequestBuilder {
        let request = self.client.post(self.url("/v1/refunds")).bearer_auth(api_key).json(body);
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
        self.ledger.charges().await
    }

    /// Charges made for one client idempotency key.
    pub async fn charges_for(&self, idempotency_key: &str) -> Vec<Value> {
        self.ledger.charges_for(idempotency_key).await
    }

    /// Replaces the simulator's faults.
    pub async fn set_faults(&self, faults: Value) {
        self.ledger.set_faults(faults).await
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
        self.database.count(table).await
    }

    /// Kinds of the events of a key, oldest first.
    pub async fn event_kinds(&self, idempotency_key: &str) -> Vec<String> {
        self.database.event_kinds(idempotency_key).await
    }

    /// Kinds of the events of a key once `done` says they are all there, or after 5 s: for the
    /// batched observations (replayed, conflict, mismatch), which a busy machine writes later than
    /// [`TestDatabase::event_kinds`]' pause.
    pub async fn event_kinds_once(&self, idempotency_key: &str, done: impl Fn(&[String]) -> bool) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let kinds = self.event_kinds(idempotency_key).await;
            if done(&kinds) || Instant::now() > deadline {
                return kinds;
            }
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
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

/// The value of a hidden field of a page (the CSRF token, the checkout's key, …).
pub fn field(html: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let start = html.find(&marker).unwrap_or_else(|| panic!("no {name} field in:\n{html}")) + marker.len();
    html[start..start + html[start..].find('"').unwrap()].to_owned()
}

/// A browser-like client for the HTML pages: keeps cookies, does not follow redirects (the
/// tests look at them).
pub fn browser_client() -> reqwest::Client {
    reqwest::Client::builder().cookie_store(true).redirect(reqwest::redirect::Policy::none()).build().unwrap()
}
