//! The broker settings every binary shares, and the one configuration of
//! each kind of Kafka client built from them: the idempotent producer, the
//! manually committing consumer, the admin client. Every one of them starts
//! from [`BrokerConfig::client`], so TLS, SASL and pass-through properties
//! ([`security`]) reach all of them.

pub mod group;
pub mod pinned;
pub mod security;

use std::time::Duration;

use clap::Args;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::registry::RegistryConfig;
pub use group::GroupProtocol;
pub use security::KafkaSecurity;

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

/// How topics this process creates are laid out: `-1` leaves a value to the
/// broker's defaults (`num.partitions`, `default.replication.factor`), so a
/// topic is never created with replication 1 on a cluster unless told to.
#[derive(Debug, Clone, Copy, Args)]
pub struct TopicLayout {
    /// Create missing topics at start-up; `false` leaves them to the operator
    /// (a cluster whose ACLs forbid creating topics).
    #[arg(long, env = "FLOTILLA_CREATE_TOPICS", default_value_t = true, action = clap::ArgAction::Set)]
    pub create_topics: bool,

    /// Partitions of a topic this process creates (-1: the broker's default).
    #[arg(long, env = "FLOTILLA_TOPIC_PARTITIONS", default_value_t = BROKER_DEFAULT, value_parser = parse_layout)]
    pub topic_partitions: i32,

    /// Replication factor of a topic this process creates (-1: the broker's default).
    #[arg(long, env = "FLOTILLA_TOPIC_REPLICATION", default_value_t = BROKER_DEFAULT, value_parser = parse_layout)]
    pub topic_replication: i32,

    /// `min.insync.replicas` of a topic this process creates (-1: the
    /// broker's default): with `acks=all`, how many replicas a record must
    /// reach before it counts as written.
    #[arg(long, env = "FLOTILLA_TOPIC_MIN_INSYNC_REPLICAS", default_value_t = BROKER_DEFAULT, value_parser = parse_layout)]
    pub topic_min_insync_replicas: i32,
}

/// "Whatever the broker's default is", in a CreateTopics request.
pub const BROKER_DEFAULT: i32 = -1;

impl TopicLayout {
    /// The broker's defaults for both.
    #[must_use]
    pub fn broker_defaults() -> Self {
        Self {
            create_topics: true,
            topic_partitions: BROKER_DEFAULT,
            topic_replication: BROKER_DEFAULT,
            topic_min_insync_replicas: BROKER_DEFAULT,
        }
    }

    /// The CreateTopics request for `names`, laid out as this says.
    #[must_use]
    pub fn new_topics<'a>(&self, names: &[&'a str], min_insync: &'a str) -> Vec<NewTopic<'a>> {
        names
            .iter()
            .map(|name| {
                let topic = NewTopic::new(
                    name,
                    self.topic_partitions,
                    TopicReplication::Fixed(self.topic_replication),
                );
                if self.topic_min_insync_replicas == BROKER_DEFAULT {
                    topic
                } else {
                    topic.set("min.insync.replicas", min_insync)
                }
            })
            .collect()
    }
}

fn parse_layout(text: &str) -> Result<i32, String> {
    match text.parse::<i32>() {
        Ok(n) if n == BROKER_DEFAULT || (1..=100_000).contains(&n) => Ok(n),
        _ => Err(format!(
            "{text} is neither -1 (the broker's default) nor a count from 1 to 100000"
        )),
    }
}

/// Creates the topics that do not exist yet, laid out as `layout` says.
/// Which exist is read from the cluster's metadata first, so a service
/// account without the right to create topics starts fine when they exist
/// (and CreateTopics is never sent for them). With creation off, a missing
/// topic is warned about and returned: the caller decides whether it can
/// start without it (an operator's job may be creating it).
///
/// # Errors
/// The metadata cannot be read, or the broker refuses to create a missing
/// topic for another reason than "it exists by now".
pub async fn ensure_topics(
    broker: &BrokerConfig,
    topics: &[&str],
    layout: TopicLayout,
) -> Result<Vec<String>, BrokerError> {
    let existing = existing_topics(broker, Duration::from_secs(10)).await?;
    let missing: Vec<&str> = topics
        .iter()
        .copied()
        .filter(|topic| !existing.iter().any(|t| t == topic))
        .collect();
    if missing.is_empty() {
        return Ok(Vec::new());
    }
    if !layout.create_topics {
        tracing::warn!(
            ?missing,
            "topics do not exist and creation is off (FLOTILLA_CREATE_TOPICS=false): they must be created"
        );
        return Ok(missing.into_iter().map(str::to_owned).collect());
    }
    let admin: AdminClient<DefaultClientContext> = broker.client().create()?;
    let min_insync = layout.topic_min_insync_replicas.to_string();
    let new_topics = layout.new_topics(&missing, &min_insync);
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin.create_topics(&new_topics, &options).await;
    // librdkafka can block in a client's destructor: never on an async worker.
    std::thread::spawn(move || drop(admin));
    for result in results? {
        match result {
            Ok(topic) => tracing::info!(topic, ?layout, "topic created"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(BrokerError::CreateTopic { topic, code }),
        }
    }
    Ok(Vec::new())
}

/// The names of the topics the cluster's metadata lists.
async fn existing_topics(
    broker: &BrokerConfig,
    timeout: Duration,
) -> Result<Vec<String>, BrokerError> {
    let config = broker.client();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config.create()?;
        let metadata = consumer.fetch_metadata(None, timeout)?;
        let names = metadata
            .topics()
            .iter()
            .filter(|topic| topic.error().is_none())
            .map(|topic| topic.name().to_owned())
            .collect();
        // librdkafka can block in a consumer's destructor.
        std::thread::spawn(move || drop(consumer));
        Ok(names)
    })
    .await
    .map_err(|_| BrokerError::Interrupted)?
}

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

    #[test]
    fn created_topics_get_the_configured_partitions_replicas_and_min_insync_replicas() {
        let layout = TopicLayout {
            create_topics: true,
            topic_partitions: 6,
            topic_replication: 3,
            topic_min_insync_replicas: 2,
        };
        let topics = layout.new_topics(&["events"], "2");
        assert_eq!(topics[0].num_partitions, 6);
        assert!(matches!(topics[0].replication, TopicReplication::Fixed(3)));
        assert_eq!(topics[0].config, [("min.insync.replicas", "2")]);
        let defaults = TopicLayout::broker_defaults().new_topics(&["events"], "-1");
        assert_eq!(defaults[0].num_partitions, BROKER_DEFAULT);
        assert!(defaults[0].config.is_empty(), "the broker's default");
    }
}
