//! Helpers for the end-to-end tests: where the services are, unique names,
//! and Kafka clients that are created and closed the way these tests need.
//!
//! The services come from `scripts/services up`; a test that cannot find one
//! fails with a message saying so instead of skipping.

pub mod database;
pub mod kafka;
pub mod pgbouncer;
pub mod postgres_server;
pub mod process;
pub mod proxy;
pub mod registry_stub;
pub mod replication;
pub mod scratch;
pub mod tls;
pub mod tls_postgres;

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};

/// Upper bound for any one Kafka test, so a hang fails instead of eating CI.
pub const KAFKA_TEST_TIMEOUT: Duration = Duration::from_secs(90);

/// A required setting from the environment that `scripts/services env` exports.
///
/// # Panics
/// The variable is unset: the services are not up.
#[must_use]
pub fn service_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run `scripts/services up` and `eval \"$(scripts/services env)\"`, or use scripts/test")
    })
}

#[must_use]
pub fn bootstrap_servers() -> String {
    service_env("KAFKA_BOOTSTRAP_SERVERS")
}

/// The shared broker as the binaries' settings describe it (JSON on the wire).
#[must_use]
pub fn broker() -> flotilla_runtime::BrokerConfig {
    flotilla_runtime::BrokerConfig::new(&bootstrap_servers())
}

/// The Python interpreter the examples run with (`scripts/python-examples`
/// installs their client libraries; `scripts/test` exports it), and the
/// examples' directory.
///
/// # Panics
/// `FLOTILLA_EXAMPLES_PYTHON` is unset.
#[must_use]
pub fn examples_python() -> (std::path::PathBuf, std::path::PathBuf) {
    let python = std::env::var("FLOTILLA_EXAMPLES_PYTHON").unwrap_or_else(|_| {
        panic!("FLOTILLA_EXAMPLES_PYTHON is not set: run `export FLOTILLA_EXAMPLES_PYTHON=$(scripts/python-examples)`, or use scripts/test")
    });
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .join("examples");
    (python.into(), examples)
}

#[must_use]
pub fn schema_registry_url() -> String {
    service_env("SCHEMA_REGISTRY_URL")
}

/// A name no other test run uses: `<prefix>-<uuid>`.
#[must_use]
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// Creates `topic` with `partitions` partitions.
///
/// # Errors
/// The broker refuses or does not answer.
pub async fn create_topic(topic: &str, partitions: i32) -> anyhow::Result<()> {
    create_topic_on(&bootstrap_servers(), topic, partitions).await
}

/// As [`create_topic`], on the broker at `bootstrap` (a test's own).
///
/// # Errors
/// The broker refuses or does not answer.
pub async fn create_topic_on(bootstrap: &str, topic: &str, partitions: i32) -> anyhow::Result<()> {
    create_topic_with(bootstrap, topic, partitions, &[]).await
}

/// As [`create_topic_on`], with topic configuration (`max.message.bytes`).
///
/// # Errors
/// The broker refuses or does not answer.
pub async fn create_topic_with(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    config: &[(&str, &str)],
) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let mut new_topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for (key, value) in config {
        new_topic = new_topic.set(key, value);
    }
    for result in admin.create_topics([&new_topic], &options).await? {
        result.map_err(|(topic, code)| anyhow::anyhow!("creating {topic}: {code}"))?;
    }
    Ok(())
}

/// Consumer settings for a group that commits by hand, from the beginning.
#[must_use]
pub fn manual_commit_consumer_config(group: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap_servers())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "10000");
    config
}

/// Leaves the group and drops the consumer on a thread of its own: librdkafka
/// can block in its destructor, and a test must not hang on it.
pub fn close_consumer(consumer: StreamConsumer) {
    consumer.unsubscribe();
    std::thread::spawn(move || drop(consumer));
}

/// A free local port (bound, read, released): for a child process or a
/// server that must be told its port before it starts.
///
/// # Panics
/// None can be bound.
#[must_use]
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
