//! The broker settings every binary shares, and the one configuration of
//! each kind of Kafka client built from them: the idempotent producer, the
//! manually committing consumer, the admin client. Every one of them starts
//! from [`BrokerConfig::client`], so TLS, SASL and pass-through properties
//! ([`security`]) reach all of them.

pub mod group;
pub mod health;
pub mod lag;
pub mod pinned;
pub mod security;
pub mod topics;

use std::time::Duration;

use clap::Args;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::registry::RegistryConfig;
pub use group::GroupProtocol;
pub use security::KafkaSecurity;
pub use topics::{AUTO, BROKER_DEFAULT, TopicLayout, ensure_topics, unfit_topics};

/// The broker list used when none is configured.
pub const DEFAULT_BOOTSTRAP_SERVERS: &str = "localhost:9092";

/// Where the broker and the Schema Registry are.
#[derive(Debug, Clone, Args)]
pub struct BrokerConfig {
    /// Kafka broker list.
    #[arg(long, env = "KAFKA_BOOTSTRAP_SERVERS", default_value = DEFAULT_BOOTSTRAP_SERVERS)]
    pub bootstrap_servers: String,

    #[command(flatten)]
    pub security: KafkaSecurity,

    #[command(flatten)]
    pub registry: RegistryConfig,
}

impl BrokerConfig {
    /// A broker at `bootstrap_servers`, JSON on the wire.
    #[must_use]
    pub fn new(bootstrap_servers: &str) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.to_owned(),
            security: KafkaSecurity::default(),
            registry: RegistryConfig::default(),
        }
    }

    /// The settings every client starts from: the brokers, then security
    /// and any pass-through properties.
    #[must_use]
    pub fn client(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap_servers);
        self.security.apply(&mut config);
        config
    }

    /// Refuses, before any client exists, settings that cannot work: a SASL
    /// mechanism without credentials, an unknown property, a bad value;
    /// then the registry's settings.
    ///
    /// # Errors
    /// The first problem, naming the setting to fix.
    pub fn validate(&self) -> Result<(), security::SecurityError> {
        let mut base = ClientConfig::new();
        base.set("bootstrap.servers", &self.bootstrap_servers);
        self.security.validate(&base)?;
        self.registry.validate()
    }

    /// An idempotent producer that waits for every in-sync replica: no
    /// duplicates from its own retries, per-partition order kept.
    #[must_use]
    pub fn idempotent_producer(&self) -> ClientConfig {
        let mut config = self.client();
        config
            .set("enable.idempotence", "true")
            .set("request.required.acks", "all")
            .set("partitioner", pinned::PARTITIONER);
        config
    }

    /// A producer whose every acknowledgement is the broker's answer for
    /// that record, waiting for every in-sync replica, without the
    /// idempotent producer's inference that a later acknowledgement proves
    /// an earlier record was written. That inference holds only on a broker
    /// that checks producer sequence numbers; on one that does not
    /// (librdkafka's mock cluster checks them only for transactional
    /// producers), a record refused once and retried is reported delivered
    /// and lost, or lands after its successor. The relay uses this one when
    /// told its broker is such a one (`FLOTILLA_RELAY_IDEMPOTENCE=false`);
    /// its retries may repeat a record, which consumers drop by `event_id`.
    #[must_use]
    pub fn acknowledged_producer(&self) -> ClientConfig {
        let mut config = self.client();
        config
            .set("enable.idempotence", "false")
            .set("request.required.acks", "all")
            .set("partitioner", pinned::PARTITIONER);
        config
    }

    /// A consumer in `group` that stores and commits offsets only by hand,
    /// from the earliest offset when the group has none.
    #[must_use]
    pub fn manual_commit_consumer(&self, group: &str) -> ClientConfig {
        let mut config = self.client();
        config
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", pinned::ISOLATION_LEVEL);
        config
    }
}

/// A broker that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("the Kafka client: {0}")]
    Client(#[from] KafkaError),
    #[error("settings: {0}")]
    Settings(#[from] security::SecurityError),
    #[error(
        "creating missing topic {topic}: {code} (create it beforehand and set FLOTILLA_CREATE_TOPICS=false, or grant this account CreateTopics)"
    )]
    CreateTopic {
        topic: String,
        code: RDKafkaErrorCode,
    },
    #[error("the metadata request did not finish")]
    Interrupted,
    #[error("{error} ({cause})")]
    Unreachable { error: KafkaError, cause: String },
}

/// Checks the settings ([`BrokerConfig::validate`]), then asks the broker for
/// cluster metadata, so a wrong address, a refused certificate or refused
/// credentials fail at start-up rather than at the first message.
///
/// # Errors
/// The settings cannot work, or the broker does not answer within `timeout`.
pub async fn check_reachable(broker: &BrokerConfig, timeout: Duration) -> Result<(), BrokerError> {
    broker.validate()?;
    let mut config = broker.client();
    // rdkafka derives the log level from the `log` crate's, off here.
    config.set_log_level(rdkafka::config::RDKafkaLogLevel::Warning);
    // librdkafka's calls block; keep them off the async workers.
    tokio::task::spawn_blocking(move || {
        let context = LastError::default();
        let consumer: BaseConsumer<LastError> = config.create_with_context(context)?;
        let outcome = consumer.fetch_metadata(None, timeout);
        if outcome.is_err() {
            // The client's logs and errors wait in its queue until polled.
            for _ in 0..1000 {
                if consumer.poll(Duration::ZERO).is_none() {
                    break;
                }
            }
        }
        let last = consumer.context().take();
        std::thread::spawn(move || drop(consumer));
        match outcome {
            Ok(metadata) => {
                tracing::debug!(
                    brokers = metadata.brokers().len(),
                    topics = metadata.topics().len(),
                    "Kafka reachable"
                );
                Ok(())
            }
            // The metadata error alone says "transport failure"; what the
            // client saw on the way (a refused certificate, refused SASL
            // credentials) is the useful part.
            Err(error) => Err(BrokerError::Unreachable {
                error,
                cause: last.unwrap_or_else(|| "no further detail from the client".into()),
            }),
        }
    })
    .await
    .map_err(|_| BrokerError::Interrupted)?
}

/// Keeps the last warning or error librdkafka logged, for the start-up message.
#[derive(Default)]
struct LastError(std::sync::Mutex<Option<String>>);

impl LastError {
    fn take(&self) -> Option<String> {
        self.0.lock().ok()?.take()
    }
}

impl rdkafka::ClientContext for LastError {
    // Connection failures (a refused certificate, refused SASL credentials)
    // arrive as errors and as log lines.
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(error = %error, reason, "Kafka client error");
        if let Ok(mut last) = self.0.lock() {
            *last = Some(reason.to_owned());
        }
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel as Level;
        if matches!(
            level,
            Level::Emerg | Level::Alert | Level::Critical | Level::Error | Level::Warning
        ) {
            tracing::warn!(facility, message, "Kafka client");
            if let Ok(mut last) = self.0.lock() {
                *last = Some(message.to_owned());
            }
        }
    }
}

impl rdkafka::consumer::ConsumerContext for LastError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_client_carries_the_security_settings_and_pass_through() {
        let mut broker = BrokerConfig::new("broker:9093");
        broker.security.kafka_security_protocol = Some(security::SecurityProtocol::SaslSsl);
        broker.security.kafka_property = vec![("client.rack".into(), "eu-west-1a".into())];
        for (kind, config) in [
            ("client", broker.client()),
            ("producer", broker.idempotent_producer()),
            ("relay's producer", broker.acknowledged_producer()),
            ("consumer", broker.manual_commit_consumer("g")),
        ] {
            assert_eq!(config.get("security.protocol"), Some("sasl_ssl"), "{kind}");
            assert_eq!(config.get("client.rack"), Some("eu-west-1a"), "{kind}");
            assert_eq!(
                config.get("bootstrap.servers"),
                Some("broker:9093"),
                "{kind}"
            );
        }
    }
}
