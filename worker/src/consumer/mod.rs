//! The request consumer: the request topic → rows (guarantee 9 in docs/architecture.md).
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
mod persist;
mod received;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use flotilla_codec::Codec;
use flotilla_contracts::topics;
use flotilla_runtime::BrokerConfig;
use flotilla_runtime::backoff::Doubling;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::FutureProducer;
use rdkafka::{Message, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

pub use context::RequestConsumerContext;
pub use persist::{BatchReport, Outage};
pub use received::Received;

use crate::engine::Engine;

/// Most requests persisted in one transaction, unless configured.
pub const DEFAULT_BATCH_SIZE: usize = 500;
/// How long a batch waits to fill once its first request arrived, unless configured.
pub const DEFAULT_BATCH_WAIT: Duration = Duration::from_millis(100);
/// Requests above this many bytes are dead-lettered, unless configured.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1024 * 1024;
/// The most message bytes one batch holds in memory, unless configured.
pub const DEFAULT_BATCH_BYTES: usize = 16 * 1024 * 1024;
/// Longest pause between retries of a batch during an outage.
pub const DEFAULT_OUTAGE_BACKOFF_MAX: Duration = Duration::from_secs(10);
const OUTAGE_BACKOFF_MIN: Duration = Duration::from_millis(100);

/// How the consumer reads and batches.
#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    pub broker: BrokerConfig,
    pub request_topic: String,
    /// `<request topic>.dlq` unless set otherwise.
    pub dead_letter_topic: String,
    pub group: String,
    /// Static group membership (`group.instance.id`): a member restarted
    /// with the same id gets its partitions back at once, without a rebalance.
    pub group_instance_id: Option<String>,
    pub batch_size: usize,
    /// A batch closes once its messages hold this many bytes.
    pub batch_bytes: usize,
    pub batch_wait: Duration,
    /// Requests above this many bytes are dead-lettered as oversize.
    pub max_request_bytes: usize,
    /// Longest pause between retries of a batch during an outage.
    pub outage_backoff_max: Duration,
}

impl ConsumerSettings {
    #[must_use]
    pub fn new(broker: BrokerConfig, request_topic: &str, group: &str) -> Self {
        Self {
            broker,
            request_topic: request_topic.to_owned(),
            dead_letter_topic: topics::dead_letter_topic(request_topic),
            group: group.to_owned(),
            group_instance_id: None,
            batch_size: DEFAULT_BATCH_SIZE,
            batch_bytes: DEFAULT_BATCH_BYTES,
            batch_wait: DEFAULT_BATCH_WAIT,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            outage_backoff_max: DEFAULT_OUTAGE_BACKOFF_MAX,
        }
    }
}

/// A subscribed consumer with its dead-letter producer.
pub struct RequestConsumer {
    consumer: Arc<StreamConsumer<RequestConsumerContext>>,
    dead_letters: FutureProducer,
    engine: Engine,
    codec: Arc<Codec>,
    settings: ConsumerSettings,
    /// Set once a message could not be read: nothing is committed after it.
    stalled: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for RequestConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestConsumer")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl RequestConsumer {
    /// Creates the consumer and subscribes it to the request topic.
    ///
    /// # Errors
    /// The client cannot be created or subscribed.
    pub fn subscribe(
        engine: Engine,
        codec: Arc<Codec>,
        settings: ConsumerSettings,
    ) -> Result<Self, KafkaError> {
        let mut config = settings.broker.manual_commit_consumer(&settings.group);
        config.set("partition.assignment.strategy", "cooperative-sticky");
        if let Some(instance) = &settings.group_instance_id {
            config.set("group.instance.id", instance);
        }
        let consumer: StreamConsumer<RequestConsumerContext> =
            config.create_with_context(RequestConsumerContext)?;
        consumer.subscribe(&[&settings.request_topic])?;
        let consumer = Arc::new(consumer);
        let dead_letters: FutureProducer = settings.broker.idempotent_producer().create()?;
        Ok(Self {
            consumer,
            dead_letters,
            engine,
            codec,
            settings,
            stalled: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Consumes until `shutdown`: batch, persist (retrying through outages), commit.
    pub async fn run(self, shutdown: CancellationToken) {
        while let Some(batch) = self.next_batch(&shutdown).await {
            let Some(report) = self.persist_until_done(&batch, &shutdown).await else {
                break; // shut down mid-outage: nothing committed, the batch is redelivered
            };
            tracing::debug!(messages = batch.len(), ?report, "batch persisted");
            self.commit(&batch);
            if self.is_stalled() {
                // Keep the group seat (and the partitions paused) until told
                // to stop: an operator looks at the message that cannot be read.
                shutdown.cancelled().await;
                break;
            }
        }
        if let Err(e) = self.consumer.commit_consumer_state(CommitMode::Sync) {
            tracing::debug!(error = %e, "final commit had nothing to do or failed");
        }
        self.close();
    }

    /// Waits for the next message, then takes more for up to `batch_wait`,
    /// `batch_size` messages or `batch_bytes` bytes. `None` on shutdown.
    pub async fn next_batch(&self, shutdown: &CancellationToken) -> Option<Vec<Received>> {
        let limit = self.settings.max_request_bytes;
        let mut batch = Vec::new();
        while batch.is_empty() {
            tokio::select! {
                received = self.consumer.recv() => match received {
                    Ok(message) => batch.push(Received::take(&message, limit)),
                    Err(e) if self.stall_on(&e) => {
                        shutdown.cancelled().await;
                        return None;
                    }
                    Err(e) => tracing::warn!(error = %e, "consumer error"),
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
                Ok(Err(e)) if self.stall_on(&e) => break,
                Ok(Err(e)) => tracing::warn!(error = %e, "consumer error"),
                Err(_) => break,
            }
        }
        Some(batch)
    }

    async fn persist_until_done(
        &self,
        batch: &[Received],
        shutdown: &CancellationToken,
    ) -> Option<BatchReport> {
        let mut backoff = Doubling::new(OUTAGE_BACKOFF_MIN, self.settings.outage_backoff_max);
        let mut paused: Option<TopicPartitionList> = None;
        loop {
            match self.persist(batch).await {
                Ok(report) => {
                    if let Some(partitions) = paused {
                        tracing::info!("outage over; resuming partitions");
                        if let Err(e) = self.consumer.resume(&partitions) {
                            tracing::warn!(error = %e, "resuming partitions failed");
                        }
                    }
                    return Some(report);
                }
                Err(outage) => {
                    let pause = backoff.next_pause();
                    tracing::warn!(error = %outage, retry_in = ?pause, "batch not persisted; pausing and retrying");
                    if paused.is_none() {
                        let assignment = self.consumer.assignment().unwrap_or_default();
                        if let Err(e) = self.consumer.pause(&assignment) {
                            tracing::warn!(error = %e, "pausing partitions failed");
                        }
                        paused = Some(assignment);
                    }
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        () = shutdown.cancelled() => return None,
                    }
                }
            }
        }
    }

    fn is_stalled(&self) -> bool {
        self.stalled.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// When `error` says a message could not be read (librdkafka would skip
    /// it), stops consuming loudly instead: every partition paused, offsets
    /// never stored past it, an error logged and counted, and readiness
    /// failing. The client does not say which partition, so all stop.
    fn stall_on(&self, error: &KafkaError) -> bool {
        if !is_unreadable(error) {
            return false;
        }
        if !self.stalled.swap(true, std::sync::atomic::Ordering::SeqCst) {
            let reason = format!(
                "a message could not be read ({error}); consumption stopped so that nothing is committed past it"
            );
            metrics::counter!("flotilla_unreadable_messages_total").increment(1);
            self.engine.health().dead("request consumer", reason);
            let assignment = self.consumer.assignment().unwrap_or_default();
            if let Err(e) = self.consumer.pause(&assignment) {
                tracing::error!(error = %e, "pausing partitions failed");
            }
        }
        true
    }

    /// Stores, per partition, the offset after the highest message of the
    /// (durable) batch, and commits asynchronously.
    pub fn commit(&self, batch: &[Received]) {
        // After an unreadable message, the batch that preceded it is the
        // last one committed (it was taken before the error).
        let mut next: BTreeMap<(String, i32), i64> = BTreeMap::new();
        for message in batch {
            let entry = next
                .entry((message.topic().to_owned(), message.partition()))
                .or_default();
            *entry = (*entry).max(message.offset() + 1);
        }
        let mut offsets = TopicPartitionList::new();
        for ((topic, partition), offset) in next {
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
            _dead_letters: self.dead_letters.clone(),
        }
    }
}

/// Whether a consumer error means a message was skipped unread: a batch
/// that does not decompress or does not parse. Transport errors are not.
#[must_use]
pub fn is_unreadable(error: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as Code;
    matches!(
        error,
        KafkaError::MessageConsumption(
            Code::BadCompression | Code::BadMessage | Code::InvalidMessage | Code::InvalidRecord
        )
    )
}

/// See [`RequestConsumer::clients`].
pub struct KafkaClients {
    _consumer: Arc<StreamConsumer<RequestConsumerContext>>,
    _dead_letters: FutureProducer,
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
}

#[cfg(test)]
mod tests {
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode as Code;

    use super::is_unreadable;

    #[test]
    fn a_batch_that_cannot_be_read_stops_consumption_and_transport_errors_do_not() {
        assert!(is_unreadable(&KafkaError::MessageConsumption(
            Code::BadCompression
        )));
        assert!(is_unreadable(&KafkaError::MessageConsumption(
            Code::InvalidMessage
        )));
        assert!(!is_unreadable(&KafkaError::MessageConsumption(
            Code::BrokerTransportFailure
        )));
        assert!(!is_unreadable(&KafkaError::MessageConsumption(
            Code::AllBrokersDown
        )));
    }
}
