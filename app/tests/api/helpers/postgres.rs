//! Where the tests' PostgreSQL server comes from, tried in this order:
//!
//! 1. `DATABASE_URL`, when it is set (CI points it at the machine's PostgreSQL);
//! 2. the zero-config local PostgreSQL under `target/` ([`LocalPostgres`]), when the server
//!    binaries are installed: started on first use and left running for the next run;
//! 3. a PostgreSQL container through testcontainers ([`IMAGE_NAME`]:[`IMAGE_TAG`]), when a Docker
//!    engine answers (`DOCKER_HOST`, or the default socket): one container per test process, its
//!    data on a tmpfs, removed when the process exits, reached where it answers
//!    ([`reachable_host`]);
//! 4. otherwise the first test panics with what each of the three said.
//!
//! Test knob: `PAYONCE_TEST_NO_LOCAL_POSTGRES=1` makes step 2 behave as if no binaries were
//! installed, so that the Docker path can be run on a machine that has them (`.ci/testcontainers`).
//! A process killed before it exits (SIGKILL, Ctrl-C) leaves its container behind; remove such
//! leftovers with `docker rm -f $(docker ps -aq --filter label=dev.payonce.tests)`.

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::Duration;

use payonce::db::local::{LocalPostgres, LocalPostgresError};
use testcontainers_modules::postgres::Postgres;
use testcontainers_modules::testcontainers::core::Mount;
use testcontainers_modules::testcontainers::runners::AsyncRunner;
use testcontainers_modules::testcontainers::{ContainerRequest, ImageExt};
use tokio::sync::oneshot;

/// The image the Docker fallback runs; the stand-in built where no registry answers
/// (docker/standins/build) carries the same name and tag.
pub const IMAGE_NAME: &str = "postgres";
pub const IMAGE_TAG: &str = "16-bookworm";

/// The environment variable that hides the local server binaries from step 2.
pub const NO_LOCAL_POSTGRES: &str = "PAYONCE_TEST_NO_LOCAL_POSTGRES";

/// The URL of a PostgreSQL server to create test databases on (any database of it), found as
/// the module documentation says. Called once per test process.
pub async fn find_server() -> String {
    if let Ok(url) = std::env::var("DATABASE_URL")
        && !url.is_empty()
    {
        return url;
    }
    let local = if std::env::var_os(NO_LOCAL_POSTGRES).is_some_and(|v| !v.is_empty() && v != "0") {
        format!("skipped ({NO_LOCAL_POSTGRES} is set)")
    } else {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("postgres");
        match LocalPostgres::start(&dir).await {
            // The handle is not stopped: the server keeps running for the next test run to reuse.
            Ok(local) => return local.url("postgres"),
            Err(err @ LocalPostgresError::NotInstalled { .. }) => err.to_string(),
            // Binaries exist but the cluster would not start: that is a problem to fix, not a
            // reason to quietly test against something else.
            Err(err) => panic!("no DATABASE_URL; the local PostgreSQL in {} did not start: {err}", dir.display()),
        }
    };
    match start_container().await {
        Ok(url) => url,
        Err(docker) => panic!(
            "the tests found no PostgreSQL. Tried, in order:\n\
             \x20 1. DATABASE_URL: not set\n\
             \x20 2. the local PostgreSQL server binaries: {local}\n\
             \x20 3. Docker, through testcontainers ({IMAGE_NAME}:{IMAGE_TAG}): {docker}\n\
             Set DATABASE_URL=postgres://… to a server the tests may create databases on, install \
             PostgreSQL's server binaries (`apt install postgresql`, `brew install postgresql@16`), \
             or start a Docker engine."
        ),
    }
}

/// The container, as testcontainers is asked for it.
fn request() -> ContainerRequest<Postgres> {
    Postgres::default()
        .with_host_auth()
        .with_tag(IMAGE_TAG)
        // The tests run in parallel, each with pools of its own: more than the default 100.
        // fsync off, as the module's default command has it (with_cmd replaces that command).
        .with_cmd(["-c", "fsync=off", "-c", "max_connections=400"])
        .with_mount(Mount::tmpfs_mount("/var/lib/postgresql/data"))
        .with_label("dev.payonce.tests", std::process::id().to_string())
        .with_startup_timeout(Duration::from_secs(120))
}

/// The running container's owner thread, told to remove it when the process exits.
struct Running {
    /// Dropping it tells the owner thread to remove the container.
    stop: mpsc::Sender<()>,
    /// Answers once the container is removed.
    removed: mpsc::Receiver<()>,
}

static RUNNING: Mutex<Option<Running>> = Mutex::new(None);

/// Starts the container and returns its URL; the container lives until the process exits.
///
/// Each `#[tokio::test]` has a runtime of its own that ends with the test, and the test statics
/// that would hold a container are never dropped. So a thread with its own runtime owns the
/// container for the whole process, and an exit hook asks it to remove the container.
async fn start_container() -> Result<String, String> {
    let (ready_tx, ready_rx) = oneshot::channel();
    let (stop, stop_rx) = mpsc::channel::<()>();
    let (removed_tx, removed) = mpsc::channel();
    std::thread::Builder::new()
        .name("test-postgres-container".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            let container = match runtime.block_on(request().start()) {
                Ok(container) => container,
                Err(err) => {
                    let _ = ready_tx.send(Err(err.to_string()));
                    return;
                }
            };
            let url = runtime.block_on(async {
                let named = container.get_host().await.map_err(|e| e.to_string())?.to_string();
                let port = container.get_host_port_ipv4(5432).await.map_err(|e| e.to_string())?;
                let host = reachable_host(named, port).await?;
                Ok(format!("postgres://postgres@{host}:{port}/postgres"))
            });
            let _ = ready_tx.send(url);
            // Until the exit hook drops the sender (or the process ends first).
            let _ = stop_rx.recv();
            let id = container.id().to_owned();
            if let Err(err) = runtime.block_on(container.rm()) {
                // Not eprintln!, which panics when the exiting process's stderr is gone.
                let _ = writeln!(std::io::stderr(), "tests: could not remove the PostgreSQL container {id}: {err}");
            }
            let _ = removed_tx.send(());
        })
        .map_err(|e| format!("cannot start a thread: {e}"))?;
    let url = ready_rx.await.map_err(|_| "the container's thread died".to_owned())??;

    *RUNNING.lock().unwrap_or_else(|e| e.into_inner()) = Some(Running { stop, removed });
    // SAFETY: atexit(3) takes any `extern "C" fn()`. `remove_at_exit` cannot panic (a poisoned
    // lock is taken as is, channel errors are ignored), so nothing unwinds into libc.
    let registered = unsafe { libc::atexit(remove_at_exit) };
    if registered != 0 {
        eprintln!("could not register the exit hook: the test PostgreSQL container will outlive this run");
    }
    eprintln!("tests: PostgreSQL in a Docker container ({IMAGE_NAME}:{IMAGE_TAG}) at {url}");
    Ok(url)
}

/// The host that reaches the container's published `port`: the one testcontainers names, else
/// loopback.
///
/// When `/.dockerenv` exists, testcontainers assumes the tests run in a sibling container and
/// names the bridge network's gateway (172.17.0.1). On a machine that is itself a container and
/// runs its own engine (CI's, where `.ci/docker-engine` publishes ports on 127.0.0.1 only), that
/// address refuses the connection, while loopback answers.
async fn reachable_host(named: String, port: u16) -> Result<String, String> {
    let mut refused = Vec::new();
    for host in [named.as_str(), "127.0.0.1"] {
        let connect = tokio::net::TcpStream::connect((host, port));
        match tokio::time::timeout(Duration::from_secs(5), connect).await {
            Ok(Ok(_)) => return Ok(host.to_owned()),
            Ok(Err(err)) => refused.push(format!("{host}:{port}: {err}")),
            Err(_) => refused.push(format!("{host}:{port}: no answer within 5 s")),
        }
    }
    Err(format!("the container's port is not reachable ({})", refused.join("; ")))
}

/// How long the exit hook waits for the removal. The vfs storage driver (CI's) deletes a copy of
/// the whole image: 6 s on a quiet machine, well over 30 s with builds running beside it.
const REMOVAL_WAIT: Duration = Duration::from_secs(120);

/// Runs when the test process exits: removes the container and waits until it is, at most
/// [`REMOVAL_WAIT`].
extern "C" fn remove_at_exit() {
    let running = RUNNING.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(Running { stop, removed }) = running {
        drop(stop);
        if removed.recv_timeout(REMOVAL_WAIT).is_err() {
            // Not eprintln!, which panics when stderr is gone: nothing may unwind into libc.
            let _ = writeln!(
                std::io::stderr(),
                "tests: the PostgreSQL container was not removed within {} s",
                REMOVAL_WAIT.as_secs()
            );
        }
    }
}
