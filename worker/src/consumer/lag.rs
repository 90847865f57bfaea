//! The request consumers' lag, partition by partition, for the console: the
//! group's committed offsets against each partition's high watermark, read
//! by a short-lived client that never joins the group.

use std::time::Duration;

use flotilla_runtime::BrokerConfig;
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

/// Reads the lag of every partition of `source.topic`, within `timeout` per
/// request to the broker.
///
/// # Errors
/// The client cannot be created, or the broker does not answer in time.
pub async fn read(source: &LagSource, timeout: Duration) -> Result<Vec<PartitionLag>, KafkaError> {
    let mut config = source.broker.client();
    config
        .set("group.id", &source.group)
        .set("enable.auto.commit", "false");
    config.set_log_level(rdkafka::config::RDKafkaLogLevel::Error);
    let topic = source.topic.clone();
    // librdkafka's calls block; keep them off the async workers.
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config.create()?;
        let outcome = positions(&consumer, &topic, timeout);
        // Closing a client can wait on the broker: never on this thread.
        std::thread::spawn(move || drop(consumer));
        outcome
    })
    .await
    .map_err(|_| KafkaError::Canceled)?
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
