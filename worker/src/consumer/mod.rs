//! The request consumer: `workflow-run-requests` → rows (DESIGN.md guarantee 9).
//!
//! A batch (up to `batch_size` messages or `batch_wait`) is decoded, its
//! requests submitted in one database transaction, its undecodable messages
//! dead-lettered, and only then are its offsets stored and committed. Every
//! message has exactly one outcome and the partition always moves on; when
//! Postgres (or the registry, or the dead-letter topic) is unavailable the
//! partitions are paused and the same batch retried with backoff, committing
//! nothing meanwhile.

mod context;
pub mod dead_letter;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use flotilla_codec::{Codec, CodecError};
use flotilla_contracts::WorkflowRunRequest;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Headers, OwnedMessage};
use rdkafka::producer::FutureProducer;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

pub use context::RequestConsumerContext;
use dead_letter::DeadLetter;

use crate::engine::{Engine, Submission, SubmitError, Submitted, WorkflowRef};
use crate::store::runs::RunStatus;

/// How the consumer reads and batches.
#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    pub bootstrap_servers: String,
    pub request_topic: String,
    /// `<request topic>.dlq` unless set otherwise.
    pub dead_letter_topic: String,
    pub group: String,
    pub batch_size: usize,
    pub batch_wait: Duration,
    /// Requests above this many bytes are dead-lettered as oversize.
    pub max_request_bytes: usize,
    /// Longest pause between retries of a batch during an outage.
    pub outage_backoff_max: Duration,
}

impl ConsumerSettings {
    #[must_use]
    pub fn new(bootstrap_servers: &str, request_topic: &str, group: &str) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.to_owned(),
            request_topic: request_topic.to_owned(),
            dead_letter_topic: format!("{request_topic}.dlq"),
            group: group.to_owned(),
            batch_size: 500,
            batch_wait: Duration::from_millis(100),
            max_request_bytes: 1024 * 1024,
            outage_backoff_max: Duration::from_secs(10),
        }
    }
}

/// What a persisted batch came to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// New QUEUED rows.
    pub created: usize,
    /// Redelivered requests whose rows exist already.
    pub existing: usize,
    /// New FAILED rows (unknown workflow, input that fails the schema).
    pub refused: usize,
    /// Records sent to the dead-letter topic (undecodable, oversize, conflicting).
    pub dead_lettered: usize,
}

/// Why a batch could not be persisted now; the same batch is retried.
#[derive(Debug, thiserror::Error)]
pub enum Outage {
    #[error("database: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("schema registry: {0}")]
    Registry(CodecError),
    #[error("dead-letter topic: {0}")]
    DeadLetter(rdkafka::error::KafkaError),
}

/// A subscribed consumer with its dead-letter producer.
pub struct RequestConsumer {
    consumer: StreamConsumer<RequestConsumerContext>,
    dead_letters: FutureProducer,
    engine: Engine,
    codec: Arc<Codec>,
    settings: ConsumerSettings,
}

impl std::fmt::Debug for RequestConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestConsumer")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

enum Classified {
    Submit(Submission),
    DeadLetter(DeadLetter),
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
    ) -> anyhow::Result<Self> {
        let consumer: StreamConsumer<RequestConsumerContext> = ClientConfig::new()
            .set("bootstrap.servers", &settings.bootstrap_servers)
            .set("group.id", &settings.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("partition.assignment.strategy", "cooperative-sticky")
            .create_with_context(RequestConsumerContext)?;
        consumer.subscribe(&[&settings.request_topic])?;
        let dead_letters: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &settings.bootstrap_servers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .create()?;
        Ok(Self {
            consumer,
            dead_letters,
            engine,
            codec,
            settings,
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
        }
        if let Err(e) = self.consumer.commit_consumer_state(CommitMode::Sync) {
            tracing::debug!(error = %e, "final commit had nothing to do or failed");
        }
        self.close();
    }

    /// Waits for the next message, then takes more for up to `batch_wait`.
    /// `None` on shutdown.
    pub async fn next_batch(&self, shutdown: &CancellationToken) -> Option<Vec<OwnedMessage>> {
        let mut batch = Vec::new();
        while batch.is_empty() {
            tokio::select! {
                received = self.consumer.recv() => match received {
                    Ok(message) => batch.push(message.detach()),
                    Err(e) => tracing::warn!(error = %e, "consumer error"),
                },
                () = shutdown.cancelled() => return None,
            }
        }
        let deadline = tokio::time::Instant::now() + self.settings.batch_wait;
        while batch.len() < self.settings.batch_size {
            match tokio::time::timeout_at(deadline, self.consumer.recv()).await {
                Ok(Ok(message)) => batch.push(message.detach()),
                Ok(Err(e)) => tracing::warn!(error = %e, "consumer error"),
                Err(_) => break,
            }
        }
        Some(batch)
    }

    async fn persist_until_done(
        &self,
        batch: &[OwnedMessage],
        shutdown: &CancellationToken,
    ) -> Option<BatchReport> {
        let mut backoff = Duration::from_millis(100);
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
                    tracing::warn!(error = %outage, retry_in = ?backoff, "batch not persisted; pausing and retrying");
                    if paused.is_none() {
                        let assignment = self.consumer.assignment().unwrap_or_default();
                        if let Err(e) = self.consumer.pause(&assignment) {
                            tracing::warn!(error = %e, "pausing partitions failed");
                        }
                        paused = Some(assignment);
                    }
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = shutdown.cancelled() => return None,
                    }
                    backoff = (backoff * 2).min(self.settings.outage_backoff_max);
                }
            }
        }
    }

    /// Makes every message of `batch` durable: rows in one transaction,
    /// dead letters acknowledged by the broker. Offsets are not touched.
    ///
    /// # Errors
    /// An [`Outage`]: nothing may be committed for this batch; retry it.
    pub async fn persist(&self, batch: &[OwnedMessage]) -> Result<BatchReport, Outage> {
        let mut report = BatchReport::default();
        let mut letters: Vec<(&OwnedMessage, DeadLetter)> = Vec::new();
        let mut submitted: Vec<&OwnedMessage> = Vec::new();
        let mut submissions = Vec::new();
        for message in batch {
            match self.classify(message).await? {
                Classified::Submit(submission) => {
                    submitted.push(message);
                    submissions.push(submission);
                }
                Classified::DeadLetter(letter) => letters.push((message, letter)),
            }
        }
        let results = self.engine.submit_batch(submissions).await?;
        for (message, result) in submitted.into_iter().zip(results) {
            match result {
                Ok(Submitted::Created(row)) if row.status() == RunStatus::Failed => {
                    report.refused += 1
                }
                Ok(Submitted::Created(_)) => report.created += 1,
                Ok(Submitted::Existing(_)) => report.existing += 1,
                Err(SubmitError::Conflict(job_id)) => {
                    tracing::warn!(%job_id, partition = message.partition(), offset = message.offset(),
                        "request conflicts with the existing job; the original stays, the request is dead-lettered");
                    metrics::counter!("flotilla_request_conflicts_total").increment(1);
                    let reason = format!(
                        "job {job_id} exists with different content; the original job stays"
                    );
                    letters.push((
                        message,
                        DeadLetter {
                            code: "conflict",
                            reason,
                        },
                    ));
                }
                Err(other) => {
                    letters.push((
                        message,
                        DeadLetter {
                            code: "refused",
                            reason: other.to_string(),
                        },
                    ));
                }
            }
        }
        for (message, letter) in &letters {
            dead_letter::send(
                &self.dead_letters,
                &self.settings.dead_letter_topic,
                message,
                letter,
            )
            .await
            .map_err(Outage::DeadLetter)?;
            metrics::counter!("flotilla_requests_dead_lettered_total", "code" => letter.code)
                .increment(1);
        }
        report.dead_lettered = letters.len();
        Ok(report)
    }

    async fn classify(&self, message: &OwnedMessage) -> Result<Classified, Outage> {
        let payload = message.payload().unwrap_or_default();
        let dead = |code: &'static str, reason: String| {
            Ok(Classified::DeadLetter(DeadLetter { code, reason }))
        };
        if payload.len() > self.settings.max_request_bytes {
            let limit = self.settings.max_request_bytes;
            return dead(
                "oversize",
                format!(
                    "request of {} bytes is over the limit of {limit} bytes",
                    payload.len()
                ),
            );
        }
        let request: WorkflowRunRequest = match self.codec.decode(payload).await {
            Ok(request) => request,
            Err(e) if e.is_transient() => return Err(Outage::Registry(e)),
            Err(CodecError::Decode(e)) => return dead(e.code(), e.to_string()),
            Err(CodecError::NoRegistry(_)) => {
                return dead("no_registry", CodecError::NoRegistry(0).to_string());
            }
            Err(e) => return dead("undecodable", e.to_string()),
        };
        let traceparent = message.headers().and_then(|headers| {
            headers
                .iter()
                .find(|h| h.key.eq_ignore_ascii_case("traceparent"))
                .and_then(|h| h.value)
                .and_then(|v| std::str::from_utf8(v).ok())
                .map(str::to_owned)
        });
        Ok(Classified::Submit(Submission {
            job_id: request.job_id(),
            workflow: WorkflowRef::Stored(request.workflow_name().to_owned()),
            input: request.into_input(),
            traceparent,
        }))
    }

    /// Stores, per partition, the offset after the highest message of the
    /// (durable) batch, and commits asynchronously.
    pub fn commit(&self, batch: &[OwnedMessage]) {
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

    /// Leaves the group and drops the client off the async runtime (librdkafka
    /// can block in its destructor).
    pub fn close(self) {
        self.consumer.unsubscribe();
        let Self {
            consumer,
            dead_letters,
            ..
        } = self;
        std::thread::spawn(move || {
            drop(consumer);
            drop(dead_letters);
        });
    }
}
