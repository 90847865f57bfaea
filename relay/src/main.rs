//! `flotilla-relay`: drains the transactional outbox to the event topic.
//! For now it connects to Postgres and Kafka and waits for a shutdown
//! signal; draining arrives with the relay issue.

use anyhow::Context as _;
use clap::Parser;
use flotilla_worker::config::{DatabaseConfig, KafkaConfig};
use flotilla_worker::telemetry::{self, TelemetryConfig};
use flotilla_worker::{db, kafka, shutdown};

/// Publishes every committed outbox row to the event topic, keyed by job id.
#[derive(Debug, Parser)]
#[command(name = "flotilla-relay", version, about)]
struct RelayConfig {
    #[command(flatten)]
    database: DatabaseConfig,
    #[command(flatten)]
    kafka: KafkaConfig,
    #[command(flatten)]
    telemetry: TelemetryConfig,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = RelayConfig::parse();
    telemetry::init(&config.telemetry)?;
    let shutdown = shutdown::on_signal()?;
    let pool = db::connect(&config.database)
        .await
        .context("connecting to Postgres")?;
    kafka::check_reachable(
        &config.kafka.bootstrap_servers,
        config.kafka.connect_timeout,
    )
    .await
    .context("reaching the Kafka broker")?;
    tracing::info!("relay ready");
    shutdown.cancelled().await;
    tracing::info!("shutdown requested; stopping");
    pool.close().await;
    Ok(())
}
