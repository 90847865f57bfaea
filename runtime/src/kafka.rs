//! The broker settings every binary shares, and the one configuration of
//! each kind of Kafka client built from them: the idempotent producer, the
//! manually committing consumer, the admin client.

use std::time::Duration;

use clap::Args;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// The broker list used when none is configured.
pub const DEFAULT_BOOTSTRAP_SERVERS: &str = "localhost:9092";

/// Where the broker and the Schema Registry are.
#[derive(Debug, Clone, Args)]
pub struct BrokerConfig {
    /// Kafka broker list.
    #[arg(long, env = "KAFKA_BOOTSTRAP_SERVERS", default_value = DEFAULT_BOOTSTRAP_SERVERS)]
    pub bootstrap_servers: String,

    /// Confluent-compatible Schema Registry; when unset, JSON on the wire
    /// (either encoding is read).
    #[arg(long, env = "SCHEMA_REGISTRY_URL")]
    pub schema_registry_url: Option<String>,
}

impl BrokerConfig {
    /// A broker at `bootstrap_servers`, JSON on the wire.
    #[must_use]
    pub fn new(bootstrap_servers: &str) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.to_owned(),
            schema_registry_url: None,
        }
    }

    /// The settings every client starts from.
    #[must_use]
    pub fn client(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap_servers);
        config
    }

    /// An idempotent producer that waits for every in-sync replica: no
    /// duplicates from its own retries, per-partition order kept.
    #[must_use]
    pub fn idempotent_producer(&self) -> ClientConfig {
        let mut config = self.client();
        config.set("enable.idempotence", "true").set("acks", "all");
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
            .set("auto.offset.reset", "earliest");
        config
    }
}

/// A broker that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("the Kafka client: {0}")]
    Client(#[from] KafkaError),
    #[error("creating topic {topic}: {code}")]
    CreateTopic {
        topic: String,
        code: RDKafkaErrorCode,
    },
    #[error("the metadata request did not finish")]
    Interrupted,
}

/// Asks the broker for cluster metadata, so a wrong address fails at start-up
/// rather than at the first message.
///
/// # Errors
/// The broker does not answer within `timeout`.
pub async fn check_reachable(broker: &BrokerConfig, timeout: Duration) -> Result<(), BrokerError> {
    let config = broker.client();
    // librdkafka's calls block; keep them off the async workers.
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config.create()?;
        let metadata = consumer.fetch_metadata(None, timeout)?;
        tracing::debug!(
            brokers = metadata.brokers().len(),
            topics = metadata.topics().len(),
            "Kafka reachable"
        );
        Ok(())
    })
    .await
    .map_err(|_| BrokerError::Interrupted)?
}

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
        }
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

/// Creates the topics that do not exist yet, laid out as `layout` says;
/// topics that exist are left as they are (operators of a real cluster may
/// create them with their own settings first).
///
/// # Errors
/// The broker refuses for another reason than "already exists".
pub async fn ensure_topics(
    broker: &BrokerConfig,
    topics: &[&str],
    layout: TopicLayout,
) -> Result<(), BrokerError> {
    if !layout.create_topics {
        tracing::info!(?topics, "topic creation is off; the topics must exist");
        return Ok(());
    }
    let admin: AdminClient<DefaultClientContext> = broker.client().create()?;
    let new_topics: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|topic| {
            NewTopic::new(
                topic,
                layout.topic_partitions,
                TopicReplication::Fixed(layout.topic_replication),
            )
        })
        .collect();
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
    Ok(())
}
