//! `flotilla-relay`: drains the transactional outbox to the event topic
//! (guarantee 8 in docs/architecture.md). Rows are published keyed by job id
//! and marked PUBLISHED only after the broker acknowledged them: at least
//! once, with the same `event_id` on a repeat. A job's next event leaves
//! only after its previous one was acknowledged and marked (the `stream` module), so
//! per-job order does not rest on the broker's handling of producer
//! retries; across replicas it comes from bucket ownership ([`buckets`]).

pub mod buckets;
pub mod config;
pub mod health;
pub mod partitions;
pub mod placement;
pub mod producer;
pub mod publisher;
pub mod startup;
pub mod step_requests;
mod stream;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use flotilla_codec::CodecError;
use flotilla_store::Clock;
use flotilla_store::outbox::relay as outbox;
use flotilla_store::wake::{self, Channel};
use futures_util::FutureExt as _;
use rdkafka::error::KafkaError;
use rdkafka::producer::FutureProducer;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use config::RelaySettings;
use publisher::{DrainReport, Marks, Publisher};
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
    /// Reads the event topic's recorded partition count, which places
    /// records, and stops publishing when the topic has fewer partitions.
    partitions: partitions::PartitionGuard,
    settings: RelaySettings,
    /// Woken by the workers' `NOTIFY` after commits that wrote events.
    events_committed: Arc<Notify>,
    /// The same ring, for the step request sender.
    requests_committed: Arc<Notify>,
    /// Reads of pending rows answered (rows or not).
    reads: Arc<AtomicU64>,
}

/// Bounds the relay's transaction on `conn` by its bucket `lease`: a relay
/// that stalls inside it (a paused process keeps its connection, and with
/// it the row locks of its marks and leases) loses its session after
/// `lease` idle, so the relay that takes its buckets over is not held up;
/// and a lock this relay waits for gives up after a third of `lease`, so
/// its loop goes on renewing.
pub(crate) async fn bound_transaction(
    conn: &mut sqlx::PgConnection,
    lease: Duration,
) -> Result<(), sqlx::Error> {
    let ms = |d: Duration| format!("{}ms", d.as_millis().max(1));
    flotilla_store::sql::query(
        "SELECT set_config('idle_in_transaction_session_timeout', $1, true),
                set_config('lock_timeout', $2, true)",
    )
    .bind(ms(lease))
    .bind(ms(lease / 3))
    .execute(conn)
    .await?;
    Ok(())
}

/// How often a relay checks whether the outbox's statistics lag.
const STATISTICS_INTERVAL: Duration = Duration::from_secs(5);

/// First wait of an idle relay, unless set; it doubles up to the maximum.
pub const DEFAULT_IDLE_POLL_MIN: Duration = Duration::from_millis(5);

impl Relay {
    /// Builds the relay and its producer: idempotent unless told otherwise
    /// ([`RelaySettings::idempotence`]; then acknowledged per record, see
    /// [`flotilla_runtime::BrokerConfig::acknowledged_producer`]).
    ///
    /// # Errors
    /// The producer cannot be created.
    pub fn new(
        pool: PgPool,
        clock: Arc<dyn Clock>,
        settings: RelaySettings,
    ) -> Result<Self, RelayError> {
        let mut config = if settings.idempotence {
            settings.broker.idempotent_producer()
        } else {
            settings.broker.acknowledged_producer()
        };
        let window = settings.send_window();
        if settings
            .delivery_timeout
            .is_some_and(|timeout| window < timeout)
        {
            tracing::warn!(delivery_timeout = ?settings.delivery_timeout, lease = ?settings.lease, used = ?window,
                "the delivery timeout is longer than a third of the bucket lease; records are failed after a third of the lease");
        }
        config
            .set("queue.buffering.max.ms", "5")
            .set("message.timeout.ms", window.as_millis().to_string())
            .set("message.max.bytes", settings.max_message_bytes.to_string());
        let producer: FutureProducer = config.create()?;
        let producer = producer::Producer::new(config, producer);
        let codec = Arc::new(flotilla_codec::Codec::from_config(
            &settings.broker.registry,
        )?);
        let leases =
            buckets::BucketLeases::new(pool.clone(), settings.relay_id.clone(), settings.lease);
        let partitions = partitions::PartitionGuard::new(
            settings.broker.clone(),
            &settings.event_topic,
            settings.accept_partition_change,
        );
        let publisher = Publisher::new(
            producer,
            codec,
            settings.event_topic.clone(),
            leases.held().clone(),
            window,
            partitions.recorded(),
        );
        Ok(Self {
            pool,
            clock,
            leases,
            publisher,
            partitions,
            settings,
            events_committed: Arc::new(Notify::new()),
            requests_committed: Arc::new(Notify::new()),
            reads: Arc::default(),
        })
    }

    /// One pass, without marking: takes its share of buckets and sends the
    /// head of each of their jobs, renewing the leases meanwhile, and waits
    /// for the acknowledgements (up to the delivery timeout).
    ///
    /// # Errors
    /// Database errors.
    pub async fn publish_once(&self) -> Result<Marks, sqlx::Error> {
        self.partitions.check(&self.pool).await?;
        if !self.partitions.allowed() {
            return Ok(Marks::default());
        }
        let now = self.clock.now();
        let buckets = self.leases.rebalance().await?;
        let rows = {
            let mut conn = self.pool.acquire().await?;
            outbox::publishable(&mut conn, &buckets, now, self.settings.batch_size)
                .await?
                .rows
        };
        let _renewing = self.leases.keep_renewing();
        let deadline = tokio::time::Instant::now() + self.settings.send_window();
        Ok(self.publisher.publish(rows, deadline).await)
    }

    /// One pass, then marking (fenced on the buckets still held). The
    /// running relay streams instead ([`Relay::run`]); a pass is for tools
    /// and tests that want one step at a time.
    ///
    /// # Errors
    /// Database errors (nothing acknowledged is lost: it is published again).
    pub async fn drain_once(&self) -> Result<DrainReport, sqlx::Error> {
        self.publisher.replace_producer_if_fatal();
        let batch = self.publish_once().await?;
        batch
            .mark(
                &self.pool,
                self.leases.relay_id(),
                self.clock.now(),
                self.settings.backoff_base,
                self.settings.lease,
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
            bound_transaction(&mut tx, self.settings.lease).await?;
            // Through the published rows' index and the key, as the marks
            // are, even before the table's statistics catch up.
            outbox::prefer_indexes(&mut tx).await?;
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

    /// The publisher (its counts of slow acknowledgements, for tests).
    #[must_use]
    pub fn publisher(&self) -> &Publisher {
        &self.publisher
    }

    /// The watch over the event topic's partition count.
    #[must_use]
    pub fn partitions(&self) -> &partitions::PartitionGuard {
        &self.partitions
    }

    /// Checks the event topic's partition count every few seconds (records
    /// are placed by the recorded one, learnt here, and the stream
    /// publishes only while the topic has that many).
    async fn partitions_loop(&self, shutdown: CancellationToken) {
        let mut ticks = tokio::time::interval(STATISTICS_INTERVAL);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = shutdown.cancelled() => return,
            }
            if let Err(e) = self.partitions.check(&self.pool).await {
                tracing::warn!(error = %e, "checking the event topic's partition count failed");
            }
        }
    }

    /// Keeps the planner's statistics of the outbox in step with its size
    /// (see [`outbox::analyze_if_stale`]), on one relay at a time, every
    /// few seconds, away from the publishing loop.
    async fn statistics_loop(&self, shutdown: CancellationToken) {
        let mut ticks = tokio::time::interval(STATISTICS_INTERVAL);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = shutdown.cancelled() => return,
            }
            let checked = async {
                let mut tx = self.pool.begin().await?;
                bound_transaction(&mut tx, self.settings.lease).await?;
                let analyzed = outbox::analyze_if_stale(&mut tx).await?;
                tx.commit().await?;
                Ok::<_, sqlx::Error>(analyzed == Some(true))
            };
            match checked.await {
                Ok(true) => {
                    tracing::info!("the outbox's statistics lagged behind its size; analyzed it")
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "checking the outbox's statistics failed"),
            }
        }
    }

    /// Reads of pending rows answered so far: for tests that must know the
    /// relay has looked once and is idle, and for diagnostics.
    #[must_use]
    pub fn reads_answered(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// Wakes the idle stream when a worker says it committed events.
    async fn listen_for_events(&self, shutdown: CancellationToken) {
        if !self.settings.listen_for_events {
            return;
        }
        let wake = || {
            self.events_committed.notify_one();
            self.requests_committed.notify_one();
        };
        wake::listen(self.pool.clone(), Channel::Outbox, wake, shutdown).await;
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

    /// Publishes until `shutdown`, streaming (the `stream` module); then what is on
    /// its way is awaited (up to `grace`) and marked, and the buckets are
    /// released. A panic in the loop is logged and counted, and the loop
    /// starts again: what it had sent stays PENDING and goes again.
    pub async fn run(&self, shutdown: CancellationToken, grace: Duration) {
        self.run_reporting(shutdown, grace, &health::Readiness::default())
            .await;
    }

    /// [`Relay::run`], telling `readiness` whether the world is holding
    /// rows back.
    pub async fn run_reporting(
        &self,
        shutdown: CancellationToken,
        grace: Duration,
        readiness: &health::Readiness,
    ) {
        // The partition count is known before anything is published.
        if let Err(e) = self.partitions.check(&self.pool).await {
            tracing::warn!(error = %e, "checking the event topic's partition count failed");
        }
        let retention = {
            let (relay, stop) = (self.clone(), shutdown.clone());
            tokio::spawn(async move {
                tokio::join!(
                    relay.retention_loop(stop.clone()),
                    relay.statistics_loop(stop.clone()),
                    relay.partitions_loop(stop.clone()),
                    relay.step_request_loop(stop.clone()),
                    relay.listen_for_events(stop)
                );
            })
        };
        while !shutdown.is_cancelled() {
            let streamed = AssertUnwindSafe(stream::run(self, &shutdown, grace, readiness))
                .catch_unwind()
                .await;
            if streamed.is_err() {
                tracing::error!("the relay's loop panicked; its rows stay PENDING and go again");
                metrics::counter!("flotilla_relay_round_panics_total").increment(1);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    () = shutdown.cancelled() => {}
                }
            }
        }
        let _ = tokio::time::timeout(grace, retention).await;
        // Nothing still waiting inside the producer may leave once the
        // buckets are given up (what is on the wire already has left).
        self.publisher.purge_waiting();
        if let Err(e) = self.leases.release_all().await {
            tracing::warn!(error = %e, "releasing buckets failed; they expire with their lease");
        }
    }
}
