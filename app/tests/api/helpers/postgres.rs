//! Where the tests' PostgreSQL server comes from, tried in this order:
//!
//! 1. `DATABASE_URL`, when it is set (CI points it at the machine's PostgreSQL);
//! 2. the zero-config local PostgreSQL under `target/` ([`LocalPostgres`]), when the server
//!    binaries are installed: started on first use and left running for the next run;
//! 3. a PostgreSQL container through testcontainers, when a Docker engine answers (`DOCKER_HOST`,
//!    or the default socket): `app/test-postgres`, a program of its own that this process runs
//!    and holds by a pipe, starts it (its data on a tmpfs) and removes it when this process
//!    exits, however it exits. It is built on first use, so that the tests' build carries
//!    testcontainers' stack only on a machine that needs it (issue 19);
//! 4. otherwise the first test panics with what each of the three said.
//!
//! Test knob: `PAYONCE_TEST_NO_LOCAL_POSTGRES=1` makes step 2 behave as if no binaries were
//! installed, so that the Docker path can be run on a machine that has them (`.ci/testcontainers`).
//! Leftover containers (a helper killed with SIGKILL itself) carry the label `dev.payonce.tests`:
//! `docker rm -f $(docker ps -aq --filter label=dev.payonce.tests)`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use payonce::db::local::{LocalPostgres, LocalPostgresError};

/// The image the Docker fallback runs (set in `app/test-postgres`).
pub const IMAGE: &str = "postgres:16-bookworm";

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
    match tokio::task::spawn_blocking(start_container).await.unwrap_or_else(|err| Err(err.to_string())) {
        Ok(url) => url,
        Err(docker) => panic!(
            "the tests found no PostgreSQL. Tried, in order:\n\
             \x20 1. DATABASE_URL: not set\n\
             \x20 2. the local PostgreSQL server binaries: {local}\n\
             \x20 3. Docker, through testcontainers ({IMAGE}, app/test-postgres): {docker}\n\
             Set DATABASE_URL=postgres://… to a server the tests may create databases on, install \
             PostgreSQL's server binaries (`apt install postgresql`, `brew install postgresql@16`), \
             or start a Docker engine."
        ),
    }
}

/// The container's helper, whose standard input this process holds until it exits.
static RUNNING: Mutex<Option<Child>> = Mutex::new(None);

/// Builds (the first time) and runs `app/test-postgres`, and returns the URL it prints; the
/// container lives until this process exits.
fn start_container() -> Result<String, String> {
    let app = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("test-postgres");
    eprintln!(
        "tests: no DATABASE_URL and no PostgreSQL server binaries: starting PostgreSQL in Docker through \
         app/test-postgres (built on first use, about two minutes)"
    );
    let mut child = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["run", "--locked", "--manifest-path"])
        .arg(app.join("test-postgres/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|err| format!("cannot run cargo for app/test-postgres: {err}"))?;
    let mut line = String::new();
    let stdout = child.stdout.take().expect("a piped stdout");
    let read = BufReader::new(stdout).read_line(&mut line);
    let url = match (read, line.trim_end().split_once(' ')) {
        (Ok(_), Some(("url", url))) => url.to_owned(),
        (Ok(_), Some(("error", error))) => return Err(finish(child, error.to_owned())),
        (read, _) => {
            let said = read.err().map_or_else(|| format!("{line:?}"), |err| err.to_string());
            return Err(finish(child, format!("app/test-postgres did not say where PostgreSQL is ({said})")));
        }
    };
    *RUNNING.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
    // SAFETY: atexit(3) takes any `extern "C" fn()`. `remove_at_exit` cannot panic (a poisoned
    // lock is taken as is, errors are ignored), so nothing unwinds into libc.
    let registered = unsafe { libc::atexit(remove_at_exit) };
    if registered != 0 {
        eprintln!("could not register the exit hook: the container goes when this process's pipe closes");
    }
    eprintln!("tests: PostgreSQL in a Docker container ({IMAGE}) at {url}");
    Ok(url)
}

/// `error`, once the helper that said it has exited (it removes what it started).
fn finish(child: Child, error: String) -> String {
    close(child);
    error
}

/// How long the exit hook waits for the removal. The vfs storage driver (CI's) deletes a copy of
/// the whole image: 6 s on a quiet machine, well over 30 s with builds running beside it.
const REMOVAL_WAIT: Duration = Duration::from_secs(120);

/// Runs when the test process exits: closes the helper's standard input, which removes the
/// container, and waits for it at most [`REMOVAL_WAIT`], so that whoever ran the tests finds no
/// container left. Without the hook (or past the wait), the helper still removes it on its own.
extern "C" fn remove_at_exit() {
    if let Some(child) = RUNNING.lock().unwrap_or_else(|e| e.into_inner()).take() {
        close(child);
    }
}

/// Closes the helper's standard input, which tells it to remove its container (if it started
/// one) and exit, and waits for that at most [`REMOVAL_WAIT`]. Cannot panic.
fn close(mut child: Child) {
    drop(child.stdin.take());
    let deadline = Instant::now() + REMOVAL_WAIT;
    while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}
