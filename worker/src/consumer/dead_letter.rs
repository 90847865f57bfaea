//! The dead-letter topic: requests that cannot become rows, kept with their
//! original key, value and headers, plus headers saying why and from where.

use std::time::Duration;

use rdkafka::Message;
use rdkafka::message::{Header, Headers, OwnedHeaders};

use super::Received;
use rdkafka::producer::{FutureProducer, FutureRecord};

/// Header names added to a dead-lettered record.
pub const REASON: &str = "flotilla.dlq.reason";
pub const CODE: &str = "flotilla.dlq.code";
pub const SOURCE_TOPIC: &str = "flotilla.dlq.source.topic";
pub const SOURCE_PARTITION: &str = "flotilla.dlq.source.partition";
pub const SOURCE_OFFSET: &str = "flotilla.dlq.source.offset";
/// Set when the broker refused the original value as too large: the record
/// then carries the reason and the value's size instead of the value.
pub const VALUE_DROPPED: &str = "flotilla.dlq.value-dropped-bytes";

/// Why a message goes to the dead-letter topic.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// Short stable code, e.g. `oversize`, `unknown_magic_byte`, `conflict`.
    pub code: &'static str,
    /// A sentence naming what was wrong.
    pub reason: String,
}

/// Produces `message` to `topic` with the reason headers, waiting for the
/// ack. A value the broker refuses as too large is dropped (its size noted in
/// a header) rather than stalling the partition on a record that can never land.
///
/// # Errors
/// The broker did not take the record.
pub async fn send(
    producer: &FutureProducer,
    topic: &str,
    message: &Received,
    letter: &DeadLetter,
) -> Result<(), rdkafka::error::KafkaError> {
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode;
    if message.dropped_value_bytes().is_some() {
        return produce(producer, topic, message, letter, false).await;
    }
    match produce(producer, topic, message, letter, true).await {
        Err(KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)) => {
            tracing::warn!(
                topic,
                "dead letter too large for the broker; sending it without its value"
            );
            produce(producer, topic, message, letter, false).await
        }
        other => other,
    }
}

async fn produce(
    producer: &FutureProducer,
    topic: &str,
    message: &Received,
    letter: &DeadLetter,
    with_value: bool,
) -> Result<(), rdkafka::error::KafkaError> {
    let mut headers = OwnedHeaders::new();
    if let Some(original) = message.headers() {
        for header in original.iter() {
            headers = headers.insert(Header {
                key: header.key,
                value: header.value,
            });
        }
    }
    let partition = message.partition().to_string();
    let offset = message.offset().to_string();
    let value_size = message
        .dropped_value_bytes()
        .unwrap_or_else(|| message.payload().map_or(0, <[u8]>::len))
        .to_string();
    let mut headers = headers
        .insert(Header {
            key: REASON,
            value: Some(letter.reason.as_bytes()),
        })
        .insert(Header {
            key: CODE,
            value: Some(letter.code.as_bytes()),
        })
        .insert(Header {
            key: SOURCE_TOPIC,
            value: Some(message.topic().as_bytes()),
        })
        .insert(Header {
            key: SOURCE_PARTITION,
            value: Some(partition.as_bytes()),
        })
        .insert(Header {
            key: SOURCE_OFFSET,
            value: Some(offset.as_bytes()),
        });
    if !with_value {
        headers = headers.insert(Header {
            key: VALUE_DROPPED,
            value: Some(value_size.as_bytes()),
        });
    }
    let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(headers);
    if let Some(key) = message.key() {
        record = record.key(key);
    }
    if let (true, Some(value)) = (with_value, message.payload()) {
        record = record.payload(value);
    }
    producer
        .send(record, Duration::from_secs(30))
        .await
        .map(|_| ())
        .map_err(|(e, _)| e)
}
