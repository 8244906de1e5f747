//! A recording proxy: every request it forwards, and the answer it got, kept for the conformance
//! checks. Put in front of the simulator it sees what payonce's gateway client sends and what the
//! simulator answers; put in front of payonce's webhook route it sees the simulator's deliveries.
//! Nothing is changed on the way: a lost answer (the simulator broke the connection) is lost for
//! the client too.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};

/// One request, and the answer to it (`None`: the connection broke before an answer).
#[derive(Clone, Debug)]
pub struct Exchange {
    pub method: Method,
    pub path: String,
    pub query: Option<String>,
    pub request_headers: HeaderMap,
    pub request_body: Bytes,
    pub answer: Option<Answer>,
}

#[derive(Clone, Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Exchange {
    /// A request header, as text.
    pub fn request_header(&self, name: &str) -> Option<&str> {
        self.request_headers.get(name).and_then(|value| value.to_str().ok())
    }
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }
}

struct Inner {
    target: String,
    client: reqwest::Client,
    exchanges: Mutex<Vec<Exchange>>,
}

/// A proxy on a free port of 127.0.0.1, forwarding to `target` (a base URL ending in `/`).
pub struct Recorder {
    /// The proxy's base URL (`http://127.0.0.1:PORT/`).
    pub url: String,
    inner: Arc<Inner>,
    _server: tokio::task::JoinHandle<()>,
}

impl Recorder {
    pub async fn start(target: &str) -> Self {
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("a client");
        let inner =
            Arc::new(Inner { target: target.trim_end_matches('/').to_owned(), client, exchanges: Mutex::default() });
        let router = axum::Router::new().fallback(forward).with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.expect("bind");
        let url = format!("http://{}/", listener.local_addr().expect("addr"));
        let server = tokio::spawn(async move {
            axum::serve(listener, router).await.expect("the recorder serves");
        });
        Self { url, inner, _server: server }
    }

    /// Everything forwarded so far, in the order the answers came.
    pub fn exchanges(&self) -> Vec<Exchange> {
        self.inner.exchanges.lock().expect("recorder lock").clone()
    }
}

async fn forward(State(inner): State<Arc<Inner>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default();
    let path_and_query = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let mut outgoing = inner.client.request(parts.method.clone(), format!("{}{path_and_query}", inner.target));
    for (name, value) in &parts.headers {
        if !matches!(name.as_str(), "host" | "content-length" | "connection") {
            outgoing = outgoing.header(name, value);
        }
    }
    let answer = match outgoing.body(body.clone()).send().await {
        Ok(response) => {
            let status = response.status();
            let headers = response.headers().clone();
            response.bytes().await.ok().map(|body| Answer { status, headers, body })
        }
        Err(_) => None,
    };
    inner.exchanges.lock().expect("recorder lock").push(Exchange {
        method: parts.method,
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().map(str::to_owned),
        request_headers: parts.headers,
        request_body: body,
        answer: answer.clone(),
    });
    let Some(answer) = answer else {
        // The answer was lost upstream: lose it here too (a body that fails aborts the connection).
        let failing = futures_util::stream::once(async { Err::<Bytes, _>(std::io::Error::other("lost upstream")) });
        return (StatusCode::OK, Body::from_stream(failing)).into_response();
    };
    let mut response = (answer.status, answer.body).into_response();
    for (name, value) in &answer.headers {
        if !matches!(name.as_str(), "content-length" | "transfer-encoding" | "connection") {
            response.headers_mut().append(name, value.clone());
        }
    }
    response
}
