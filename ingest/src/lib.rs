//! The request consumer: the request topic → rows (guarantee 9 in
//! docs/architecture.md), and the signal topic → signals kept in rows.
//! The same type, in a group of its own, reads the Kafka targets' reply
//! topics ([`ConsumerSettings::for_replies`]), so a request partition held
//! up by an outage or an unreadable message never holds replies up.
//!
//! A batch (up to `batch_size` messages or `batch_wait`) is decoded, its
//! requests submitted in one database transaction, its undecodable messages
//! dead-lettered (`persist.rs`), and only then are its offsets stored and
//! committed. Every message has exactly one outcome and the partition always
//! moves on; when Postgres (or the registry, or the dead-letter topic) is
//! unavailable the partitions are paused and the same batch retried with
//! backoff, committing nothing meanwhile.

mod context;
pub mod dead_letter;
mod offsets;
mod outage;
mod persist;
mod received;
mod reply_start;

use std::sync::Arc;
use std::time::Duration;

use flotilla_codec::Codec;
use flotilla_contracts::topics;
use flotilla_runtime::BrokerConfig;
use flotilla_runtime::kafka::GroupProtocol;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::FutureProducer;
use rdkafka::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

pub use context::RequestConsumerContext;
pub use flotilla_runtime::kafka::health::ConsumerHealth;
pub use outage::is_unreadable;
pub use persist::{BatchReport, Outage};
pub use received::Received;

use flotilla_engine::Engine;

/// Most requests persisted in one transaction, unless configured.
pub const DEFAULT_BATCH_SIZE: usize = 500;
/// How long a batch waits to fill once its first request arrived, unless
/// configured: not at all. A batch takes what has arrived by then, which
/// under load is what came while the batch before it was being persisted,
/// so batches grow with the load without holding a lone request back (a
/// window of 100 ms put 50–100 ms on every request below the peak).
pub const DEFAULT_BATCH_WAIT: Duration = Duration::ZERO;
/// Requests above this many bytes are dead-lettered, unless configured.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1024 * 1024;
/// The most message bytes one batch holds in memory, unless configured.
pub const DEFAULT_BATCH_BYTES: usize = 16 * 1024 * 1024;
/// Longest pause between retries of a batch during an outage.
pub const DEFAULT_OUTAGE_BACKOFF_MAX: Duration = Duration::from_secs(10);
pub(crate) const OUTAGE_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// How long the consumer may stay paused by an outage before readiness
/// fails, unless configured.
pub const DEFAULT_PAUSED_UNREADY_AFTER: Duration = Duration::from_secs(120);
/// How long one dead-letter delivery may take before the batch is retried.
pub const DEAD_LETTER_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a stopping consumer waits for its final offset commit.
pub const FINAL_COMMIT_WAIT: Duration = Duration::from_secs(5);
/// Longest a stopping worker waits for its Kafka clients to close (the
/// consumer to leave its group) before it exits.
pub const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// How the consumer reads and batches.
#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    pub broker: BrokerConfig,
    pub request_topic: String,
    /// Whether it subscribes to `request_topic`: `false` for the reply
    /// consumer, which reads `reply_topics` alone.
    pub reads_requests: bool,
    /// `<request topic>.dlq` unless set otherwise.
    pub dead_letter_topic: String,
    /// The signal topic, read in the same batches (its dead letters go to
    /// `<signal topic>.dlq`); `None`: no signals from Kafka.
    pub signal_topic: Option<String>,
    /// The reply topics of the Kafka targets (their dead letters go to
    /// `<topic>.dlq`).
    pub reply_topics: Vec<String>,
    pub group: String,
    /// Static group membership (`group.instance.id`): a member restarted
    /// with the same id gets its partitions back at once, without a rebalance.
    pub group_instance_id: Option<String>,
    /// The consumer group protocol (classic, or KIP-848's consumer).
    pub group_protocol: GroupProtocol,
    pub batch_size: usize,
    /// A batch closes once its messages hold this many bytes.
    pub batch_bytes: usize,
    pub batch_wait: Duration,
    /// Requests above this many bytes are dead-lettered as oversize.
    pub max_request_bytes: usize,
    /// Longest pause between retries of a batch during an outage.
    pub outage_backoff_max: Duration,
    /// `max.poll.interval.ms` (and, under the classic protocol, the session
    /// timeout), when not librdkafka's default.
    pub max_poll_interval: Option<Duration>,
}

impl ConsumerSettings {
    /// Whether `topic` is the signal topic.
    #[must_use]
    pub fn is_signal_topic(&self, topic: &str) -> bool {
        self.signal_topic.as_deref() == Some(topic)
    }

    /// Whether `topic` is one of the Kafka targets' reply topics.
    #[must_use]
    pub fn is_reply_topic(&self, topic: &str) -> bool {
        self.reply_topics.iter().any(|reply| reply == topic)
    }

    /// Where a bad message from `topic` goes.
    #[must_use]
    pub fn dead_letter_topic_of(&self, topic: &str) -> String {
        if self.is_signal_topic(topic) || self.is_reply_topic(topic) {
            topics::dead_letter_topic(topic)
        } else {
            self.dead_letter_topic.clone()
        }
    }

    #[must_use]
    pub fn new(broker: BrokerConfig, request_topic: &str, group: &str) -> Self {
        Self {
            broker,
            request_topic: request_topic.to_owned(),
            reads_requests: true,
            dead_letter_topic: topics::dead_letter_topic(request_topic),
            signal_topic: None,
            reply_topics: Vec::new(),
            group: group.to_owned(),
            group_instance_id: None,
            group_protocol: GroupProtocol::default(),
            batch_size: DEFAULT_BATCH_SIZE,
            batch_bytes: DEFAULT_BATCH_BYTES,
            batch_wait: DEFAULT_BATCH_WAIT,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            outage_backoff_max: DEFAULT_OUTAGE_BACKOFF_MAX,
            max_poll_interval: None,
        }
    }

    /// The reply consumer's settings, from the request consumer's: the same
    /// broker, batches and membership, in `group`, subscribed to the reply
    /// topics alone.
    #[must_use]
    pub fn for_replies(&self, group: &str) -> Self {
        Self {
            reads_requests: false,
            signal_topic: None,
            group: group.to_owned(),
            ..self.clone()
        }
    }

    /// The topics it subscribes to.
    #[must_use]
    pub fn subscriptions(&self) -> Vec<&str> {
        let requests = self.reads_requests.then_some(self.request_topic.as_str());
        requests
            .into_iter()
            .chain(self.signal_topic.as_deref())
            .chain(self.reply_topics.iter().map(String::as_str))
            .collect()
    }
}

/// A subscribed consumer with its dead-letter producer.
pub struct RequestConsumer {
    consumer: Arc<StreamConsumer<RequestConsumerContext>>,
    /// Replaced when it enters a fatal state (see `dead_letter::send`).
    dead_letters: std::sync::Mutex<FutureProducer>,
    health: Arc<ConsumerHealth>,
    engine: Engine,
    codec: Arc<Codec>,
    settings: ConsumerSettings,
    /// Set once a message could not be read: nothing is committed after it.
    stalled: std::sync::atomic::AtomicBool,
    /// Set once the client hit a fatal error (another member took its
    /// `group.instance.id`): it consumes nothing more.
    dead: std::sync::atomic::AtomicBool,
    /// Messages that arrived while riding out an outage, for the next batch.
    carried: std::sync::Mutex<Vec<Received>>,
    /// The offset this consumer last wrote to the database, per partition:
    /// the database holding less later means it lost commits (`offsets.rs`).
    kept: std::sync::Mutex<std::collections::HashMap<(String, i32), i64>>,
    /// Where this consumer started each partition it was assigned (the
    /// first offset it read of it): where to go back to when the database
    /// lost every offset of it, the one written before its first rows
    /// included (`offsets.rs`).
    started: std::sync::Mutex<std::collections::BTreeMap<(String, i32), i64>>,
    /// Partitions assigned with no offset in the database, until their
    /// first batch gives them one (`offsets.rs`, `anchor`).
    unanchored: std::sync::Mutex<std::collections::HashSet<(String, i32)>>,
    /// Times librdkafka said this member went too long without polling.
    poll_interval_exceeded: std::sync::atomic::AtomicU64,
}

/// What a consumer saw while it ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Times it went too long without polling (and so lost its group seat).
    pub poll_interval_exceeded: u64,
}

impl std::fmt::Debug for RequestConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestConsumer")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl RequestConsumer {
    /// Creates the consumer and subscribes it to its topics.
    ///
    /// # Errors
    /// The client cannot be created or subscribed.
    pub fn subscribe(
        engine: Engine,
        codec: Arc<Codec>,
        settings: ConsumerSettings,
    ) -> Result<Self, KafkaError> {
        let mut config = settings.broker.manual_commit_consumer(&settings.group);
        settings
            .group_protocol
            .configure(&mut config, settings.max_poll_interval);
        config
            // Offsets are still stored only after their rows commit (and
            // committed at once after each batch); librdkafka's timer also
            // commits what is stored, so a commit the broker refused (a
            // rebalance in progress) is made again with no new request to
            // trigger one, instead of leaving a quiet partition's offset
            // behind for good.
            .set("enable.auto.commit", "true")
            // Partition lag for /metrics (see `RequestConsumerContext::stats`).
            .set("statistics.interval.ms", "15000");
        if let Some(instance) = &settings.group_instance_id {
            config.set("group.instance.id", instance);
        }
        let consumer: StreamConsumer<RequestConsumerContext> =
            config.create_with_context(RequestConsumerContext::default())?;
        consumer.subscribe(&settings.subscriptions())?;
        let consumer = Arc::new(consumer);
        let dead_letters = dead_letter::producer(&settings.broker)?;
        Ok(Self {
            consumer,
            dead_letters: std::sync::Mutex::new(dead_letters),
            health: Arc::new(ConsumerHealth::of_group(&settings.group)),
            engine,
            codec,
            settings,
            stalled: std::sync::atomic::AtomicBool::new(false),
            dead: std::sync::atomic::AtomicBool::new(false),
            carried: std::sync::Mutex::new(Vec::new()),
            kept: std::sync::Mutex::default(),
            started: std::sync::Mutex::default(),
            unanchored: std::sync::Mutex::default(),
            poll_interval_exceeded: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The consumer's own state, for readiness.
    #[must_use]
    pub fn health(&self) -> Arc<ConsumerHealth> {
        self.health.clone()
    }

    /// Consumes until `shutdown`: batch, persist (retrying through outages), commit.
    pub async fn run(self, shutdown: CancellationToken) -> ConsumerStats {
        let mut next_audit = tokio::time::Instant::now() + offsets::AUDIT_INTERVAL;
        while let Some(mut batch) = self.take_batch(&shutdown, Some(next_audit)).await {
            let Some(rewound) = self.ride_out(&shutdown, || self.rewind()).await else {
                break;
            };
            self.drop_read_again(&mut batch, &rewound);
            if tokio::time::Instant::now() >= next_audit {
                // A partition sought back drops what the batch in hand
                // holds of it: those come again after the lost ones.
                let went_back = self.audit_kept_offsets().await;
                self.drop_read_again(&mut batch, &went_back);
                next_audit = tokio::time::Instant::now() + offsets::AUDIT_INTERVAL;
            }
            if batch.is_empty() {
                continue;
            }
            if self
                .ride_out(&shutdown, || self.anchor(&batch))
                .await
                .is_none()
            {
                break; // shut down mid-outage: nothing persisted or committed
            }
            let Some(report) = self.persist_until_done(&batch, &shutdown).await else {
                break; // shut down mid-outage: nothing committed, the batch is redelivered
            };
            tracing::debug!(messages = batch.len(), ?report, "batch persisted");
            // A partition the database went back on under this member is
            // sought back: nothing of it is committed from this batch.
            let went_back = self.keep_offsets(&batch).await;
            self.drop_read_again(&mut batch, &went_back);
            self.commit(&batch);
            if self.is_stalled() || self.is_dead() {
                // Keep the group seat (and the partitions paused) until told
                // to stop: an operator looks at the message that cannot be
                // read, or at the worker whose id another one took.
                shutdown.cancelled().await;
                break;
            }
        }
        self.final_commit().await;
        let stats = ConsumerStats {
            poll_interval_exceeded: self
                .poll_interval_exceeded
                .load(std::sync::atomic::Ordering::SeqCst),
        };
        self.close();
        stats
    }

    /// Commits what is durable one last time. librdkafka's synchronous
    /// commit has no timeout and waits for the group coordinator, which may
    /// never answer (down, or holding a rebalance that no poll serves any
    /// more): so it runs on a thread of its own, neither on the async
    /// runtime (it would stall the tasks sharing that thread) nor on its
    /// blocking pool (the runtime waits for those at exit), and is waited
    /// for at most [`FINAL_COMMIT_WAIT`]. What it leaves uncommitted the
    /// next owner reads again, and finds as rows already.
    async fn final_commit(&self) {
        let consumer = self.consumer.clone();
        let (done, committed) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("final-commit".into())
            .spawn(move || {
                let _ = done.send(consumer.commit_consumer_state(CommitMode::Sync));
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no thread for the final commit: the next owner reads the last requests again");
            return;
        }
        match tokio::time::timeout(FINAL_COMMIT_WAIT, committed).await {
            Ok(Ok(Ok(()))) | Ok(Err(_)) => {}
            Ok(Ok(Err(e))) => {
                tracing::debug!(error = %e, "final commit had nothing to do or failed");
            }
            Err(_) => tracing::warn!(
                waited = ?FINAL_COMMIT_WAIT,
                "the group coordinator did not answer the final commit: the next owner reads the last requests again"
            ),
        }
    }

    /// Waits for the next message, then takes more for up to `batch_wait`,
    /// `batch_size` messages or `batch_bytes` bytes (with no wait: those
    /// already fetched). `None` on shutdown.
    pub async fn next_batch(&self, shutdown: &CancellationToken) -> Option<Vec<Received>> {
        self.take_batch(shutdown, None).await
    }

    /// [`RequestConsumer::next_batch`]; with `audit_at`, an empty batch as
    /// soon as partitions are assigned or, when nothing came, at `audit_at`,
    /// for [`RequestConsumer::run`] to check the database's offsets.
    async fn take_batch(
        &self,
        shutdown: &CancellationToken,
        audit_at: Option<tokio::time::Instant>,
    ) -> Option<Vec<Received>> {
        let or_assigned = audit_at.is_some();
        let audit = tokio::time::sleep_until(audit_at.unwrap_or_else(tokio::time::Instant::now));
        tokio::pin!(audit);
        let limit = self.settings.max_request_bytes;
        let mut batch = std::mem::take(
            &mut *self
                .carried
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        while batch.is_empty() {
            tokio::select! {
                // Newly assigned partitions are checked against the
                // database's offsets before anything is read from them.
                () = self.consumer.context().assigned(), if or_assigned => return Some(batch),
                () = &mut audit, if or_assigned => return Some(batch),
                received = self.consumer.recv() => match received {
                    Ok(message) => batch.push(Received::take(&message, limit)),
                    Err(e) if self.stall_on(&e) || self.dies_on(&e) => {
                        shutdown.cancelled().await;
                        return None;
                    }
                    Err(e) => self.note_error(&e),
                },
                () = shutdown.cancelled() => return None,
            }
        }
        let mut bytes: usize = batch.iter().map(Received::held_bytes).sum();
        let deadline = tokio::time::Instant::now() + self.settings.batch_wait;
        while batch.len() < self.settings.batch_size && bytes < self.settings.batch_bytes {
            match tokio::time::timeout_at(deadline, self.consumer.recv()).await {
                Ok(Ok(message)) => {
                    let received = Received::take(&message, limit);
                    bytes += received.held_bytes();
                    batch.push(received);
                }
                // What came before the unreadable message is still persisted
                // and committed; nothing after it is.
                Ok(Err(e)) if self.stall_on(&e) || self.dies_on(&e) => break,
                Ok(Err(e)) => self.note_error(&e),
                Err(_) => break,
            }
        }
        Some(batch)
    }

    /// Stores, per partition, the offset after the highest message of the
    /// (durable) batch, and commits asynchronously.
    pub fn commit(&self, batch: &[Received]) {
        // After an unreadable message, the batch that preceded it is the
        // last one committed (it was taken before the error).
        let mut offsets = TopicPartitionList::new();
        for ((topic, partition), offset) in offsets::next_offsets(batch) {
            if let Err(e) = offsets.add_partition_offset(&topic, partition, Offset::Offset(offset))
            {
                tracing::warn!(error = %e, "building the offset list failed");
            }
        }
        // Storing fails for a partition revoked meanwhile: its next owner re-reads those messages and finds their rows.
        if let Err(e) = self.consumer.store_offsets(&offsets) {
            tracing::info!(error = %e, "storing offsets failed (partitions moved?)");
        }
        if let Err(e) = self.consumer.commit_consumer_state(CommitMode::Async) {
            tracing::debug!(error = %e, "commit request failed");
        }
    }

    /// Leaves the group and drops the clients off the async runtime.
    pub fn close(self) {
        self.consumer.unsubscribe();
        self.clients().drop_off_runtime();
    }

    /// A second hold on the Kafka clients. librdkafka can block in a
    /// client's destructor; whoever runs this consumer in a task it may
    /// abort keeps this, so the last hold is released off the runtime.
    #[must_use]
    pub fn clients(&self) -> KafkaClients {
        KafkaClients {
            _consumer: self.consumer.clone(),
            _dead_letters: self.dead_letter_producer(),
            destroyed: self.consumer.context().destroyed(),
        }
    }

    /// The dead-letter producer in use now.
    pub(crate) fn dead_letter_producer(&self) -> FutureProducer {
        self.dead_letters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// See [`RequestConsumer::clients`].
pub struct KafkaClients {
    _consumer: Arc<StreamConsumer<RequestConsumerContext>>,
    _dead_letters: FutureProducer,
    /// Closed when the consumer is gone, whoever released it last.
    destroyed: tokio::sync::watch::Receiver<()>,
}

impl std::fmt::Debug for KafkaClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KafkaClients")
    }
}

impl KafkaClients {
    /// Releases this hold on a thread of its own.
    pub fn drop_off_runtime(self) {
        std::thread::spawn(move || drop(self));
    }

    /// Releases these holds on threads of their own, and waits at most
    /// [`CLOSE_WAIT`] for the consumers to be gone. The last hold of a
    /// consumer, released, closes it: librdkafka revokes the partitions and
    /// tells the group coordinator that the member leaves. A process that
    /// exits before that message is out leaves the group to notice at the
    /// session timeout, with the member's partitions unread until then.
    pub async fn release_all(holds: impl IntoIterator<Item = Self>) {
        let gone = holds.into_iter().map(|hold| {
            let mut destroyed = hold.destroyed.clone();
            hold.drop_off_runtime();
            async move { while destroyed.changed().await.is_ok() {} }
        });
        let all = futures_util::future::join_all(gone);
        if tokio::time::timeout(CLOSE_WAIT, all).await.is_err() {
            tracing::warn!(
                waited = ?CLOSE_WAIT,
                "Kafka consumer still closing at exit; its group sees the member leave at the session timeout"
            );
        }
    }
}
