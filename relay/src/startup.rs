//! Running a relay from its settings, and the operator's replay.

use std::sync::Arc;

use flotilla_runtime::kafka::{self, BrokerError};
use flotilla_store::outbox::relay as outbox;
use flotilla_store::{DatabaseConfig, SystemClock};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::config::RelayArgs;
use crate::{Relay, RelayError};

/// How long to wait for the broker at start-up.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Why a relay could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("connecting to Postgres: {0}")]
    Database(#[from] sqlx::Error),
    #[error("reaching the Kafka broker: {0}")]
    Broker(#[from] BrokerError),
    #[error(transparent)]
    Relay(#[from] RelayError),
    #[error("binding the health listener on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// Connects, ensures the event topic, and publishes until `shutdown`; what
/// is on its way is awaited within the grace period and marked, then the
/// buckets are released.
///
/// # Errors
/// The database or the broker cannot be reached, or the producer built.
pub async fn run(
    database: &DatabaseConfig,
    args: RelayArgs,
    shutdown: CancellationToken,
) -> Result<(), StartupError> {
    // Settings that are wrong on their own fail before anything is reached.
    args.broker
        .validate()
        .map_err(kafka::BrokerError::Settings)?;
    let pool = flotilla_store::connect(database).await?;
    kafka::check_reachable(&args.broker, CONNECT_TIMEOUT).await?;
    kafka::ensure_topics(&args.broker, &[&args.event_topic], args.topics).await?;
    let grace = *args.shutdown_grace;
    let readiness = crate::health::Readiness::default();
    let unfit = kafka::unfit_topics(&args.broker, &[&args.event_topic], &[]).await?;
    readiness.topic_unfit((!unfit.is_empty()).then(|| unfit.join("; ")));
    let server = crate::health::serve(
        args.http_addr,
        pool.clone(),
        readiness.clone(),
        shutdown.clone(),
    )
    .await
    .map_err(|source| StartupError::Bind {
        addr: args.http_addr,
        source,
    })?;
    let relay = Relay::new(pool.clone(), Arc::new(SystemClock), args.into())?;
    tracing::info!("relay ready");
    relay.run_reporting(shutdown, grace, &readiness).await;
    let _ = tokio::time::timeout(grace, server).await;
    tracing::info!("relay stopped");
    pool.close().await;
    Ok(())
}

/// Sends FAILED outbox rows (of one job, or all) again: each goes in its
/// bucket's next batch. Returns how many.
///
/// # Errors
/// The database cannot be reached.
pub async fn replay_failed(
    database: &DatabaseConfig,
    job_id: Option<Uuid>,
) -> Result<u64, sqlx::Error> {
    let pool = flotilla_store::connect(database).await?;
    let replayed = flotilla_store::sql::session(&pool, async |conn| {
        outbox::replay_failed(conn, job_id).await
    })
    .await?;
    tracing::info!(
        replayed,
        "FAILED outbox rows replayed: they go in their buckets' next batches"
    );
    Ok(replayed)
}
