//! Kafka client plumbing shared by the worker's parts.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

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
