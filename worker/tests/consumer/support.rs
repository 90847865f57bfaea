//! Harness for the consumer tests: unique topics and groups, an engine over
//! the test database, producing raw and encoded requests, reading the
//! dead-letter topic and the group's committed offsets.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use flotilla_codec::Codec;
use flotilla_contracts::WorkflowRunRequest;
use flotilla_runtime::kafka::GroupProtocol;
use flotilla_tests::{create_topic, schema_registry_url, unique};
use flotilla_worker::engine::{Engine, EngineSettings, SystemClock};
use flotilla_worker::ingest::{ConsumerSettings, RequestConsumer};
use flotilla_worker::test_support::echo_targets;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

pub(crate) const PARTITIONS: i32 = 3;
/// The consumers' request size limit here (the default is 1 MiB; a test
/// message above that would exceed the producer's own limit).
pub(crate) const MAX_REQUEST_BYTES: usize = 64 * 1024;

pub(crate) struct Topics {
    pub requests: String,
    pub dead_letters: String,
    pub group: String,
    /// The group protocol its consumers join with.
    pub protocol: GroupProtocol,
}

pub(crate) async fn topics() -> Topics {
    topics_for(GroupProtocol::Classic).await
}

/// Topics of a test's own, and a group its consumers join with `protocol`.
pub(crate) async fn topics_for(protocol: GroupProtocol) -> Topics {
    let requests = unique("requests");
    let dead_letters = flotilla_contracts::topics::dead_letter_topic(&requests);
    create_topic(&requests, PARTITIONS).await.unwrap();
    create_topic(&dead_letters, 1).await.unwrap();
    Topics {
        requests,
        dead_letters,
        group: unique("workers"),
        protocol,
    }
}

pub(crate) fn engine(pool: &PgPool) -> Engine {
    let mut settings = EngineSettings::new("consumer-test");
    settings.idle_poll_max = Duration::from_millis(50);
    Engine::new(
        pool.clone(),
        echo_targets(),
        Arc::new(SystemClock),
        settings,
    )
}

/// `greet`: one echo step; the input needs a string `name`.
pub(crate) async fn register_greet(engine: &Engine) {
    engine
        .register_workflow(&json!({
            "name": "greet",
            "input_schema": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
            "steps": [{"name": "hello", "target": "echo", "method": "hello", "rules": ["name = input.name"]}]
        }))
        .await
        .unwrap();
}

pub(crate) fn codec() -> Arc<Codec> {
    Arc::new(Codec::with_registry(&schema_registry_url()).unwrap())
}

pub(crate) fn consumer(engine: &Engine, topics: &Topics) -> RequestConsumer {
    consumer_with_codec(engine, topics, codec())
}

/// A consumer that resolves schema ids through `codec`.
pub(crate) fn consumer_with_codec(
    engine: &Engine,
    topics: &Topics,
    codec: Arc<Codec>,
) -> RequestConsumer {
    let mut settings =
        ConsumerSettings::new(flotilla_tests::broker(), &topics.requests, &topics.group);
    settings.batch_size = 200;
    settings.group_protocol = topics.protocol;
    settings.max_request_bytes = MAX_REQUEST_BYTES;
    settings.outage_backoff_max = Duration::from_millis(500);
    RequestConsumer::subscribe(engine.clone(), codec, settings).unwrap()
}

pub(crate) fn producer() -> FutureProducer {
    flotilla_tests::broker()
        .idempotent_producer()
        .set("linger.ms", "5")
        .create()
        .unwrap()
}

/// Produces raw bytes keyed `key`; returns (partition, offset).
pub(crate) async fn produce_raw(
    producer: &FutureProducer,
    topic: &str,
    key: &str,
    payload: &[u8],
    headers: Option<OwnedHeaders>,
) -> (i32, i64) {
    let mut record = FutureRecord::to(topic).key(key).payload(payload);
    if let Some(headers) = headers {
        record = record.headers(headers);
    }
    let delivery = producer
        .send(record, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    (delivery.partition, delivery.offset)
}

/// Produces raw bytes to one partition, keyed by nothing.
pub(crate) async fn produce_to(
    producer: &FutureProducer,
    topic: &str,
    partition: i32,
    payload: &[u8],
    headers: Option<OwnedHeaders>,
) {
    let mut record = FutureRecord::<(), [u8]>::to(topic)
        .partition(partition)
        .payload(payload);
    if let Some(headers) = headers {
        record = record.headers(headers);
    }
    producer
        .send(record, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .unwrap();
}

/// Produces a request for `greet`, Avro through the registry or JSON.
pub(crate) async fn produce_request(
    producer: &FutureProducer,
    topic: &str,
    job_id: Uuid,
    input: Value,
    avro: bool,
) {
    let request = WorkflowRunRequest::new(job_id, "greet", input).unwrap();
    let bytes = if avro {
        codec().encode(topic, &request).await.unwrap()
    } else {
        flotilla_contracts::json::encode(&request).unwrap()
    };
    produce_raw(producer, topic, &job_id.to_string(), &bytes, None).await;
}

pub(crate) async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// A dead-letter record: its payload and headers by name.
#[derive(Debug)]
pub(crate) struct Letter {
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub headers: HashMap<String, String>,
}

/// Reads exactly `expected` records from the dead-letter topic.
pub(crate) async fn dead_letters(topic: &str, expected: usize) -> Vec<Letter> {
    let consumer: StreamConsumer =
        flotilla_tests::manual_commit_consumer_config(&unique("dlq-reader"))
            .create()
            .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut letters = Vec::new();
    while letters.len() < expected {
        let message = consumer.recv().await.unwrap();
        let headers = message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|Header { key, value }| {
                        (
                            key.to_owned(),
                            String::from_utf8_lossy(value.unwrap_or_default()).into_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        letters.push(Letter {
            key: message.key().map(<[u8]>::to_vec),
            payload: message.payload().unwrap_or_default().to_vec(),
            headers,
        });
    }
    flotilla_tests::close_consumer(consumer);
    letters
}

/// How many records the (one-partition) dead-letter topic holds.
pub(crate) fn dead_letter_count(topic: &str) -> i64 {
    let consumer: BaseConsumer =
        flotilla_tests::manual_commit_consumer_config(&unique("dlq-count"))
            .create()
            .unwrap();
    let (low, high) = consumer
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .unwrap();
    std::thread::spawn(move || drop(consumer));
    high - low
}

/// The group's committed offset and the high watermark, per partition.
pub(crate) fn committed_and_end(topic: &str, group: &str) -> Vec<(i64, i64)> {
    let consumer: BaseConsumer = flotilla_tests::manual_commit_consumer_config(group)
        .create()
        .unwrap();
    let mut partitions = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        partitions.add_partition(topic, p);
    }
    let committed = consumer
        .committed_offsets(partitions, Duration::from_secs(10))
        .unwrap();
    let result = (0..PARTITIONS)
        .map(|p| {
            let offset = match committed.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                _ => 0,
            };
            let (_, high) = consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .unwrap();
            (offset, high)
        })
        .collect();
    std::thread::spawn(move || drop(consumer));
    result
}

/// Polls until every partition's committed offset reached its end.
pub(crate) async fn wait_committed_to_end(topic: &str, group: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (topic_owned, group_owned) = (topic.to_owned(), group.to_owned());
        let offsets =
            tokio::task::spawn_blocking(move || committed_and_end(&topic_owned, &group_owned))
                .await
                .unwrap();
        if offsets.iter().all(|(committed, end)| committed == end) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "offsets never reached the end: {offsets:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(crate) fn traceparent_header(value: &str) -> OwnedHeaders {
    OwnedHeaders::new().insert(Header {
        key: "traceparent",
        value: Some(value.as_bytes()),
    })
}

/// librdkafka's mock cluster with a request topic and its dead-letter
/// topic, one partition each: for the request errors a test injects, which
/// a real broker cannot be made to answer.
pub(crate) struct MockTopics {
    pub(crate) cluster:
        rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    pub(crate) requests: String,
    pub(crate) dead_letters: String,
}

impl MockTopics {
    pub(crate) fn new(prefix: &str) -> Self {
        let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
        let requests = unique(&format!("{prefix}-requests"));
        let dead_letters = flotilla_contracts::topics::dead_letter_topic(&requests);
        cluster.create_topic(&requests, 1, 1).unwrap();
        cluster.create_topic(&dead_letters, 1, 1).unwrap();
        Self {
            cluster,
            requests,
            dead_letters,
        }
    }

    pub(crate) fn broker(&self) -> flotilla_runtime::BrokerConfig {
        flotilla_runtime::BrokerConfig::new(&self.cluster.bootstrap_servers())
    }

    /// Consumer settings for a group of its own on this cluster.
    pub(crate) fn settings(&self) -> ConsumerSettings {
        ConsumerSettings::new(self.broker(), &self.requests, &unique("mock-workers"))
    }
}

/// Submits a job of the stored `workflow` with an empty input, through
/// the engine (not the topic).
pub(crate) async fn submit_stored(engine: &Engine, job_id: Uuid, workflow: &str) {
    engine
        .submit(
            flotilla_worker::engine::Submission {
                metadata: None,
                priority: 0,
                job_id,
                workflow: flotilla_worker::engine::WorkflowRef::Stored(workflow.into()),
                input: json!({}),
                traceparent: None,
                tracestate: None,
            },
            flotilla_worker::engine::RefusalMode::Refuse,
        )
        .await
        .unwrap();
}

/// Polls until `group` is stable with `members` members: each then holds
/// partitions of a topic with more partitions than members.
pub(crate) async fn wait_members(group: &str, members: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let group_owned = group.to_owned();
        let found = tokio::task::spawn_blocking(move || {
            let client: BaseConsumer = flotilla_tests::manual_commit_consumer_config(&group_owned)
                .create()
                .unwrap();
            let seen = client
                .fetch_group_list(Some(&group_owned), Duration::from_secs(5))
                .ok()
                .and_then(|list| {
                    list.groups()
                        .first()
                        .map(|g| (g.state().to_owned(), g.members().len()))
                });
            std::thread::spawn(move || drop(client));
            seen
        })
        .await
        .unwrap();
        if matches!(&found, Some((state, n)) if state == "Stable" && *n == members) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "group {group} never had {members} members: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
