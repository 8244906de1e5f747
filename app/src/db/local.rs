//! TEMPORARY STUB: replaced by the localpg branch.
#![allow(clippy::all, unused)]
use std::path::Path;
pub struct LocalPostgres;
#[derive(Debug, thiserror::Error)]
pub enum LocalPostgresError {
    #[error("stub")]
    NotInstalled,
}
impl LocalPostgres {
    pub async fn start(_dir: &Path) -> Result<LocalPostgres, LocalPostgresError> {
        todo!()
    }
    pub fn url(&self, _db: &str) -> String {
        todo!()
    }
    pub async fn stop(self) -> Result<(), LocalPostgresError> {
        Ok(())
    }
}
