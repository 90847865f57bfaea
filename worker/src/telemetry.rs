//! Logging set-up shared by the binaries.

use clap::Args;
use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Args)]
pub struct TelemetryConfig {
    /// Log filter in `RUST_LOG` syntax.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub log_filter: String,

    /// Log as JSON lines (for collectors) instead of text.
    #[arg(long, env = "FLOTILLA_LOG_JSON", default_value_t = false)]
    pub log_json: bool,
}

/// Installs the global subscriber.
///
/// # Errors
/// The filter does not parse, or a subscriber is already installed.
pub fn init(config: &TelemetryConfig) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(&config.log_filter)?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    if config.log_json {
        builder.json().try_init().map_err(|e| anyhow::anyhow!(e))
    } else {
        builder.try_init().map_err(|e| anyhow::anyhow!(e))
    }
}
