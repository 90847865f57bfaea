//! Kafka client plumbing shared by the worker's parts.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

/// Asks the broker for cluster metadata, so a wrong address fails at start-up
/// rather than at the first message.
///
/// # Errors
/// The broker does not answer within `timeout`.
pub async fn check_reachable(bootstrap_servers: &str, timeout: Duration) -> anyhow::Result<()> {
    let bootstrap_servers = bootstrap_servers.to_owned();
    // librdkafka's calls block; keep them off the async workers.
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap_servers)
            .create()?;
        let metadata = consumer.fetch_metadata(None, timeout)?;
        tracing::info!(
            brokers = metadata.brokers().len(),
            topics = metadata.topics().len(),
            "Kafka reachable"
        );
        Ok(())
    })
    .await?
}

/// Creates the topics that do not exist yet (replication 1 on a single
/// broker; operators of a real cluster create them with their own settings
/// first, and then this does nothing).
///
/// # Errors
/// The broker refuses for another reason than "already exists".
pub async fn ensure_topics(
    bootstrap_servers: &str,
    topics: &[&str],
    partitions: i32,
) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers)
        .create()?;
    let new_topics: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|topic| NewTopic::new(topic, partitions, TopicReplication::Fixed(1)))
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin.create_topics(&new_topics, &options).await? {
        match result {
            Ok(topic) => tracing::info!(topic, partitions, "topic created"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => anyhow::bail!("creating topic {topic}: {code}"),
        }
    }
    std::thread::spawn(move || drop(admin));
    Ok(())
}
