//! Logging set-up shared by the binaries.

use clap::Args;
use tracing_subscriber::EnvFilter;

/// The log filter used when none is configured.
pub const DEFAULT_LOG_FILTER: &str = "info";

#[derive(Debug, Clone, Args)]
pub struct TelemetryConfig {
    /// Log filter in `RUST_LOG` syntax.
    #[arg(long, env = "RUST_LOG", default_value = DEFAULT_LOG_FILTER)]
    pub log_filter: String,

    /// Log as JSON lines (for collectors) instead of text.
    #[arg(long, env = "FLOTILLA_LOG_JSON", default_value_t = false)]
    pub log_json: bool,
}

/// Logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("log filter: {0}")]
    Filter(#[from] tracing_subscriber::filter::ParseError),
    #[error("installing the log subscriber: {0}")]
    Install(String),
}

/// Installs the global subscriber.
///
/// # Errors
/// The filter does not parse, or a subscriber is already installed.
pub fn init(config: &TelemetryConfig) -> Result<(), TelemetryError> {
    let filter = EnvFilter::try_new(&config.log_filter)?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let installed = if config.log_json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
    installed.map_err(|e| TelemetryError::Install(e.to_string()))
}
