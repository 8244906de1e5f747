//! Flash messages: what an action says about itself on the page its redirect leads to
//! (post/redirect/get), shown once.

use serde::{Deserialize, Serialize};
use tower_sessions::Session;

use super::page::WebError;

const KEY: &str = "flash";

/// One message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Flash {
    /// `success`, `warning` or `error`: picks the colour *and* the word shown before the text.
    pub level: String,
    pub text: String,
}

impl Flash {
    pub fn success(text: impl Into<String>) -> Self {
        Self { level: "success".into(), text: text.into() }
    }

    pub fn warning(text: impl Into<String>) -> Self {
        Self { level: "warning".into(), text: text.into() }
    }

    pub fn error(text: impl Into<String>) -> Self {
        Self { level: "error".into(), text: text.into() }
    }

    /// The word shown before the message, so the meaning does not depend on colour.
    pub fn label(&self) -> &'static str {
        match self.level.as_str() {
            "success" => "Done",
            "warning" => "Note",
            _ => "Error",
        }
    }
}

/// Queues a message for the next page.
pub async fn push(session: &Session, flash: Flash) -> Result<(), WebError> {
    let mut queued: Vec<Flash> = session.get(KEY).await?.unwrap_or_default();
    queued.push(flash);
    session.insert(KEY, queued).await?;
    Ok(())
}

/// Takes the queued messages (they are shown once).
pub async fn take(session: &Session) -> Result<Vec<Flash>, WebError> {
    Ok(session.remove(KEY).await?.unwrap_or_default())
}
