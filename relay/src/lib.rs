//! `flotilla-relay`: drains the transactional outbox to the event topic
//! (guarantee 8 in docs/architecture.md). Rows are published oldest first, keyed by job id,
//! with the idempotent producer, and marked PUBLISHED only after the broker
//! acknowledged them: at least once, with the same `event_id` on a repeat.
//! Per-job order across replicas comes from bucket ownership ([`buckets`]).

pub mod buckets;
pub mod config;
pub mod health;
pub mod publisher;
pub mod startup;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use flotilla_codec::CodecError;
use flotilla_runtime::backoff::Doubling;
use flotilla_store::Clock;
use flotilla_store::outbox::relay as outbox;
use futures_util::FutureExt as _;
use rdkafka::error::KafkaError;
use rdkafka::producer::FutureProducer;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

pub use config::RelaySettings;
use publisher::{DrainReport, PublishedBatch, Publisher};
pub use startup::{StartupError, replay_failed, run};

/// The relay's clients could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("creating the producer: {0}")]
    Producer(#[from] KafkaError),
    #[error("configuring the schema registry: {0}")]
    Registry(#[from] CodecError),
}

/// A relay: its bucket leases, its producer and its settings.
#[derive(Debug, Clone)]
pub struct Relay {
    pool: PgPool,
    clock: Arc<dyn Clock>,
    leases: buckets::BucketLeases,
    publisher: Publisher,
    settings: RelaySettings,
}

const IDLE_POLL_MIN: Duration = Duration::from_millis(5);

impl Relay {
    /// Builds the relay and its idempotent producer.
    ///
    /// # Errors
    /// The producer cannot be created.
    pub fn new(
        pool: PgPool,
        clock: Arc<dyn Clock>,
        settings: RelaySettings,
    ) -> Result<Self, RelayError> {
        let mut config = settings.broker.idempotent_producer();
        config
            .set("linger.ms", "5")
            .set(
                "message.timeout.ms",
                settings.delivery_timeout.as_millis().to_string(),
            )
            .set("message.max.bytes", settings.max_message_bytes.to_string());
        let producer: FutureProducer = config.create()?;
        let codec = Arc::new(flotilla_codec::Codec::from_config(
            &settings.broker.registry,
        )?);
        let publisher = Publisher::new(producer, codec, settings.event_topic.clone());
        let leases =
            buckets::BucketLeases::new(pool.clone(), settings.relay_id.clone(), settings.lease);
        Ok(Self {
            pool,
            clock,
            leases,
            publisher,
            settings,
        })
    }

    /// Takes its share of buckets and publishes what they hold, renewing
    /// the leases meanwhile, without marking.
    ///
    /// # Errors
    /// Database errors.
    pub async fn publish_once(&self) -> Result<PublishedBatch, sqlx::Error> {
        let now = self.clock.now();
        let buckets = self.leases.rebalance().await?;
        let rows = {
            let mut conn = self.pool.acquire().await?;
            outbox::publishable(&mut conn, &buckets, now, self.settings.batch_size).await?
        };
        let _renewing = self.leases.keep_renewing();
        let deadline = tokio::time::Instant::now() + self.settings.delivery_timeout;
        Ok(self
            .publisher
            .publish(rows, self.leases.held(), deadline)
            .await)
    }

    /// One round: publish, then mark (fenced on the buckets still held).
    ///
    /// # Errors
    /// Database errors (nothing acknowledged is lost: it is published again).
    pub async fn drain_once(&self) -> Result<DrainReport, sqlx::Error> {
        let batch = self.publish_once().await?;
        batch
            .mark(
                &self.pool,
                self.leases.relay_id(),
                self.clock.now(),
                self.settings.backoff_base,
            )
            .await
    }

    /// Deletes PUBLISHED rows older than the retention, in bounded batches,
    /// unless another relay is doing it right now. Returns how many.
    ///
    /// # Errors
    /// Database errors.
    pub async fn apply_retention(&self) -> Result<u64, sqlx::Error> {
        let cutoff = self.clock.now() - self.settings.retention;
        let batch = self.settings.retention_batch;
        let mut deleted = 0;
        loop {
            let mut tx = self.pool.begin().await?;
            let Some(count) = outbox::delete_published_before(&mut tx, cutoff, batch).await? else {
                tx.rollback().await?;
                return Ok(deleted); // another relay holds the retention lock
            };
            tx.commit().await?;
            deleted += count;
            if count < u64::try_from(batch).unwrap_or(u64::MAX) {
                return Ok(deleted);
            }
        }
    }

    /// Retention on its own schedule, whatever the load of the rounds.
    async fn retention_loop(&self, shutdown: CancellationToken) {
        let mut ticks = tokio::time::interval(self.settings.retention_interval);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = shutdown.cancelled() => return,
            }
            match self.apply_retention().await {
                Ok(0) => {}
                Ok(deleted) => tracing::info!(deleted, "retention deleted published rows"),
                Err(e) => tracing::warn!(error = %e, "retention failed"),
            }
        }
    }

    /// Publishes until `shutdown`; the round in flight finishes (its
    /// acknowledgements awaited and marked), then the buckets are released.
    /// Rounds the world held back (broker or registry unreachable) are
    /// followed by a pause that doubles up to 10 s; no attempt is spent.
    pub async fn run(&self, shutdown: CancellationToken, grace: Duration) {
        self.run_reporting(shutdown, grace, &health::Readiness::default())
            .await;
    }

    /// [`Relay::run`], telling `readiness` whether rounds are failing.
    pub async fn run_reporting(
        &self,
        shutdown: CancellationToken,
        grace: Duration,
        readiness: &health::Readiness,
    ) {
        let retention = {
            let (relay, stop) = (self.clone(), shutdown.clone());
            tokio::spawn(async move { relay.retention_loop(stop).await })
        };
        let mut idle = Doubling::new(IDLE_POLL_MIN, self.settings.idle_poll_max);
        let mut outage = Doubling::new(Duration::from_millis(200), Duration::from_secs(10));
        while !shutdown.is_cancelled() {
            // One round that panics is logged and counted; the relay goes on.
            let Ok(round) = AssertUnwindSafe(self.drain_once()).catch_unwind().await else {
                tracing::error!("relay round panicked; its rows stay PENDING");
                metrics::counter!("flotilla_relay_round_panics_total").increment(1);
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            };
            metrics::counter!("flotilla_relay_rounds_total").increment(1);
            metrics::gauge!("flotilla_relay_buckets_held").set(self.leases.held().count() as f64);
            let failing = match &round {
                Ok(report) => report.deferred > 0 && report.published == 0,
                Err(_) => true,
            };
            readiness.round_failed(failing);
            let pause = match round {
                Ok(report) => {
                    metrics::counter!("flotilla_relay_published_total")
                        .increment(report.published as u64);
                    metrics::counter!("flotilla_relay_publish_failures_total", "class" => "message")
                        .increment(report.failed as u64);
                    metrics::counter!("flotilla_relay_publish_failures_total", "class" => "world")
                        .increment(report.deferred as u64);
                    if report.deferred > 0 && report.published == 0 {
                        tracing::warn!(?report, "nothing could be published; pausing");
                        outage.next_pause()
                    } else if report.published + report.failed > 0 {
                        idle.reset();
                        outage.reset();
                        tracing::debug!(?report, "relay round");
                        continue;
                    } else {
                        outage.reset();
                        idle.next_pause()
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "relay round failed");
                    outage.next_pause()
                }
            };
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = shutdown.cancelled() => {}
            }
        }
        let _ = tokio::time::timeout(grace, retention).await;
        if let Err(e) = self.leases.release_all().await {
            tracing::warn!(error = %e, "releasing buckets failed; they expire with their lease");
        }
    }
}
