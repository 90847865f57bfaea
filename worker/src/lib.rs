//! `flotilla-worker`: a fleet member. For now it connects to Postgres and
//! Kafka, applies nothing it is not asked to, and waits for a shutdown
//! signal; the claim loops, the request consumer and the API arrive with
//! their issues. The binary is a thin shell over [`run`].

pub mod config;
pub mod db;
pub mod engine;
pub mod kafka;
pub mod shutdown;
pub mod store;
pub mod target;
pub mod telemetry;
pub mod workflow;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

pub use config::WorkerConfig;

/// Runs a worker until `shutdown` is cancelled.
///
/// # Errors
/// The database or the broker cannot be reached at start-up.
pub async fn run(config: WorkerConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let worker_id = config.worker_id()?;
    tracing::info!(%worker_id, "worker starting");
    let pool = db::connect(&config.database)
        .await
        .context("connecting to Postgres")?;
    kafka::check_reachable(
        &config.kafka.bootstrap_servers,
        config.kafka.connect_timeout,
    )
    .await
    .context("reaching the Kafka broker")?;
    tracing::info!(%worker_id, "worker ready");

    shutdown.cancelled().await;
    tracing::info!(%worker_id, "shutdown requested; stopping");
    pool.close().await;
    Ok(())
}
