//! Logging: human-readable or JSON lines, always on stderr (stdout belongs to command output, such
//! as the API key printed by `payonce customers create`).

use tracing_subscriber::EnvFilter;

/// The log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One readable line per event, with the request's span (and so its id) in front.
    Pretty,
    /// One JSON object per line, for log collectors.
    Json,
}

/// The filter used when `RUST_LOG` is not set.
const DEFAULT_FILTER: &str = "info,sqlx=warn";

/// Installs the global subscriber. Safe to call more than once (later calls do nothing).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().with_current_span(true).with_span_list(false).try_init(),
    };
}
