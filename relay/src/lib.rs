//! `flotilla-relay`: drains the transactional outbox to the event topic
//! (guarantee 8 in docs/architecture.md). Rows are written once and never
//! updated: a bucket's rows go out in batches bounded by snapshots
//! (`flotilla_store::outbox::relay`), keyed by job id, and the bucket's
//! progress moves only after the broker acknowledged its whole batch: at
//! least once, with the same `event_id` on a repeat. Within a batch a job's
//! events go in order, one producer, one partition per job; the idempotent
//! producer keeps that order across its retries. Told its broker does not
//! check the idempotent producer's sequences (`FLOTILLA_RELAY_IDEMPOTENCE=false`),
//! the relay sends a job's next event only after the previous one was
//! acknowledged (pages of one event per job). Across replicas order comes
//! from bucket ownership ([`buckets`]).

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
    /// next batch of each, renewing the leases meanwhile, and waits for the
    /// acknowledgements (up to the delivery timeout). A batch goes whole in
    /// one wave, or, when only one event of a job may be in flight, in
    /// waves of one event per job; a batch the world held a row of back
    /// stops there and is not finished.
    ///
    /// # Errors
    /// Database errors.
    pub async fn publish_once(&self) -> Result<Marks, sqlx::Error> {
        self.partitions.check(&self.pool).await?;
        let mut marks = Marks::default();
        if !self.partitions.allowed() {
            return Ok(marks);
        }
        let buckets = self.leases.rebalance().await?;
        let mut batches = {
            let mut conn = self.pool.acquire().await?;
            outbox::plan(&mut conn, &buckets).await?
        };
        let _renewing = self.leases.keep_renewing();
        let deadline = tokio::time::Instant::now() + self.settings.send_window();
        while !batches.is_empty() {
            let mut keys = Vec::new();
            let mut pages = Vec::new();
            for batch in &batches {
                let len = self.page_len(&batch.rows, usize::MAX);
                keys.extend_from_slice(&batch.rows[..len]);
                pages.push(len);
            }
            let rows = {
                let mut conn = self.pool.acquire().await?;
                outbox::fetch(&mut conn, &keys).await?
            };
            self.publisher.publish(rows, deadline, &mut marks).await;
            let held_back: Vec<i16> = marks.deferred_buckets().collect();
            let mut rest = Vec::new();
            for (mut batch, len) in batches.into_iter().zip(pages) {
                if held_back.contains(&batch.bucket) {
                    continue;
                }
                batch.rows.drain(..len);
                if batch.rows.is_empty() {
                    marks.finish(batch.bucket, batch.from, batch.to);
                } else {
                    rest.push(batch);
                }
            }
            batches = rest;
        }
        Ok(marks)
    }

    /// How many of a batch's next `rows` one page takes, at most `most`:
    /// all, or, when only one event of a job may be in flight (a broker
    /// that does not check the idempotent producer's sequences), up to the
    /// first row of a job already in the page.
    pub(crate) fn page_len(&self, rows: &[outbox::Planned], most: usize) -> usize {
        if self.settings.idempotence {
            rows.len().min(most)
        } else {
            outbox::one_per_job(rows, most)
        }
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
            .mark(&self.pool, self.leases.relay_id(), self.settings.lease)
            .await
    }

    /// Deletes published rows written longer ago than the retention, in
    /// bounded rounds, unless another relay is doing it right now. Returns
    /// how many.
    ///
    /// # Errors
    /// Database errors.
    pub async fn apply_retention(&self) -> Result<u64, sqlx::Error> {
        let cutoff = self.clock.now() - self.settings.retention;
        // The batch is shared among the buckets, each read in its own order.
        let per_bucket = (self.settings.retention_batch / 64).max(1);
        let mut deleted = 0;
        loop {
            let mut tx = self.pool.begin().await?;
            bound_transaction(&mut tx, self.settings.lease).await?;
            // Through the `(bucket, txid, id)` index, even before the
            // table's statistics catch up.
            outbox::prefer_indexes(&mut tx).await?;
            let Some(count) = outbox::delete_published_before(&mut tx, cutoff, per_bucket).await?
            else {
                tx.rollback().await?;
                return Ok(deleted); // another relay holds the retention lock
            };
            tx.commit().await?;
            deleted += count;
            if count == 0 {
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
    /// starts again: the batches it had under way go again.
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
                tracing::error!("the relay's loop panicked; its batches go again");
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
