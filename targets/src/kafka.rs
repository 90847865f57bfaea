//! Targets that are a pair of Kafka topics. Such a step is not called: the
//! job parks on it and its request leaves through the request outbox
//! (published by the relay); the reply comes back on `reply_topic`, read
//! by the request consumer, and the job takes it on its next segment
//! (the engine's `nodes/kafka.rs`).

use std::time::Duration;

/// How a Kafka target's requests are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Avro through the Schema Registry (`<topic>-value`).
    Avro,
    /// The contract's JSON form.
    Json,
}

impl Encoding {
    /// Its name in the request outbox.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Avro => "avro",
            Self::Json => "json",
        }
    }
}

/// Default wait for a reply of a Kafka target without `timeout_ms`.
pub const DEFAULT_KAFKA_TIMEOUT: Duration = Duration::from_secs(30);

/// A target that listens on `request_topic` and answers on `reply_topic`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaTarget {
    pub request_topic: String,
    pub reply_topic: String,
    /// `None`: the fleet's encoding (Avro with a registry, JSON without).
    pub encoding: Option<Encoding>,
    /// How long a request waits for its reply before the step is retried.
    pub timeout: Duration,
    /// Most of its requests awaiting replies at once, across the fleet
    /// (`workflow_target_slot`); `None`: no cap.
    pub max_concurrent: Option<usize>,
}

impl KafkaTarget {
    /// The encoding its requests are written in, given the fleet's.
    #[must_use]
    pub fn encoding_or(&self, fleet: Encoding) -> Encoding {
        self.encoding.unwrap_or(fleet)
    }
}
