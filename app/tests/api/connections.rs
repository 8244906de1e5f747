//! The server's connections under abuse, against a real `payonce serve` process: slow headers,
//! slow bodies, idle connections beyond the file-descriptor limit, a huge declared body, and
//! what hyper answers by itself.
//!
//! The deadlines below only stop a test that would otherwise hang (the server never answering is
//! the failure being tested); they are several times what the server is configured to take.

use std::net::SocketAddr;
use std::time::Duration;

use payonce::simulator::{self, RunningSimulator};
use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{Ledger, ServerProcess, TestDatabase, new_key};

/// The server's timeouts in these tests (seconds): short, so the tests are quick.
const TIMEOUT_SECS: &str = "2";
/// How long a test waits for something the server does within [`TIMEOUT_SECS`].
const DEADLINE: Duration = Duration::from_secs(30);

/// A server process on its own database and simulator.
pub struct Served {
    pub database: TestDatabase,
    pub server: ServerProcess,
    /// The simulator's ledger and faults.
    pub ledger: Ledger,
    _sim: RunningSimulator,
}

impl Served {
    /// `payonce serve` with short connection timeouts and `env` on top.
    pub async fn start(env: &[(&str, &str)], fd_limit: Option<u64>) -> Self {
        Self::start_on(TestDatabase::create().await, env, fd_limit).await
    }

    /// [`Served::start`] on a database the test prepared.
    pub async fn start_on(database: TestDatabase, env: &[(&str, &str)], fd_limit: Option<u64>) -> Self {
        let sim = simulator::start("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let mut all = vec![
            ("PAYONCE_HEADER_READ_TIMEOUT_SECS", TIMEOUT_SECS),
            ("PAYONCE_BODY_TIMEOUT_SECS", TIMEOUT_SECS),
            ("PAYONCE_IDLE_TIMEOUT_SECS", TIMEOUT_SECS),
        ];
        all.extend_from_slice(env);
        let server = ServerProcess::start_with_fd_limit(&database.url, &sim.base_url(), &all, fd_limit).await;
        Self { database, server, ledger: Ledger::new(&sim.base_url()), _sim: sim }
    }
}

/// Reads from `stream` until the server closes it; `None` if it is still open after `deadline`.
async fn read_until_closed(stream: &mut TcpStream, deadline: Duration) -> Option<String> {
    let mut received = Vec::new();
    let read = tokio::time::timeout(deadline, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    read.ok().map(|()| String::from_utf8_lossy(&received).into_owned())
}

/// The status code of a raw HTTP/1.1 response.
fn status_of(response: &str) -> u16 {
    response.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or_else(|| panic!("no status in {response:?}"))
}

/// A header of a raw response (names compared case-insensitively).
fn header_of<'a>(response: &'a str, name: &str) -> Option<&'a str> {
    let head = response.split("\r\n\r\n").next()?;
    head.lines().skip(1).find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// 1,000 slowloris connections, each sending a header line every 500 ms and never finishing the
/// head, are all closed by the header-read timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slowloris_connections_are_closed_by_the_header_read_timeout() {
    let served = Served::start(&[], None).await;
    let addr = served.server.addr;
    let tasks: Vec<_> = (0..1000)
        .map(|i| {
            tokio::spawn(async move {
                let mut stream = TcpStream::connect(addr).await.unwrap();
                stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await.unwrap();
                let (mut read, mut write) = stream.into_split();
                let dribble = async move {
                    for n in 0.. {
                        if write.write_all(format!("X-Slow-{i}-{n}: a\r\n").as_bytes()).await.is_err() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                };
                let closed = async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = read.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                    }
                };
                tokio::time::timeout(DEADLINE, async {
                    tokio::select! {
                        () = dribble => {},
                        () = closed => {},
                    }
                })
                .await
                .is_ok()
            })
        })
        .collect();
    let mut closed = 0;
    for task in tasks {
        closed += usize::from(task.await.unwrap());
    }
    assert_eq!(closed, 1000, "every slowloris connection is closed by the server");
    // The server is still fine.
    let probe = reqwest::get(served.server.url("/healthz")).await.unwrap();
    assert_eq!(probe.status(), StatusCode::OK);
}

/// 200 bodies sent a byte every 500 ms (half to the API, half to the login form) are answered
/// 408 with a problem document when the body timeout runs out, and the connection is closed;
/// no key was claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_bodies_are_answered_408_by_the_body_timeout() {
    let served = Served::start(&[], None).await;
    let api_key = served.database.customer("acme").await;
    let addr = served.server.addr;
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let head = if i % 2 == 0 {
                format!(
                    "POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {api_key}\r\nIdempotency-Key: {}\r\n\
                     Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
                    new_key()
                )
            } else {
                "POST /admin/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n\
                 Content-Length: 1000\r\n\r\n"
                    .to_owned()
            };
            tokio::spawn(async move {
                let stream = TcpStream::connect(addr).await.unwrap();
                let (mut read, mut write) = stream.into_split();
                write.write_all(head.as_bytes()).await.unwrap();
                let dribble = tokio::spawn(async move {
                    for _ in 0..1000 {
                        if write.write_all(b" ").await.is_err() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                });
                let mut response = Vec::new();
                let answered = tokio::time::timeout(DEADLINE, read.read_to_end(&mut response)).await;
                dribble.abort();
                (answered.is_ok(), String::from_utf8_lossy(&response).into_owned())
            })
        })
        .collect();
    for task in tasks {
        let (closed, response) = task.await.unwrap();
        assert!(closed, "the connection was closed: {response:?}");
        assert_eq!(status_of(&response), 408, "{response}");
        assert_eq!(header_of(&response, "content-type"), Some("application/problem+json"), "{response}");
        assert!(response.contains("https://payonce.dev/problems/request-timeout"), "{response}");
    }
    assert_eq!(served.database.count("idempotency_keys").await, 0);
}

/// A body declared as 10 GB, of which one byte is sent, is refused at once with 413 (from the
/// declared length), on the API and on the unauthenticated login form; the connection is closed.
#[tokio::test]
async fn a_huge_declared_body_is_refused_at_once() {
    let served = Served::start(&[], None).await;
    let api_key = served.database.customer("acme").await;
    let heads = [
        format!(
            "POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {api_key}\r\nIdempotency-Key: {}\r\n\
             Content-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n{{",
            new_key()
        ),
        "POST /admin/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: 10000000000\r\n\r\nn"
            .to_owned(),
    ];
    for head in heads {
        let mut stream = TcpStream::connect(served.server.addr).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        let response = read_until_closed(&mut stream, DEADLINE).await.expect("an answer, and the connection closed");
        assert_eq!(status_of(&response), 413, "{response}");
        assert_eq!(header_of(&response, "content-type"), Some("application/problem+json"), "{response}");
        assert!(response.contains("https://payonce.dev/problems/payload-too-large"), "{response}");
    }
    assert_eq!(served.database.count("idempotency_keys").await, 0);
}

/// A body over the limit sent in chunks (no `Content-Length` to refuse it by) is a 413 problem
/// once the limit is passed, like a declared one: on the API (64 KiB), the login form (16 KiB)
/// and the webhook endpoint (256 KiB); nothing is used, and the connection is closed.
#[tokio::test]
async fn a_chunked_body_over_the_limit_is_413() {
    let served = Served::start(&[("STRIPE_WEBHOOK_SECRET", "whsec_test")], None).await;
    let api_key = served.database.customer("acme").await;
    let cases = [
        (
            format!(
                "POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {api_key}\r\nIdempotency-Key: {}\r\n\
                 Content-Type: application/json\r\n",
                new_key()
            ),
            70 * 1024,
        ),
        ("POST /admin/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n".to_owned(), 20 * 1024),
        (
            "POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nStripe-Signature: t=1,v1=00\r\nContent-Type: application/json\r\n"
                .to_owned(),
            300 * 1024,
        ),
    ];
    for (head, size) in cases {
        let mut stream = TcpStream::connect(served.server.addr).await.unwrap();
        stream.write_all(format!("{head}Transfer-Encoding: chunked\r\n\r\n").as_bytes()).await.unwrap();
        // 4 KiB chunks of spaces, then the last chunk; the server may answer (and stop reading)
        // before the end, so a failed write is not the test's failure.
        let chunk = format!("1000\r\n{}\r\n", " ".repeat(4096));
        for _ in 0..size / 4096 {
            if stream.write_all(chunk.as_bytes()).await.is_err() {
                break;
            }
        }
        let _ = stream.write_all(b"0\r\n\r\n").await;
        let response = read_until_closed(&mut stream, DEADLINE).await.expect("an answer, and the connection closed");
        let path = head.split(' ').nth(1).unwrap();
        assert_eq!(status_of(&response), 413, "{path}: {response}");
        assert_eq!(header_of(&response, "content-type"), Some("application/problem+json"), "{path}: {response}");
        assert!(response.contains("https://payonce.dev/problems/payload-too-large"), "{path}: {response}");
    }
    assert_eq!(served.database.count("idempotency_keys").await, 0);
    assert_eq!(served.database.count("webhook_events").await, 0);
}

/// With the common limit of 1,024 file descriptors, 1,100 idle connections do not lock other
/// clients out: the connection cap is clamped below the limit (and says so), idle connections
/// are closed by the timeout, and a probe request is answered; `accept` never fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_connections_beyond_the_fd_limit_do_not_lock_clients_out() {
    let mut served = Served::start(&[], Some(1024)).await;
    let addr: SocketAddr = served.server.addr;
    let mut idle = Vec::new();
    for _ in 0..1100 {
        idle.push(TcpStream::connect(addr).await.expect("the kernel queues the connection"));
    }
    let client = reqwest::Client::builder().timeout(DEADLINE).build().unwrap();
    let probe = client.get(served.server.url("/healthz")).send().await.expect("the probe is answered");
    assert_eq!(probe.status(), StatusCode::OK);
    served.server.wait_for_line("connection cap", Duration::from_secs(5)).await;
    let lines = served.server.lines();
    assert!(
        !lines.iter().any(|line| line.contains("Too many open files")),
        "accept never ran out of file descriptors: {lines:#?}"
    );
    drop(idle);
}

/// What hyper answers by itself, before any of payonce's code runs (docs/errors.md): a header
/// value with a NUL byte is a 400, more than 100 header fields a 431, each with an empty body,
/// and the connection is closed.
#[tokio::test]
async fn hyper_rejects_malformed_heads_itself() {
    let served = Served::start(&[], None).await;
    let many: String = (0..101).map(|i| format!("X-H{i}: v\r\n")).collect();
    let cases = [
        ("GET /healthz HTTP/1.1\r\nHost: x\r\nIdempotency-Key: a\0b\r\n\r\n".to_owned(), 400),
        (format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{many}\r\n"), 431),
    ];
    for (request, status) in cases {
        let mut stream = TcpStream::connect(served.server.addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let response = read_until_closed(&mut stream, DEADLINE).await.expect("an answer, and the connection closed");
        assert_eq!(status_of(&response), status, "{response}");
        assert_eq!(header_of(&response, "content-length"), Some("0"), "{response}");
    }
}
