//! TEMPORARY STUB: replaced by the simulator branch.
#![allow(missing_docs, clippy::all, unused)]
use std::net::SocketAddr;
#[derive(Clone, Default)]
pub struct Simulator;
impl Simulator {
    pub fn new() -> Self {
        Self
    }
}
pub struct RunningSimulator;
impl RunningSimulator {
    pub fn base_url(&self) -> String {
        todo!()
    }
    pub async fn shutdown(self) {}
}
pub async fn start(_addr: SocketAddr) -> std::io::Result<RunningSimulator> {
    todo!()
}
pub async fn serve(
    _l: tokio::net::TcpListener,
    _s: Simulator,
    _f: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    todo!()
}
