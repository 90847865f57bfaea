//! The topics a binary needs: created when missing, laid out for the
//! cluster found, and checked when they exist (review finding K4).
//!
//! Stock Apache Kafka creates a topic with one partition and one replica
//! unless told otherwise, and a cluster that sets `min.insync.replicas=2`
//! then refuses every `acks=all` write to such a topic: Flotilla's
//! producers all wait for every in-sync replica, so the fleet would stall
//! with nothing naming the cause. The rules, each overridable:
//!
//! - **replication** (`FLOTILLA_TOPIC_REPLICATION=auto`, the default): three
//!   copies, or as many as the cluster has brokers when it has fewer;
//! - **`min.insync.replicas`** (`FLOTILLA_TOPIC_MIN_INSYNC_REPLICAS=auto`):
//!   two when there are three copies or more (a write survives one
//!   broker's loss, and one broker may be down), else one;
//! - **partitions**: the broker's default (`num.partitions`) unless
//!   `FLOTILLA_TOPIC_PARTITIONS` says; a request topic with one partition
//!   is read by one worker at a time, which start-up warns about.
//!
//! A topic that exists is checked: fewer replicas than its
//! `min.insync.replicas` refuses every write, which start-up names as a
//! problem (readiness fails, an error line says what to change); a single
//! copy on a cluster of three brokers or more is warned about.

use std::time::Duration;

use clap::Args;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

use super::{BrokerConfig, BrokerError};

/// "Whatever the broker's default is", in a CreateTopics request.
pub const BROKER_DEFAULT: i32 = -1;
/// "Fit for the cluster found" (see the module's rules).
pub const AUTO: i32 = 0;

/// How topics this process creates are laid out.
#[derive(Debug, Clone, Copy, Args)]
pub struct TopicLayout {
    /// Create missing topics at start-up; `false` leaves them to the operator
    /// (a cluster whose ACLs forbid creating topics).
    #[arg(long, env = "FLOTILLA_CREATE_TOPICS", default_value_t = true, action = clap::ArgAction::Set)]
    pub create_topics: bool,

    /// Partitions of a topic this process creates (-1: the broker's default).
    #[arg(long, env = "FLOTILLA_TOPIC_PARTITIONS", default_value_t = BROKER_DEFAULT, value_parser = parse_partitions)]
    pub topic_partitions: i32,

    /// Replication factor of a topic this process creates: `auto` (three,
    /// or every broker of a smaller cluster), -1 (the broker's default), or
    /// a count.
    #[arg(long, env = "FLOTILLA_TOPIC_REPLICATION", default_value = "auto", value_parser = parse_auto)]
    pub topic_replication: i32,

    /// `min.insync.replicas` of a topic this process creates: with
    /// `acks=all`, how many replicas a record must reach before it counts
    /// as written. `auto` (two with three replicas or more, else one), -1
    /// (the broker's default), or a count.
    #[arg(long, env = "FLOTILLA_TOPIC_MIN_INSYNC_REPLICAS", default_value = "auto", value_parser = parse_auto)]
    pub topic_min_insync_replicas: i32,
}

impl TopicLayout {
    /// The broker's defaults for every value.
    #[must_use]
    pub fn broker_defaults() -> Self {
        Self {
            create_topics: true,
            topic_partitions: BROKER_DEFAULT,
            topic_replication: BROKER_DEFAULT,
            topic_min_insync_replicas: BROKER_DEFAULT,
        }
    }

    /// The rules: the broker's partitions, replication and
    /// `min.insync.replicas` fit for the cluster.
    #[must_use]
    pub fn fit_for_the_cluster() -> Self {
        Self {
            topic_replication: AUTO,
            topic_min_insync_replicas: AUTO,
            ..Self::broker_defaults()
        }
    }

    /// The replication factor and `min.insync.replicas` to create topics
    /// with on a cluster of `brokers` (`None`: the broker's default).
    #[must_use]
    pub fn resolve(&self, brokers: usize) -> (i32, Option<i32>) {
        let brokers = i32::try_from(brokers).unwrap_or(i32::MAX).max(1);
        let replication = match self.topic_replication {
            AUTO => brokers.min(3),
            other => other,
        };
        let min_insync = match self.topic_min_insync_replicas {
            BROKER_DEFAULT => None,
            AUTO if replication == BROKER_DEFAULT => None,
            AUTO => Some(if replication >= 3 { 2 } else { 1 }),
            other => Some(other),
        };
        (replication, min_insync)
    }

    /// The CreateTopics request for `names`, laid out as this says on a
    /// cluster of `brokers`; `min_insync` holds the text of the setting.
    #[must_use]
    pub fn new_topics<'a>(
        &self,
        names: &[&'a str],
        brokers: usize,
        min_insync: &'a mut String,
    ) -> Vec<NewTopic<'a>> {
        let (replication, insync) = self.resolve(brokers);
        if let Some(insync) = insync {
            *min_insync = insync.to_string();
        }
        let min_insync: &'a str = min_insync;
        names
            .iter()
            .map(|name| {
                let topic = NewTopic::new(
                    name,
                    self.topic_partitions,
                    TopicReplication::Fixed(replication),
                );
                if insync.is_some() {
                    topic.set("min.insync.replicas", min_insync)
                } else {
                    topic
                }
            })
            .collect()
    }
}

fn parse_partitions(text: &str) -> Result<i32, String> {
    match text.parse::<i32>() {
        Ok(n) if n == BROKER_DEFAULT || (1..=100_000).contains(&n) => Ok(n),
        _ => Err(format!(
            "{text} is neither -1 (the broker's default) nor a count from 1 to 100000"
        )),
    }
}

fn parse_auto(text: &str) -> Result<i32, String> {
    if text == "auto" {
        return Ok(AUTO);
    }
    match text.parse::<i32>() {
        Ok(n) if n == BROKER_DEFAULT || (1..=100_000).contains(&n) => Ok(n),
        _ => Err(format!(
            "{text} is neither auto (fit for the cluster), -1 (the broker's default) nor a count from 1 to 100000"
        )),
    }
}

/// What the cluster's metadata says: its brokers, and each topic with the
/// fewest replicas any of its partitions has, and its partition count.
struct Cluster {
    brokers: usize,
    topics: Vec<(String, usize, usize)>,
}

/// Creates the topics that do not exist yet, laid out as `layout` says for
/// the cluster found. Which exist is read from the cluster's metadata
/// first, so a service account without the right to create topics starts
/// fine when they exist (and CreateTopics is never sent for them). With
/// creation off, a missing topic is warned about and returned: the caller
/// decides whether it can start without it (an operator's job may be
/// creating it).
///
/// # Errors
/// The metadata cannot be read, or the broker refuses to create a missing
/// topic for another reason than "it exists by now".
pub async fn ensure_topics(
    broker: &BrokerConfig,
    topics: &[&str],
    layout: TopicLayout,
) -> Result<Vec<String>, BrokerError> {
    let cluster = cluster(broker, Duration::from_secs(10)).await?;
    let missing: Vec<&str> = topics
        .iter()
        .copied()
        .filter(|topic| !cluster.topics.iter().any(|(t, _, _)| t == topic))
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
    let mut min_insync = String::new();
    let new_topics = layout.new_topics(&missing, cluster.brokers, &mut min_insync);
    let (replication, insync) = layout.resolve(cluster.brokers);
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin.create_topics(&new_topics, &options).await;
    // librdkafka can block in a client's destructor: never on an async worker.
    std::thread::spawn(move || drop(admin));
    for result in results? {
        match result {
            Ok(topic) => tracing::info!(
                topic,
                partitions = layout.topic_partitions,
                replication,
                min_insync_replicas = insync,
                brokers = cluster.brokers,
                "topic created"
            ),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(BrokerError::CreateTopic { topic, code }),
        }
    }
    Ok(Vec::new())
}

/// Checks the topics that exist among `topics`: each one with fewer
/// replicas than its `min.insync.replicas` refuses every `acks=all` write,
/// and is returned as a problem naming what to change (and logged as an
/// error); a single copy on a cluster of three brokers or more is logged as
/// a warning, as is a topic named in `one_reader` with a single partition.
///
/// # Errors
/// The metadata cannot be read (the topics' configuration that cannot be
/// read is warned about and left unchecked).
pub async fn unfit_topics(
    broker: &BrokerConfig,
    topics: &[&str],
    one_reader: &[&str],
) -> Result<Vec<String>, BrokerError> {
    let cluster = cluster(broker, Duration::from_secs(10)).await?;
    let present: Vec<&(String, usize, usize)> = cluster
        .topics
        .iter()
        .filter(|(name, _, _)| topics.contains(&name.as_str()))
        .collect();
    if present.is_empty() {
        return Ok(Vec::new());
    }
    let admin: AdminClient<DefaultClientContext> = broker.client().create()?;
    let resources: Vec<ResourceSpecifier<'_>> = present
        .iter()
        .map(|(name, _, _)| ResourceSpecifier::Topic(name))
        .collect();
    let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(5)));
    let described = admin.describe_configs(&resources, &options).await;
    std::thread::spawn(move || drop(admin));
    // An account without the right to describe topics (or an admin API
    // that does not answer) starts all the same: unchecked, and said so.
    let described = described.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "the topics' min.insync.replicas could not be read: their replication is not checked");
        Vec::new()
    });
    let mut problems = Vec::new();
    let mut described = described.into_iter();
    for (name, replicas, partitions) in present {
        let min_insync = described
            .next()
            .and_then(Result::ok)
            .and_then(|config| {
                config
                    .get("min.insync.replicas")
                    .and_then(|entry| entry.value.as_deref().map(str::to_owned))
            })
            .and_then(|value| value.parse::<usize>().ok())
            .unwrap_or(1);
        if *replicas < min_insync {
            let problem = format!(
                "topic {name} has {replicas} replica(s) but min.insync.replicas={min_insync}: brokers without eligible leader replicas (Kafka before 4.0, or with them off) refuse every acks=all write to it, and Kafka 4 counts it as min.insync.replicas={replicas}, so no write survives the loss of a broker; raise its replication factor (kafka-reassign-partitions) or lower its min.insync.replicas"
            );
            tracing::error!(topic = %name, replicas, min_insync, "{problem}");
            problems.push(problem);
        } else if *replicas == 1 && cluster.brokers >= 3 {
            tracing::warn!(topic = %name, brokers = cluster.brokers,
                "topic has a single replica on a cluster of three brokers or more: the loss of its broker loses it");
        }
        if *partitions == 1 && one_reader.contains(&name.as_str()) {
            tracing::warn!(topic = %name,
                "topic has one partition: one worker of the group reads it at a time (more partitions, FLOTILLA_TOPIC_PARTITIONS for those Flotilla creates, let more read)");
        }
    }
    Ok(problems)
}

/// The brokers and topics the cluster's metadata lists.
async fn cluster(broker: &BrokerConfig, timeout: Duration) -> Result<Cluster, BrokerError> {
    let config = broker.client();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config.create()?;
        let metadata = consumer.fetch_metadata(None, timeout)?;
        let topics = metadata
            .topics()
            .iter()
            .filter(|topic| topic.error().is_none())
            .map(|topic| {
                let replicas = topic
                    .partitions()
                    .iter()
                    .map(|partition| partition.replicas().len())
                    .min()
                    .unwrap_or(0);
                (topic.name().to_owned(), replicas, topic.partitions().len())
            })
            .collect();
        let brokers = metadata.brokers().len();
        // librdkafka can block in a consumer's destructor.
        std::thread::spawn(move || drop(consumer));
        Ok(Cluster { brokers, topics })
    })
    .await
    .map_err(|_| BrokerError::Interrupted)?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_topics_get_the_configured_partitions_replicas_and_min_insync_replicas() {
        let layout = TopicLayout {
            create_topics: true,
            topic_partitions: 6,
            topic_replication: 3,
            topic_min_insync_replicas: 2,
        };
        let mut text = String::new();
        let topics = layout.new_topics(&["events"], 5, &mut text);
        assert_eq!(topics[0].num_partitions, 6);
        assert!(matches!(topics[0].replication, TopicReplication::Fixed(3)));
        assert_eq!(topics[0].config, [("min.insync.replicas", "2")]);
        let mut text = String::new();
        let defaults = TopicLayout::broker_defaults().new_topics(&["events"], 5, &mut text);
        assert_eq!(defaults[0].num_partitions, BROKER_DEFAULT);
        assert!(
            matches!(
                defaults[0].replication,
                TopicReplication::Fixed(BROKER_DEFAULT)
            ),
            "the broker's default"
        );
        assert!(defaults[0].config.is_empty(), "the broker's default");
    }

    /// The rules: three copies (or every broker of a smaller cluster), and
    /// two in sync once there are three.
    #[test]
    fn auto_lays_a_topic_out_for_the_cluster_found() {
        let auto = TopicLayout::fit_for_the_cluster();
        assert_eq!(auto.resolve(1), (1, Some(1)));
        assert_eq!(auto.resolve(2), (2, Some(1)));
        assert_eq!(auto.resolve(3), (3, Some(2)));
        assert_eq!(auto.resolve(9), (3, Some(2)));
        let told = TopicLayout {
            topic_replication: 5,
            ..TopicLayout::fit_for_the_cluster()
        };
        assert_eq!(told.resolve(9), (5, Some(2)));
        let broker = TopicLayout {
            topic_replication: BROKER_DEFAULT,
            ..TopicLayout::fit_for_the_cluster()
        };
        assert_eq!(broker.resolve(9), (BROKER_DEFAULT, None));
    }

    #[test]
    fn auto_is_a_word_of_its_own_and_zero_is_refused() {
        assert_eq!(parse_auto("auto"), Ok(AUTO));
        assert_eq!(parse_auto("-1"), Ok(BROKER_DEFAULT));
        assert_eq!(parse_auto("3"), Ok(3));
        assert!(parse_auto("0").is_err());
        assert!(parse_partitions("auto").is_err());
    }
}
