//! The zero-config local PostgreSQL: with no `DATABASE_URL`, `payonce serve` and the test harness
//! run a private cluster from the PostgreSQL binaries installed on the machine.
//!
//! [`LocalPostgres::start`] finds `initdb` and `pg_ctl`, initialises the data directory the first
//! time, starts the server on a free port of 127.0.0.1 and waits until it answers a query. The
//! port is remembered in the cluster (`ALTER SYSTEM SET port`, in `postgresql.auto.conf`) and
//! taken again at the next start while it is free, so a URL stays valid across restarts and a
//! plain `pg_ctl start -D <dir>` starts the server where its clients expect it. If a
//! server from the same folder is already running, it is reused instead: test runs share one
//! cluster, and two processes starting at once end up with one server.
//! [`LocalPostgres::stop`] stops the server if, and only if, that handle started it.
//!
//! # A development cluster, not a production one
//!
//! - It listens on 127.0.0.1 over TCP only. Unix sockets are off: a socket path is limited to about
//!   107 bytes, which a deep working directory would exceed, and sqlx connects over TCP anyway.
//! - The `postgres` superuser logs in with `trust` (no password). Anyone who can open a TCP
//!   connection to 127.0.0.1 on this machine can use the cluster, so keep it to developer machines
//!   and CI.
//! - `fsync` and `synchronous_commit` keep PostgreSQL's defaults (on): the crash tests kill processes
//!   and expect committed work to survive. Only `initdb` runs with `--no-sync`, which saves about a
//!   second: a machine that loses power in the second after a cluster was created can leave a
//!   broken cluster (delete the folder to start over). A killed process cannot.
//! - C locale and UTF-8, so sorting and messages do not depend on the developer's machine.
//! - The server log is `<dir>/server.log`.
//!
//! # Layout on disk
//!
//! For `start(Path::new("./.payonce/postgres"))`:
//!
//! ```text
//! .payonce/postgres/              the cluster (PG_VERSION, postgresql.conf, server.log, …)
//! .payonce/postgres.lock          the advisory lock that serialises start, reuse and stop
//! .payonce/postgres.initdb-tmp/   exists only while `initdb` runs; renamed to postgres/ when done
//! ```
//!
//! Initialisation is atomic: `initdb` fills the temporary sibling, which is renamed into place only
//! once complete, so a crash half-way through never leaves a half cluster behind.
//!
//! # Several processes, one folder
//!
//! Start, reuse detection and stop happen while holding an exclusive advisory lock on
//! `<dir>.lock` (`flock`, released by the kernel if the process dies). The first process initialises
//! and starts the server; the next ones find `postmaster.pid`, connect to the port it names, check
//! that the server answering there really serves this folder, and reuse it.
//!
//! # Running as root
//!
//! PostgreSQL refuses to run as root. When payonce runs as root (containers, CI), `initdb` and
//! `pg_ctl` run as the owner of the existing cluster or, for a new one, as the `postgres` system
//! user, with no supplementary groups. That user must be able to traverse every parent folder of
//! the data directory; [`LocalPostgresError::NotReachable`] says which one it cannot.
//!
//! # No `Drop`
//!
//! Dropping a [`LocalPostgres`] leaves the server running: stopping one means running `pg_ctl` and
//! waiting for it, which `Drop` cannot do well inside an async runtime, and the test harness wants
//! the server to outlive the process so the next run can reuse it. The caller decides: `serve`
//! calls [`LocalPostgres::stop`] on shutdown, the tests do not.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::{ConnectOptions, Connection};

/// Where PostgreSQL's server programs usually live when they are not on `PATH`. A `*` stands for a
/// version; the highest version is tried first.
const SEARCH_PLACES: &[&str] = &[
    "/usr/lib/postgresql/*/bin",          // Debian, Ubuntu
    "/usr/pgsql-*/bin",                   // RHEL, Fedora (PGDG packages)
    "/usr/local/pgsql/bin",               // built from source
    "/opt/homebrew/opt/postgresql@*/bin", // Homebrew on Apple silicon
    "/usr/local/opt/postgresql@*/bin",    // Homebrew on Intel
    "/opt/homebrew/bin",
    "/Applications/Postgres.app/Contents/Versions/latest/bin",
];

/// The superuser `initdb` creates, and the user in every URL.
const SUPERUSER: &str = "postgres";

/// The system account that runs PostgreSQL when payonce runs as root.
const SYSTEM_USER: &str = "postgres";

/// Settings appended to the new cluster's `postgresql.conf`; see the module documentation.
const DEV_SETTINGS: &str = "
# Added by payonce (db::local) for its private development cluster.
listen_addresses = '127.0.0.1'      # loopback only: the cluster trusts every local connection
unix_socket_directories = ''        # TCP only: a socket path must stay under ~107 bytes
";

/// How long `pg_ctl` may wait for the server to start or stop, in seconds.
const PG_CTL_WAIT_SECS: &str = "60";

/// How many free ports `start` tries before it gives up, in case another process takes the port
/// between the moment we find it free and the moment PostgreSQL binds it.
const START_ATTEMPTS: u32 = 4;

/// How long a freshly started server may take to answer its first query.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one connection attempt may take before the server counts as not answering.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// A running local PostgreSQL cluster, started or reused by [`LocalPostgres::start`].
///
/// Dropping it does not stop the server; call [`LocalPostgres::stop`] (see the module docs).
#[derive(Debug)]
pub struct LocalPostgres {
    /// The cluster's data directory, absolute.
    data_dir: PathBuf,
    /// The TCP port the server listens on, on 127.0.0.1.
    port: u16,
    /// How to run `pg_ctl` for this cluster. Set only when this handle started the server: it is
    /// what `stop` uses, and its absence is what makes `stop` a no-op.
    started: Option<Server>,
}

impl LocalPostgres {
    /// Finds the PostgreSQL binaries, `initdb`s `dir` if it holds no cluster yet, starts the server
    /// on a free 127.0.0.1 port and waits until it accepts connections.
    ///
    /// If a server from `dir` is already running (`postmaster.pid` names a port and the server
    /// answering there serves `dir`), it is reused instead, and [`started_here`](Self::started_here)
    /// is false. Missing parent folders of `dir` are created.
    pub async fn start(dir: &Path) -> Result<LocalPostgres, LocalPostgresError> {
        start_with(dir, &SearchPlaces::system()).await
    }

    /// The URL of `database` on this server: `postgres://postgres@127.0.0.1:PORT/DATABASE`.
    ///
    /// The database name is used as given: pass a plain identifier.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/{database}", self.port)
    }

    /// The TCP port the server listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether this handle started the server, rather than reusing one that was already running.
    pub fn started_here(&self) -> bool {
        self.started.is_some()
    }

    /// Stops the server (`pg_ctl stop -m fast`: open sessions are ended, committed work is kept) if
    /// this handle started it, and waits until it has stopped. A no-op for a reused server, which
    /// belongs to whoever started it.
    pub async fn stop(self) -> Result<(), LocalPostgresError> {
        self.pg_ctl_stop("fast").await
    }

    /// Stops the server the way a crash would (`pg_ctl stop -m immediate`: no checkpoint; the next
    /// start runs crash recovery). For outage drills and the tests that prove payonce survives
    /// its database going away. Does nothing for a reused server.
    pub async fn kill(&self) -> Result<(), LocalPostgresError> {
        self.pg_ctl_stop("immediate").await
    }

    /// Starts the server again after [`kill`](Self::kill), on the same port, so that clients
    /// configured with [`url`](Self::url) reconnect by themselves. Does nothing for a reused server.
    pub async fn revive(&self) -> Result<(), LocalPostgresError> {
        let Some(server) = self.started.clone() else {
            return Ok(());
        };
        let _lock = lock_beside(&self.data_dir).await?;
        let (data_dir, port) = (self.data_dir.clone(), self.port);
        blocking(move || start_server(&server, &data_dir, Some(port), true).map(|_| ())).await?;
        wait_until_ready(self.port, &self.data_dir).await
    }

    /// The URL of `database` on the port the cluster in `dir` remembers, whether or not its server
    /// runs now; `None` if there is no cluster there (or it never started).
    pub fn remembered_url(dir: &Path, database: &str) -> Option<String> {
        let data_dir = std::path::absolute(dir).ok()?;
        let port = remembered_port(&data_dir)?;
        Some(format!("postgres://{SUPERUSER}@127.0.0.1:{port}/{database}"))
    }

    /// Stops the server running from `dir`, whoever started it (`payonce db stop`): `immediate`
    /// as a crash would, otherwise `fast`. Nothing to do if none runs.
    pub async fn stop_folder(dir: &Path, immediate: bool) -> Result<(), LocalPostgresError> {
        let data_dir = std::path::absolute(dir).map_err(|e| io_error("resolve", dir, e))?;
        let (server, _) = {
            let data_dir = data_dir.clone();
            blocking(move || prepare(&data_dir, &SearchPlaces::system())).await?
        };
        let port = remembered_port(&data_dir).unwrap_or(0);
        let handle = LocalPostgres { data_dir, port, started: Some(server) };
        handle.pg_ctl_stop(if immediate { "immediate" } else { "fast" }).await
    }

    /// `pg_ctl stop -m <mode>`, if this handle started the server.
    async fn pg_ctl_stop(&self, mode: &'static str) -> Result<(), LocalPostgresError> {
        let Some(server) = self.started.clone() else {
            return Ok(());
        };
        // Under the lock, so another process cannot decide to reuse the server while it stops.
        let _lock = lock_beside(&self.data_dir).await?;
        tracing::info!("stopping the local PostgreSQL on port {} ({mode})", self.port);
        let data_dir = self.data_dir.clone();
        blocking(move || {
            if !data_dir.join("postmaster.pid").exists() {
                tracing::info!("the local PostgreSQL in {} had already stopped", data_dir.display());
                return Ok(());
            }
            let mut command = server.command("pg_ctl");
            command.arg("stop").arg("-D").arg(&data_dir).args(["-m", mode, "-w", "-t", PG_CTL_WAIT_SECS]);
            let output = server.run(&mut command)?;
            if output.status.success() {
                Ok(())
            } else {
                Err(server.failed("stopping the local PostgreSQL", &command, &output, &data_dir))
            }
        })
        .await
    }
}

/// Why the local PostgreSQL could not be started or stopped. Each message says what to do next.
#[derive(Debug, thiserror::Error)]
pub enum LocalPostgresError {
    /// No `initdb` and `pg_ctl` in `PATH` nor in any of the usual places.
    #[error(
        "no PostgreSQL server binaries (initdb, pg_ctl) were found in PATH or in {places}. \
         Either install PostgreSQL (e.g. `apt install postgresql`, `brew install postgresql@16`), \
         run everything with `docker compose up`, or point payonce at a server with \
         DATABASE_URL=postgres://…",
        places = list(searched)
    )]
    NotInstalled {
        /// The places searched besides `PATH`; a `*` stands for a version.
        searched: Vec<PathBuf>,
    },

    /// The folder holds a cluster of a major version whose binaries are not installed.
    #[error(
        "{dir} holds a PostgreSQL {cluster} cluster, but the PostgreSQL binaries found are \
         {found}. Install PostgreSQL {cluster}, delete {dir} to start over with an empty \
         database, or set DATABASE_URL",
        dir = dir.display()
    )]
    VersionMismatch {
        dir: PathBuf,
        /// The major version in the cluster's `PG_VERSION`.
        cluster: String,
        /// Each version found, with its folder.
        found: String,
    },

    /// payonce runs as root, and there is no unprivileged account to run PostgreSQL as.
    #[error(
        "payonce is running as root, which PostgreSQL refuses, and there is no `{SYSTEM_USER}` \
         system user to run it as instead. Create one (e.g. `useradd --system {SYSTEM_USER}`), run \
         payonce as a normal user, or set DATABASE_URL"
    )]
    NoUnprivilegedUser,

    /// The account PostgreSQL runs as cannot reach the data directory.
    #[error(
        "PostgreSQL has to run as the user `{user}` (payonce is running as root), but that user \
         cannot traverse {blocked}, so it cannot reach {dir}. Allow it (e.g. `chmod o+x {blocked}`), \
         choose a data directory it can reach, or set DATABASE_URL",
        blocked = blocked.display(),
        dir = dir.display()
    )]
    NotReachable {
        user: String,
        dir: PathBuf,
        /// The first folder on the way that the user may not enter.
        blocked: PathBuf,
    },

    /// The folder exists, is not empty, and is not a PostgreSQL cluster.
    #[error(
        "{dir} exists but is not a PostgreSQL data directory (it has no PG_VERSION file); \
         empty or remove it, or choose another folder",
        dir = dir.display()
    )]
    NotACluster { dir: PathBuf },

    /// A file system operation failed.
    #[error("could not {action} {path}: {error}", path = path.display())]
    Io { action: &'static str, path: PathBuf, error: io::Error },

    /// `initdb` or `pg_ctl` failed.
    #[error("{action} failed: {command} {outcome}{log}", log = log_hint(log.as_deref()))]
    Command {
        action: &'static str,
        /// The command line, and the user it ran as if that is not us.
        command: String,
        /// The exit status, the command's output and the end of the server log.
        outcome: String,
        /// The server log, when there is one.
        log: Option<PathBuf>,
    },

    /// The server started, but does not answer queries.
    #[error(
        "the local PostgreSQL started on port {port} but does not answer queries: {reason}; \
         the server log is {log}",
        log = log.display()
    )]
    NotReady { port: u16, reason: String, log: PathBuf },

    /// The runtime shut down while a blocking step was running.
    #[error("the async runtime shut down while the local PostgreSQL was being prepared")]
    Interrupted,
}

/// `start`, with the places searched for binaries given (the tests point it at nothing).
async fn start_with(dir: &Path, places: &SearchPlaces) -> Result<LocalPostgres, LocalPostgresError> {
    let data_dir = std::path::absolute(dir).map_err(|e| io_error("resolve", dir, e))?;
    if data_dir.file_name().is_none() {
        let error = io::Error::new(io::ErrorKind::InvalidInput, "it does not end in a folder name");
        return Err(io_error("use as a data directory", dir, error));
    }
    let _lock = lock_beside(&data_dir).await?;

    let pid_file = {
        let path = data_dir.join("postmaster.pid");
        blocking(move || match fs::read_to_string(&path) {
            Ok(contents) => Ok(Some(contents)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error("read", &path, e)),
        })
        .await?
    };
    if let Some(port) = running_server(pid_file.as_deref(), &data_dir).await {
        tracing::info!("reusing the local PostgreSQL on port {port}");
        return Ok(LocalPostgres { data_dir, port, started: None });
    }

    let (server, version) = {
        let (data_dir, places) = (data_dir.clone(), places.clone());
        blocking(move || prepare(&data_dir, &places)).await?
    };
    tracing::info!("starting a local PostgreSQL {version} in {} (no DATABASE_URL set)", dir.display());
    let remembered = remembered_port(&data_dir);
    let port = {
        let (data_dir, server) = (data_dir.clone(), server.clone());
        blocking(move || {
            if !data_dir.join("PG_VERSION").exists() {
                init_cluster(&server, &data_dir)?;
            }
            if let Some(contents) = &pid_file {
                remove_if_left_by_a_zombie(&data_dir, contents)?;
            }
            start_server(&server, &data_dir, remembered, false)
        })
        .await?
    };
    wait_until_ready(port, &data_dir).await?;
    if remembered != Some(port) {
        remember_port(port).await.map_err(|error| LocalPostgresError::NotReady {
            port,
            reason: format!("could not remember the port: {error}"),
            log: data_dir.join("server.log"),
        })?;
    }
    tracing::info!("the local PostgreSQL is ready on port {port}");
    Ok(LocalPostgres { data_dir, port, started: Some(server) })
}

/// PostgreSQL's programs for one cluster, and the account they run as.
#[derive(Debug, Clone)]
struct Server {
    /// The folder holding `initdb`, `pg_ctl` and `postgres`.
    bin_dir: PathBuf,
    /// The account to run them as when payonce runs as root; `None` runs them as ourselves.
    account: Option<Account>,
}

/// An unprivileged Unix account.
#[derive(Debug, Clone)]
struct Account {
    name: String,
    uid: u32,
    gid: u32,
}

impl Server {
    /// `tool` from the binaries' folder, set up to run as the right user, from `/` (the working
    /// directory may not be readable by that user), with no terminal input. `run` captures its
    /// output, so nothing reaches the caller's terminal.
    fn command(&self, tool: &str) -> Command {
        let mut command = Command::new(self.bin_dir.join(tool));
        command.current_dir("/").stdin(Stdio::null());
        if let Some(account) = &self.account {
            // With a uid set and no explicit groups, std also drops the supplementary groups
            // (setgroups(0)), so root's groups are not inherited.
            command.uid(account.uid).gid(account.gid);
        }
        command
    }

    /// Runs `command` to completion and captures its output. The server that `pg_ctl start` leaves
    /// behind writes to its log file, not to these pipes, so this returns when `pg_ctl` does.
    fn run(&self, command: &mut Command) -> Result<Output, LocalPostgresError> {
        command.output().map_err(|e| io_error("run", Path::new(command.get_program()), e))
    }

    /// The error for a `command` that exited unsuccessfully.
    fn failed(&self, action: &'static str, command: &Command, output: &Output, data_dir: &Path) -> LocalPostgresError {
        LocalPostgresError::Command {
            action,
            command: self.describe(command),
            outcome: outcome(output),
            log: Some(data_dir.join("server.log")),
        }
    }

    /// `command` as a person would type it, and the user it runs as if that is not us.
    fn describe(&self, command: &Command) -> String {
        let mut line = shell_word(&command.get_program().to_string_lossy());
        for arg in command.get_args() {
            line.push(' ');
            line.push_str(&shell_word(&arg.to_string_lossy()));
        }
        match &self.account {
            Some(account) => format!("`{line}` (as user {})", account.name),
            None => format!("`{line}`"),
        }
    }
}

/// Picks the binaries and the account for the cluster in `data_dir` (which may not exist yet), and
/// checks that the account can reach it. Returns them with the PostgreSQL major version.
fn prepare(data_dir: &Path, places: &SearchPlaces) -> Result<(Server, String), LocalPostgresError> {
    let cluster_version = match fs::read_to_string(data_dir.join("PG_VERSION")) {
        Ok(version) => Some(version.trim().to_owned()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_error("read", &data_dir.join("PG_VERSION"), e)),
    };
    let (bin_dir, version) = choose_binaries(places, cluster_version.as_deref(), data_dir)?;
    let account = server_account(data_dir)?;
    if let Some(account) = &account {
        check_reachable(data_dir, account)?;
    }
    Ok((Server { bin_dir, account }, version))
}

/// The first binaries folder (PATH first, then the usual places) whose major version matches the
/// existing cluster's, or the first one for a new cluster; with its major version.
fn choose_binaries(
    places: &SearchPlaces,
    cluster_version: Option<&str>,
    data_dir: &Path,
) -> Result<(PathBuf, String), LocalPostgresError> {
    let mut found = Vec::new();
    for bin_dir in find_bin_dirs(places)? {
        let version = major_version(&bin_dir)?;
        match cluster_version {
            Some(wanted) if wanted != version => {
                found.push(format!("{version} in {}", bin_dir.display()));
            }
            _ => return Ok((bin_dir, version)),
        }
    }
    Err(LocalPostgresError::VersionMismatch {
        dir: data_dir.to_path_buf(),
        cluster: cluster_version.unwrap_or_default().to_owned(),
        found: found.join(", "),
    })
}

/// The places searched for PostgreSQL's binaries.
#[derive(Debug, Clone)]
struct SearchPlaces {
    /// A `PATH`-style list of folders, searched first.
    path: Option<OsString>,
    /// Folders searched next, in order; a `*` in one component stands for a version.
    patterns: Vec<PathBuf>,
}

impl SearchPlaces {
    /// `PATH` and the usual install locations.
    fn system() -> Self {
        SearchPlaces { path: std::env::var_os("PATH"), patterns: SEARCH_PLACES.iter().map(PathBuf::from).collect() }
    }
}

/// Every folder holding both `initdb` and `pg_ctl`, in order of preference.
fn find_bin_dirs(places: &SearchPlaces) -> Result<Vec<PathBuf>, LocalPostgresError> {
    let from_path = places.path.iter().flat_map(std::env::split_paths);
    let from_patterns = places.patterns.iter().flat_map(|pattern| expand(pattern));
    let mut dirs: Vec<PathBuf> = Vec::new();
    for dir in from_path.chain(from_patterns) {
        let complete = dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
        if complete && !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    if dirs.is_empty() {
        return Err(LocalPostgresError::NotInstalled { searched: places.patterns.clone() });
    }
    Ok(dirs)
}

/// The folders matching `pattern`, whose one `*` stands for a version or a name: highest version
/// first. A pattern without `*` is returned as is.
fn expand(pattern: &Path) -> Vec<PathBuf> {
    let text = pattern.to_string_lossy();
    let Some((head, tail)) = text.split_once('*') else {
        return vec![pattern.to_path_buf()];
    };
    // "/usr/pgsql-*/bin": in folder "/usr", names "pgsql-" + version + "", then "bin" below.
    let (parent, prefix) = head.rsplit_once('/').unwrap_or(("", head));
    let (suffix, rest) = tail.split_once('/').unwrap_or((tail, ""));
    let parent = if parent.is_empty() { "/" } else { parent };
    let Ok(entries) = fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut matches: Vec<(Vec<u64>, PathBuf)> = entries
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            let middle = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
            let mut path = Path::new(parent).join(&name);
            if !rest.is_empty() {
                path.push(rest);
            }
            Some((version_key(middle), path))
        })
        .collect();
    matches.sort_by(|a, b| b.cmp(a));
    matches.into_iter().map(|(_, path)| path).collect()
}

/// The numbers in a version string, for ordering: "9.6" → [9, 6], "16" → [16], "latest" → [].
fn version_key(version: &str) -> Vec<u64> {
    version.split(|c: char| !c.is_ascii_digit()).filter_map(|number| number.parse().ok()).collect()
}

/// The major version of the binaries in `bin_dir`, as `PG_VERSION` spells it ("15", or "9.6" for
/// the old numbering), from `pg_ctl --version` ("pg_ctl (PostgreSQL) 15.14 (Debian …)").
fn major_version(bin_dir: &Path) -> Result<String, LocalPostgresError> {
    // `--version` works as root too: pg_ctl answers it before refusing root.
    let server = Server { bin_dir: bin_dir.to_path_buf(), account: None };
    let mut command = server.command("pg_ctl");
    command.arg("--version");
    let output = server.run(&mut command)?;
    let text = String::from_utf8_lossy(&output.stdout);
    let numbers = text
        .split_once("(PostgreSQL)")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .map(version_key)
        .unwrap_or_default();
    match numbers.as_slice() {
        [major, ..] if *major >= 10 => Ok(major.to_string()),
        [major, minor, ..] => Ok(format!("{major}.{minor}")),
        _ => Err(LocalPostgresError::Command {
            action: "reading the PostgreSQL version",
            command: server.describe(&command),
            outcome: outcome(&output),
            log: None,
        }),
    }
}

/// The account to run PostgreSQL as: `None` (ourselves) unless we are root; then the owner of the
/// existing cluster, or the `postgres` system user for a new one.
fn server_account(data_dir: &Path) -> Result<Option<Account>, LocalPostgresError> {
    if effective_uid() != Some(0) {
        return Ok(None);
    }
    if let Ok(meta) = fs::metadata(data_dir.join("PG_VERSION"))
        && meta.uid() != 0
    {
        let name = lookup_account(&meta.uid().to_string())
            .map_or_else(|| format!("uid {}", meta.uid()), |account| account.name);
        return Ok(Some(Account { name, uid: meta.uid(), gid: meta.gid() }));
    }
    lookup_account(SYSTEM_USER).map(Some).ok_or(LocalPostgresError::NoUnprivilegedUser)
}

/// Our effective user id: the owner of `/proc/self` on Linux, else what `id -u` says.
fn effective_uid() -> Option<u32> {
    if let Ok(meta) = fs::metadata("/proc/self") {
        return Some(meta.uid());
    }
    let output = Command::new("id").arg("-u").stdin(Stdio::null()).output().ok()?;
    String::from_utf8_lossy(&output.stdout).trim().parse().ok()
}

/// The account named `key` (a user name or a numeric uid), from `getent passwd` (which also sees
/// LDAP and the like) or else `/etc/passwd`.
fn lookup_account(key: &str) -> Option<Account> {
    let from_getent = Command::new("getent")
        .args(["passwd", key])
        .stdin(Stdio::null())
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).into_owned());
    let passwd = match from_getent {
        Some(text) => text,
        None => fs::read_to_string("/etc/passwd").ok()?,
    };
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let uid = fields.nth(1)?;
        let gid = fields.next()?;
        if name != key && uid != key {
            return None;
        }
        Some(Account { name: name.to_owned(), uid: uid.parse().ok()?, gid: gid.parse().ok()? })
    })
}

/// Checks that `account` may traverse every folder above `data_dir`, from the mode bits: the
/// processes run with the account's uid and primary gid only (no supplementary groups).
fn check_reachable(data_dir: &Path, account: &Account) -> Result<(), LocalPostgresError> {
    let mut parents: Vec<&Path> = data_dir.ancestors().skip(1).collect();
    parents.reverse();
    for parent in parents {
        let Ok(meta) = fs::metadata(parent) else {
            continue;
        };
        let search_bit = if meta.uid() == account.uid {
            0o100
        } else if meta.gid() == account.gid {
            0o010
        } else {
            0o001
        };
        if meta.mode() & search_bit == 0 {
            return Err(LocalPostgresError::NotReachable {
                user: account.name.clone(),
                dir: data_dir.to_path_buf(),
                blocked: parent.to_path_buf(),
            });
        }
    }
    Ok(())
}

/// Creates the cluster: `initdb` into a temporary sibling folder, our settings appended, then renamed
/// to `data_dir`, so that a crash at any point leaves either no cluster or a complete one.
fn init_cluster(server: &Server, data_dir: &Path) -> Result<(), LocalPostgresError> {
    // An empty folder in the way (say, made by hand) gets replaced; anything else is not ours.
    let in_the_way = match fs::read_dir(data_dir) {
        Ok(mut entries) => entries.next().is_some(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(io_error("read", data_dir, e)),
    };
    if in_the_way {
        return Err(LocalPostgresError::NotACluster { dir: data_dir.to_path_buf() });
    }
    tracing::info!("creating a new PostgreSQL cluster in {}", data_dir.display());
    let temp = sibling(data_dir, ".initdb-tmp");
    // A leftover from an interrupted run: we hold the lock, so no one is using it.
    match fs::remove_dir_all(&temp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(io_error("remove the leftover", &temp, e));
        }
        _ => {}
    }
    fs::create_dir(&temp).map_err(|e| io_error("create", &temp, e))?;
    if let Some(account) = &server.account {
        std::os::unix::fs::chown(&temp, Some(account.uid), Some(account.gid))
            .map_err(|e| io_error("hand over to the PostgreSQL user", &temp, e))?;
    }

    let mut command = server.command("initdb");
    command
        .arg("-D")
        .arg(&temp)
        .args(["-U", SUPERUSER, "--auth=trust", "-E", "UTF8"])
        .args(["--no-locale", "--no-sync"]);
    let output = server.run(&mut command)?;
    if !output.status.success() {
        // Best effort: the next run removes it anyway.
        let _ = fs::remove_dir_all(&temp);
        return Err(LocalPostgresError::Command {
            action: "creating the PostgreSQL cluster",
            command: server.describe(&command),
            outcome: outcome(&output),
            log: None,
        });
    }

    let config = temp.join("postgresql.conf");
    OpenOptions::new()
        .append(true)
        .open(&config)
        .and_then(|mut file| file.write_all(DEV_SETTINGS.as_bytes()))
        .map_err(|e| io_error("configure", &config, e))?;

    match fs::remove_dir(data_dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            let _ = fs::remove_dir_all(&temp);
            return Err(io_error("replace the empty folder", data_dir, e));
        }
        _ => {}
    }
    fs::rename(&temp, data_dir).map_err(|e| io_error("move the new cluster to", data_dir, e))
}

/// Starts the server with `pg_ctl start -w` on `preferred` (or a free port), and returns the port.
/// If the port was taken in the meantime, or the previous server of this folder is still exiting,
/// tries again: on the same port if `strict`, else on a free one once the preferred one is taken.
fn start_server(
    server: &Server,
    data_dir: &Path,
    preferred: Option<u16>,
    strict: bool,
) -> Result<u16, LocalPostgresError> {
    let log = data_dir.join("server.log");
    let mut attempt = 1;
    let mut preferred = preferred;
    loop {
        let port = match preferred {
            Some(port) => port,
            None => free_port()?,
        };
        // Read only what this attempt logs, not the failures of earlier runs.
        let log_start = fs::metadata(&log).map_or(0, |meta| meta.len());
        let mut command = server.command("pg_ctl");
        command
            .arg("start")
            .arg("-D")
            .arg(data_dir)
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", PG_CTL_WAIT_SECS, "-o"])
            .arg(format!("-p {port}"));
        let output = server.run(&mut command)?;
        if output.status.success() {
            return Ok(port);
        }
        let logged = log_tail(&log, log_start);
        let port_taken = logged.contains("Address already in use");
        let previous_still_exiting = logged.contains("lock file \"postmaster.pid\" already exists");
        if attempt < START_ATTEMPTS && (port_taken || previous_still_exiting) {
            tracing::debug!(port, attempt, "the local PostgreSQL did not start; trying again");
            if port_taken && !strict {
                if preferred.is_some() {
                    tracing::warn!(port, "the local PostgreSQL's usual port is taken: starting it on another one");
                }
                preferred = None;
            }
            std::thread::sleep(Duration::from_millis(200) * attempt);
            attempt += 1;
            continue;
        }
        let mut error = server.failed("starting the local PostgreSQL", &command, &output, data_dir);
        if let LocalPostgresError::Command { outcome, .. } = &mut error
            && !logged.is_empty()
        {
            outcome.push_str("\nthe server logged:\n");
            outcome.push_str(&logged);
        }
        return Err(error);
    }
}

/// The port the cluster in `data_dir` remembers (`port = '…'` in `postgresql.auto.conf`, written
/// by [`remember_port`]), if any.
fn remembered_port(data_dir: &Path) -> Option<u16> {
    let auto = fs::read_to_string(data_dir.join("postgresql.auto.conf")).ok()?;
    auto.lines().rev().find_map(|line| {
        let (name, value) = line.split_once('=')?;
        (name.trim() == "port").then(|| value.trim().trim_matches('\'').parse().ok()).flatten()
    })
}

/// Makes `port` the cluster's own setting (`ALTER SYSTEM`, kept in `postgresql.auto.conf`), so that
/// the next start, ours or a plain `pg_ctl start`, listens there again.
async fn remember_port(port: u16) -> Result<(), sqlx::Error> {
    let mut connection = probe_options(port).connect().await?;
    // ALTER SYSTEM takes no parameters; the value is a number we formatted.
    sqlx::query(&format!("alter system set port = {port}")).execute(&mut connection).await?;
    connection.close().await
}

/// A TCP port on 127.0.0.1 that is free right now (the OS picks it).
fn free_port() -> Result<u16, LocalPostgresError> {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .and_then(|listener| listener.local_addr())
        .map_err(|e| io_error("find a free port on", Path::new("127.0.0.1"), e))?;
    Ok(listener.port())
}

/// The port of the server already running from `data_dir`, if there is one and it answers.
///
/// `pid_file` is the contents of its `postmaster.pid`, whose fourth line is the port. The file can
/// be stale (the server was killed), or the port can since belong to another server, so the server
/// answering there must report `data_dir` as its data directory.
async fn running_server(pid_file: Option<&str>, data_dir: &Path) -> Option<u16> {
    let port: u16 = pid_file?.lines().nth(3)?.trim().parse().ok()?;
    match tokio::time::timeout(PROBE_TIMEOUT, served_directory(port)).await {
        Ok(Ok(served)) if same_folder(&served, data_dir) => Some(port),
        Ok(Ok(served)) => {
            let served = served.display();
            tracing::debug!(port, %served, "the port in postmaster.pid serves another folder");
            None
        }
        Ok(Err(error)) => {
            tracing::debug!(port, %error, "postmaster.pid is stale");
            None
        }
        Err(_) => {
            tracing::debug!(port, "the port in postmaster.pid does not answer");
            None
        }
    }
}

/// Removes `postmaster.pid` (whose contents are `pid_file`) if the postmaster it names is a zombie:
/// dead, but not yet reaped.
///
/// `pg_ctl` detaches the postmaster, so once it exits only PID 1 can reap it, and in containers
/// PID 1 often reaps late or never. PostgreSQL's own staleness check (`kill(pid, 0)`) counts a
/// zombie as alive and refuses to start for as long as the zombie lasts. Removing the file is safe
/// here: the process is dead, we hold the lock, and PostgreSQL still refuses to start while
/// orphaned backends hold the old shared memory (it finds that by the data directory's inode, not
/// through this file). Linux only (`/proc`); elsewhere PostgreSQL's check decides alone.
fn remove_if_left_by_a_zombie(data_dir: &Path, pid_file: &str) -> Result<(), LocalPostgresError> {
    let Some(pid) = pid_file.lines().next().and_then(|line| line.trim().parse::<u32>().ok()) else {
        return Ok(());
    };
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Ok(());
    };
    // "1234 (postgres) Z 1 …": the state follows the command name, which may contain ") ".
    let zombie = stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
    if !zombie {
        return Ok(());
    }
    tracing::debug!(pid, "postmaster.pid names a dead, unreaped postmaster; removing it");
    let path = data_dir.join("postmaster.pid");
    match fs::remove_file(&path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_error("remove the stale", &path, e)),
        _ => Ok(()),
    }
}

/// Waits until the server on `port` answers a query.
async fn wait_until_ready(port: u16, data_dir: &Path) -> Result<(), LocalPostgresError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let reason = match tokio::time::timeout(PROBE_TIMEOUT, served_directory(port)).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(error)) => error.to_string(),
            Err(_) => format!("no answer within {PROBE_TIMEOUT:?}"),
        };
        if Instant::now() >= deadline {
            return Err(LocalPostgresError::NotReady { port, reason, log: data_dir.join("server.log") });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Connects to the server on `port` and asks for its data directory: a real query, and proof of
/// which cluster answered.
async fn served_directory(port: u16) -> Result<PathBuf, sqlx::Error> {
    let mut connection = probe_options(port).connect().await?;
    let served: String = sqlx::query_scalar("select setting from pg_settings where name = 'data_directory'")
        .fetch_one(&mut connection)
        .await?;
    connection.close().await?;
    Ok(PathBuf::from(served))
}

/// How payonce itself connects to the server on `port`, to check it and to configure it.
fn probe_options(port: u16) -> PgConnectOptions {
    PgConnectOptions::new_without_pgpass()
        .host("127.0.0.1")
        .port(port)
        .username(SUPERUSER)
        .database("postgres")
        .ssl_mode(PgSslMode::Disable)
        .application_name("payonce local PostgreSQL check")
        .disable_statement_logging()
}

/// Whether two paths name the same folder (following symbolic links where they exist).
fn same_folder(a: &Path, b: &Path) -> bool {
    match (fs::canonicalize(a), fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Opens `<data_dir>.lock` (creating it and its parent folders) and waits for an exclusive lock on
/// it. The lock lasts until the returned file is dropped, or the process dies.
async fn lock_beside(data_dir: &Path) -> Result<File, LocalPostgresError> {
    let path = sibling(data_dir, ".lock");
    blocking(move || {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|e| io_error("create", parent, e))?;
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io_error("open the lock file", &path, e))?;
        file.lock().map_err(|e| io_error("lock", &path, e))?;
        Ok(file)
    })
    .await
}

/// `dir` with `suffix` appended to its last component: `a/postgres` → `a/postgres.lock`.
fn sibling(dir: &Path, suffix: &str) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    dir.with_file_name(name)
}

/// The last lines `log` gained after byte `from`; empty if it cannot be read.
fn log_tail(log: &Path, from: u64) -> String {
    let mut bytes = Vec::new();
    let read = File::open(log).and_then(|mut file| {
        file.seek(SeekFrom::Start(from))?;
        file.read_to_end(&mut bytes)
    });
    if read.is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().filter(|line| !line.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

/// "exited with exit status: 1: <what it printed>".
fn outcome(output: &Output) -> String {
    let printed = [&output.stderr, &output.stdout]
        .map(|bytes| String::from_utf8_lossy(bytes).trim().to_owned())
        .into_iter()
        .filter(|text| !text.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    if printed.is_empty() {
        format!("exited with {}", output.status)
    } else {
        format!("exited with {}:\n{printed}", output.status)
    }
}

/// Quotes `word` for a shell if it needs it.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=@%+:,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// "\nthe server log is <path>", or nothing.
fn log_hint(log: Option<&Path>) -> String {
    log.map(|log| format!("\nthe server log is {}", log.display())).unwrap_or_default()
}

/// "/a, /b and /c".
fn list(paths: &[PathBuf]) -> String {
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    match names.split_last() {
        None => "no other place".to_owned(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

fn io_error(action: &'static str, path: &Path, error: io::Error) -> LocalPostgresError {
    LocalPostgresError::Io { action, path: path.to_path_buf(), error }
}

/// Runs blocking work (processes, file locks, file IO) off the async threads.
async fn blocking<T, F>(work: F) -> Result<T, LocalPostgresError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, LocalPostgresError> + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(error) => match error.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => Err(LocalPostgresError::Interrupted),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpStream;

    use sqlx::PgConnection;

    use super::*;

    /// A unique folder under the system temp dir, deleted on drop together with any server a
    /// failed test left running in it.
    struct Scratch {
        root: PathBuf,
    }

    impl Scratch {
        fn new(test: &str) -> Scratch {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_nanos());
            let root = std::env::temp_dir().join(format!("payonce-localpg-{test}-{}-{nanos}", std::process::id()));
            fs::create_dir_all(&root).expect("create the scratch folder");
            Scratch { root }
        }

        fn data_dir(&self) -> PathBuf {
            self.root.join("postgres")
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let data_dir = self.data_dir();
            if data_dir.join("postmaster.pid").exists()
                && let Ok(bin_dirs) = find_bin_dirs(&SearchPlaces::system())
            {
                let server = Server { bin_dir: bin_dirs[0].clone(), account: server_account(&data_dir).ok().flatten() };
                let _ = server
                    .command("pg_ctl")
                    .arg("stop")
                    .arg("-D")
                    .arg(&data_dir)
                    .args(["-m", "immediate", "-w"])
                    .output();
            }
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    async fn connect(pg: &LocalPostgres) -> PgConnection {
        PgConnection::connect(&pg.url("postgres")).await.expect("connect to the local PostgreSQL")
    }

    async fn select_one(pg: &LocalPostgres) -> i32 {
        let mut connection = connect(pg).await;
        sqlx::query_scalar("select 1").fetch_one(&mut connection).await.expect("select 1")
    }

    fn answers(port: u16) -> bool {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    }

    /// A fresh folder: initdb, start, answer `select 1`, stop; the port then refuses connections.
    #[tokio::test]
    async fn starts_a_fresh_cluster_and_stops_it() {
        let scratch = Scratch::new("fresh");
        let pg = LocalPostgres::start(&scratch.data_dir()).await.expect("start");
        assert!(pg.started_here());
        assert_eq!(pg.url("payonce"), format!("postgres://postgres@127.0.0.1:{}/payonce", pg.port()));
        assert_eq!(select_one(&pg).await, 1);
        assert!(scratch.data_dir().join("PG_VERSION").is_file());
        assert!(!sibling(&scratch.data_dir(), ".initdb-tmp").exists());

        let port = pg.port();
        pg.stop().await.expect("stop");
        assert!(!answers(port), "port {port} still answers after stop");
        assert!(!scratch.data_dir().join("postmaster.pid").exists());
    }

    /// Two starts at the same instant on one new folder: one initdb, one server, both use it;
    /// stopping the reusing handle leaves the server up.
    #[tokio::test]
    async fn concurrent_starts_share_one_server() {
        let scratch = Scratch::new("concurrent");
        let dir = scratch.data_dir();
        let (a, b) = tokio::join!(LocalPostgres::start(&dir), LocalPostgres::start(&dir));
        let (a, b) = (a.expect("first start"), b.expect("second start"));
        assert_eq!(a.port(), b.port());
        assert!(a.started_here() != b.started_here(), "exactly one starts it");

        let (owner, guest) = if a.started_here() { (a, b) } else { (b, a) };
        let port = owner.port();
        guest.stop().await.expect("stop is a no-op for a reused server");
        assert_eq!(select_one(&owner).await, 1);
        owner.stop().await.expect("stop");
        assert!(!answers(port));
    }

    /// After a stop, the next start finds the cluster on disk: no new initdb, the data survives.
    #[tokio::test]
    async fn restart_keeps_the_data() {
        let scratch = Scratch::new("restart");
        let pg = LocalPostgres::start(&scratch.data_dir()).await.expect("first start");
        let mut connection = connect(&pg).await;
        sqlx::raw_sql("create table kept (answer int); insert into kept values (42)")
            .execute(&mut connection)
            .await
            .expect("create a table");
        connection.close().await.expect("close");
        pg.stop().await.expect("stop");

        let pg = LocalPostgres::start(&scratch.data_dir()).await.expect("second start");
        assert!(pg.started_here());
        let mut connection = connect(&pg).await;
        let answer: i32 = sqlx::query_scalar("select answer from kept")
            .fetch_one(&mut connection)
            .await
            .expect("the table survived the restart");
        assert_eq!(answer, 42);
        connection.close().await.expect("close");
        pg.stop().await.expect("stop");
    }

    /// A restarted cluster listens on the port it had, so URLs handed out stay valid: through
    /// `start`, through `stop_folder` (whoever started it), and for a plain `pg_ctl start`, which
    /// reads the port from the cluster's own configuration.
    #[tokio::test]
    async fn a_restart_keeps_the_port() {
        let scratch = Scratch::new("port");
        let pg = LocalPostgres::start(&scratch.data_dir()).await.expect("first start");
        let port = pg.port();
        assert_eq!(remembered_port(&scratch.data_dir()), Some(port));
        let url = LocalPostgres::remembered_url(&scratch.data_dir(), "postgres").expect("a remembered URL");
        assert_eq!(url, pg.url("postgres"));
        LocalPostgres::stop_folder(&scratch.data_dir(), true).await.expect("stop it as a crash would");
        assert!(TcpStream::connect(("127.0.0.1", port)).is_err(), "stopped");

        let again = LocalPostgres::start(&scratch.data_dir()).await.expect("second start");
        assert_eq!(again.port(), port, "the same port after a restart");
        connect(&again).await.close().await.expect("close");
        again.stop().await.expect("stop");
    }

    /// A `postmaster.pid` left behind by a dead server neither counts as a running server nor
    /// blocks the next start.
    #[tokio::test]
    async fn a_stale_pid_file_does_not_block_a_start() {
        let scratch = Scratch::new("stale");
        let pid_file = scratch.data_dir().join("postmaster.pid");
        let pg = LocalPostgres::start(&scratch.data_dir()).await.expect("first start");
        let stale = fs::read(&pid_file).expect("read postmaster.pid");
        pg.stop().await.expect("stop");
        fs::write(&pid_file, &stale).expect("put back a stale postmaster.pid");

        let pg = LocalPostgres::start(&scratch.data_dir()).await.expect("start despite the stale postmaster.pid");
        assert!(pg.started_here());
        assert_eq!(select_one(&pg).await, 1);
        pg.stop().await.expect("stop");
    }

    /// With no binaries anywhere, the error names the places searched and the three ways out.
    #[tokio::test]
    async fn not_installed_names_the_ways_out() {
        let scratch = Scratch::new("missing");
        let nowhere = scratch.root.join("nothing/*/bin");
        let places = SearchPlaces {
            path: Some(OsString::new()),
            patterns: vec![nowhere.clone(), scratch.root.join("empty/bin")],
        };
        let error = start_with(&scratch.data_dir(), &places).await.expect_err("there are no binaries");
        assert!(matches!(error, LocalPostgresError::NotInstalled { .. }));
        let message = error.to_string();
        for expected in [
            "initdb, pg_ctl",
            &nowhere.display().to_string(),
            "apt install postgresql",
            "brew install postgresql@16",
            "docker compose up",
            "DATABASE_URL=postgres://",
        ] {
            assert!(message.contains(expected), "{expected:?} missing in: {message}");
        }
    }

    /// A folder holding something other than a cluster is refused before `initdb` runs, untouched.
    #[tokio::test]
    async fn a_foreign_folder_is_left_alone() {
        let scratch = Scratch::new("foreign");
        let dir = scratch.data_dir();
        fs::create_dir_all(&dir).expect("create the folder");
        fs::write(dir.join("notes.txt"), "mine").expect("write a file");
        let error = LocalPostgres::start(&dir).await.expect_err("not a cluster");
        assert!(matches!(error, LocalPostgresError::NotACluster { .. }), "{error}");
        assert_eq!(fs::read_to_string(dir.join("notes.txt")).ok().as_deref(), Some("mine"));
        assert!(!sibling(&dir, ".initdb-tmp").exists());
    }

    /// Versioned install folders are found, highest version first, complete ones only.
    #[test]
    fn discovery_prefers_the_highest_version() {
        let scratch = Scratch::new("discovery");
        for version in ["9.6", "10", "16", "15"] {
            let bin = scratch.root.join("lib").join(version).join("bin");
            fs::create_dir_all(&bin).expect("create a bin folder");
            for tool in ["initdb", "pg_ctl"] {
                fs::write(bin.join(tool), "").expect("create a fake tool");
            }
        }
        fs::create_dir_all(scratch.root.join("lib/17/bin")).expect("an incomplete install");
        let places = SearchPlaces { path: None, patterns: vec![scratch.root.join("lib/*/bin")] };
        let found = find_bin_dirs(&places).expect("found");
        let versions: Vec<_> =
            found.iter().map(|dir| dir.parent().and_then(Path::file_name).unwrap_or_default()).collect();
        assert_eq!(versions, ["16", "15", "10", "9.6"]);
    }
}
