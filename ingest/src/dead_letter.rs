//! The dead-letter topic: requests that cannot become rows, kept with their
//! original key, value and headers, plus headers saying why and from where.

use std::time::Duration;

use rdkafka::Message;
use rdkafka::message::{Header, Headers, OwnedHeaders};

use flotilla_runtime::BrokerConfig;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};

use crate::{DEAD_LETTER_TIMEOUT, Received};

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

/// The dead-letter producer: idempotent, and a letter that cannot be
/// delivered soon is an outage of the batch, retried.
///
/// # Errors
/// The client cannot be created.
pub fn producer(broker: &BrokerConfig) -> Result<FutureProducer, rdkafka::error::KafkaError> {
    broker
        .idempotent_producer()
        .set(
            "message.timeout.ms",
            DEAD_LETTER_TIMEOUT.as_millis().to_string(),
        )
        .create()
}

/// Whether `producer` can send nothing more (an idempotent producer whose
/// sequence the broker refused for good, say): it must be replaced.
#[must_use]
pub fn is_broken(producer: &FutureProducer) -> bool {
    producer.client().fatal_error().is_some()
}

/// How much of the original record a dead letter carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carried {
    /// Its key, value and headers.
    Whole,
    /// Its key and headers; the value's size in a header.
    WithoutValue,
    /// Only the reason headers and the value's size: the least that says
    /// what happened, for a record whose own headers are too large.
    Minimal,
}

/// Produces `message` to `topic` with the reason headers, waiting for the
/// ack. A record the broker refuses as too large is sent again without its
/// value (its size noted in a header), then without its original headers,
/// rather than stalling the partition on a record that can never land.
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
    let first = if message.dropped_value_bytes().is_some() {
        Carried::WithoutValue
    } else {
        Carried::Whole
    };
    let mut carried = first;
    loop {
        match produce(producer, topic, message, letter, carried).await {
            Err(KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge))
                if carried != Carried::Minimal =>
            {
                carried = match carried {
                    Carried::Whole => Carried::WithoutValue,
                    _ => Carried::Minimal,
                };
                tracing::warn!(
                    topic,
                    ?carried,
                    "dead letter too large for the broker; sending less of it"
                );
            }
            other => return other,
        }
    }
}

async fn produce(
    producer: &FutureProducer,
    topic: &str,
    message: &Received,
    letter: &DeadLetter,
    carried: Carried,
) -> Result<(), rdkafka::error::KafkaError> {
    let with_value = carried == Carried::Whole;
    let mut headers = OwnedHeaders::new();
    if let (Some(original), false) = (message.headers(), carried == Carried::Minimal) {
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
    // A minimal letter keeps the start of its reason only.
    let reason = if carried == Carried::Minimal {
        letter.reason.chars().take(512).collect::<String>()
    } else {
        letter.reason.clone()
    };
    let mut headers = headers
        .insert(Header {
            key: REASON,
            value: Some(reason.as_bytes()),
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
    if let (Some(key), false) = (message.key(), carried == Carried::Minimal) {
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
