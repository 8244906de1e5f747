//! A PostgreSQL container for payonce's integration tests, through testcontainers.
//!
//! Prints one line on standard output, `url postgres://…` once the server answers (or
//! `error …`), then waits until standard input closes and removes the container. The test
//! process holds the other end of that pipe, so the container lives exactly as long as the test
//! process: a normal exit, a panic and a SIGKILL all close it. Ctrl-C reaches this process too
//! (it is in the test process's group): it then removes the container at once instead of dying
//! with it still running.

use std::time::Duration;

use testcontainers_modules::postgres::Postgres;
use testcontainers_modules::testcontainers::core::Mount;
use testcontainers_modules::testcontainers::runners::AsyncRunner;
use testcontainers_modules::testcontainers::{ContainerRequest, ImageExt};
use tokio::io::AsyncReadExt;
use tokio::signal::unix::{SignalKind, signal};

/// The image; the stand-in built where no registry answers (docker/standins/build) carries the
/// same name and tag. The module's default tag is old.
const IMAGE_NAME: &str = "postgres";
const IMAGE_TAG: &str = "16-bookworm";

/// The label that names the test containers, for `.ci/testcontainers` and for cleaning up by hand.
const LABEL: &str = "dev.payonce.tests";

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // Before anything is started: from here on, SIGINT and SIGTERM no longer end the process.
    let (Ok(mut interrupt), Ok(mut terminate)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
    else {
        return println!("error cannot handle signals");
    };
    let container = match request().start().await {
        Ok(container) => container,
        Err(err) => return println!("error {IMAGE_NAME}:{IMAGE_TAG} did not start: {err}"),
    };
    match url(&container).await {
        Ok(url) => println!("url {url}"),
        Err(err) => println!("error {err}"),
    }
    // Until the test process exits (end of file, or an error: the pipe is gone either way), or
    // whoever ran it interrupts the run.
    let (mut stdin, mut rest) = (tokio::io::stdin(), Vec::new());
    tokio::select! {
        _ = stdin.read_to_end(&mut rest) => {}
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    let id = container.id().to_owned();
    if let Err(err) = container.rm().await {
        eprintln!("test-postgres: could not remove the PostgreSQL container {id}: {err}");
    }
    // Not a return: after a signal, the runtime's shutdown would wait for the blocking read of
    // standard input, which only the test process's exit ends.
    std::process::exit(0);
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
        .with_label(LABEL, std::process::id().to_string())
        .with_startup_timeout(Duration::from_secs(120))
}

async fn url(container: &testcontainers_modules::testcontainers::ContainerAsync<Postgres>) -> Result<String, String> {
    let named = container.get_host().await.map_err(|e| e.to_string())?.to_string();
    let port = container.get_host_port_ipv4(5432).await.map_err(|e| e.to_string())?;
    let host = reachable_host(named, port).await?;
    Ok(format!("postgres://postgres@{host}:{port}/postgres"))
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
