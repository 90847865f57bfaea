//! The request consumers' lag, partition by partition, for the console: the
//! group's committed offsets against each partition's high watermark, read
//! by a client that never joins the group. The API keeps one such client
//! ([`LagReader`]) and reuses its answer for a second, so a flood of fleet
//! views opens no connection and asks the broker once a second at most.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::BrokerConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

/// Where the workers consume, so the API can report how far behind they are.
#[derive(Debug, Clone)]
pub struct LagSource {
    pub broker: BrokerConfig,
    pub group: String,
    pub topic: String,
}

/// One partition's position.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PartitionLag {
    pub partition: i32,
    /// The group's committed offset; `None` when it has committed none.
    pub committed: Option<i64>,
    pub high_watermark: i64,
    /// Requests not yet committed (from the low watermark when none is).
    pub lag: i64,
}

impl LagSource {
    fn client(&self) -> Result<BaseConsumer, KafkaError> {
        let mut config = self.broker.client();
        config
            .set("group.id", &self.group)
            .set("enable.auto.commit", "false");
        config.set_log_level(rdkafka::config::RDKafkaLogLevel::Error);
        config.create()
    }
}

/// Reads the lag of every partition of `source.topic` with a client of its
/// own, within `timeout` per request to the broker.
///
/// # Errors
/// The client cannot be created, or the broker does not answer in time.
pub async fn read(source: &LagSource, timeout: Duration) -> Result<Vec<PartitionLag>, KafkaError> {
    let source = source.clone();
    // librdkafka's calls block; keep them off the async workers.
    tokio::task::spawn_blocking(move || {
        let consumer = source.client()?;
        let outcome = positions(&consumer, &source.topic, timeout);
        // Closing a client can wait on the broker: never on this thread.
        std::thread::spawn(move || drop(consumer));
        outcome
    })
    .await
    .map_err(|_| KafkaError::Canceled)?
}

/// How long one answer of a [`LagReader`] is reused.
pub const LAG_ANSWER_REUSED_FOR: Duration = Duration::from_secs(1);

/// Reads the lag with one client kept for the process's life, one read at a
/// time, reusing an answer for [`LAG_ANSWER_REUSED_FOR`].
#[derive(Clone)]
pub struct LagReader {
    source: LagSource,
    inner: Arc<Mutex<Cached>>,
}

#[derive(Default)]
struct Cached {
    client: Option<BaseConsumer>,
    answer: Option<(Instant, Result<Vec<PartitionLag>, String>)>,
    /// Clients created, for tests.
    created: u64,
}

impl Drop for Cached {
    fn drop(&mut self) {
        // Closing a client can wait on the broker: never on a runtime thread.
        if let Some(client) = self.client.take() {
            std::thread::spawn(move || drop(client));
        }
    }
}

impl std::fmt::Debug for LagReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LagReader")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl LagReader {
    #[must_use]
    pub fn new(source: LagSource) -> Self {
        Self {
            source,
            inner: Arc::default(),
        }
    }

    #[must_use]
    pub fn source(&self) -> &LagSource {
        &self.source
    }

    /// Clients this reader has created (one, unless creating one failed).
    #[must_use]
    pub fn clients_created(&self) -> u64 {
        self.lock(&self.inner).created
    }

    fn lock<'a>(&self, inner: &'a Mutex<Cached>) -> std::sync::MutexGuard<'a, Cached> {
        inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The lag, read within `timeout` per request to the broker, or the
    /// answer of the last second.
    ///
    /// # Errors
    /// The client cannot be created, or the broker does not answer in time.
    pub async fn read(&self, timeout: Duration) -> Result<Vec<PartitionLag>, String> {
        let (source, inner) = (self.source.clone(), self.inner.clone());
        let reader = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut cached = reader.lock(&inner);
            if let Some((at, answer)) = &cached.answer
                && at.elapsed() < LAG_ANSWER_REUSED_FOR
            {
                return answer.clone();
            }
            if cached.client.is_none() {
                cached.created += 1;
                cached.client = Some(source.client().map_err(|e| e.to_string())?);
            }
            let client = cached.client.as_ref().expect("just made");
            let answer = positions(client, &source.topic, timeout).map_err(|e| e.to_string());
            cached.answer = Some((Instant::now(), answer.clone()));
            answer
        })
        .await
        .map_err(|e| format!("the lag read stopped: {e}"))?
    }
}

fn positions(
    consumer: &BaseConsumer,
    topic: &str,
    timeout: Duration,
) -> Result<Vec<PartitionLag>, KafkaError> {
    let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
    let mut partitions = TopicPartitionList::new();
    for found in metadata.topics().iter().filter(|t| t.name() == topic) {
        for partition in found.partitions() {
            partitions.add_partition(topic, partition.id());
        }
    }
    let committed = consumer.committed_offsets(partitions, timeout)?;
    let mut lags = Vec::new();
    for element in committed.elements() {
        let (low, high) = consumer.fetch_watermarks(topic, element.partition(), timeout)?;
        let committed = match element.offset() {
            Offset::Offset(at) => Some(at),
            _ => None,
        };
        lags.push(PartitionLag {
            partition: element.partition(),
            committed,
            high_watermark: high,
            lag: (high - committed.unwrap_or(low)).max(0),
        });
    }
    lags.sort_by_key(|p| p.partition);
    Ok(lags)
}
