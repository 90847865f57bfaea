//! The relay against real Postgres and Apache Kafka (a broker of the test's
//! own where it is killed; librdkafka's mock cluster only where a test needs
//! injected request errors, round-trip delays or a second broker, which a
//! real single broker cannot give): guarantee 8 in docs/architecture.md.

mod cluster;
mod failures;
mod fencing;
mod hostile;
mod order;
mod partitions;
mod registry;
mod retention;
mod step_requests;
mod wake;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use flotilla_contracts::WorkflowRunEvent;
use flotilla_relay::publisher::EVENT_TYPE_HEADER;
use flotilla_relay::{Relay, RelaySettings};
use flotilla_store::outbox::{self, EventKind, EventStamp};
use flotilla_store::{ManualClock, SystemClock};
use flotilla_tests::kafka::{KafkaOptions, OwnKafka};
use flotilla_tests::{KAFKA_TEST_TIMEOUT, bootstrap_servers, close_consumer, create_topic, unique};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Headers;
use rdkafka::{ClientConfig, Message};
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// Inserts `count` events (ACCEPTED, checkpoints…, COMPLETED) for each job,
/// interleaved across jobs as concurrent jobs would write them.
async fn insert_events(pool: &PgPool, jobs: &[Uuid], count: i64, result: serde_json::Value) {
    for sequence in 1..=count {
        insert_event_of(pool, jobs, sequence, count, result.clone()).await;
    }
}

/// Inserts event `sequence` of `count` for each job: ACCEPTED first,
/// COMPLETED with `result` last, checkpoints between.
async fn insert_event_of(
    pool: &PgPool,
    jobs: &[Uuid],
    sequence: i64,
    count: i64,
    result: serde_json::Value,
) {
    let mut conn = pool.acquire().await.unwrap();
    for job_id in jobs {
        let stamp = EventStamp {
            metadata: None,
            job_id: *job_id,
            event_sequence: sequence,
            workflow_name: "relayed".into(),
            workflow_version: Some(3),
            attempt: 1,
            traceparent: Some(format!("00-{}-00f067aa0ba902b7-01", job_id.simple())),
            tracestate: Some("flotilla=relayed".into()),
        };
        let kind = match sequence {
            1 => EventKind::Accepted,
            n if n == count => EventKind::Completed {
                verdict: "done".into(),
                result: result.clone(),
            },
            n => EventKind::StepCheckpoint {
                step: format!("step{n}"),
                note: None,
            },
        };
        outbox::insert(&mut conn, &stamp, kind, Utc::now())
            .await
            .unwrap();
    }
}

fn settings(bootstrap: &str, topic: &str, relay_id: &str) -> RelaySettings {
    let mut settings = RelaySettings::new(
        flotilla_runtime::BrokerConfig::new(bootstrap),
        topic,
        relay_id,
    );
    settings.idle_poll_max = Duration::from_millis(20);
    settings
}

async fn count(pool: &PgPool, status: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM workflow_run_outbox_state WHERE status = $1")
        .bind(status)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Reads `expected` events from `topic`: (partition, key, event, headers).
async fn read_events(
    bootstrap: &str,
    topic: &str,
    expected: usize,
) -> Vec<(i32, String, WorkflowRunEvent, HashMap<String, String>)> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", unique("event-reader"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut events = Vec::with_capacity(expected);
    while events.len() < expected {
        let message = consumer.recv().await.unwrap();
        let event =
            flotilla_contracts::json::decode::<WorkflowRunEvent>(message.payload().unwrap())
                .unwrap();
        let key = String::from_utf8(message.key().unwrap().to_vec()).unwrap();
        let headers = message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| {
                        (
                            h.key.to_owned(),
                            String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        events.push((message.partition(), key, event, headers));
    }
    close_consumer(consumer);
    events
}

/// Per job, the sequences in the order they sit in the topic.
fn sequences_by_job(
    events: &[(i32, String, WorkflowRunEvent, HashMap<String, String>)],
) -> BTreeMap<Uuid, Vec<i64>> {
    let mut by_job: BTreeMap<Uuid, Vec<i64>> = BTreeMap::new();
    let mut partition_of: HashMap<Uuid, i32> = HashMap::new();
    for (partition, key, event, _) in events {
        assert_eq!(key, &event.job_id().to_string(), "keyed by job id");
        assert_eq!(
            *partition_of.entry(event.job_id()).or_insert(*partition),
            *partition,
            "one job, one partition"
        );
        by_job
            .entry(event.job_id())
            .or_default()
            .push(event.sequence());
    }
    by_job
}

/// Every copy on `topic` now, duplicates included: the sum of its
/// partitions' high watermarks.
fn copies_on_topic(bootstrap: &str, topic: &str, partitions: i32) -> usize {
    let reader: rdkafka::consumer::BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    (0..partitions)
        .map(|partition| {
            let (_, high) = reader
                .fetch_watermarks(topic, partition, Duration::from_secs(10))
                .unwrap();
            usize::try_from(high).unwrap()
        })
        .sum()
}

/// Checks every job's raw stream (every copy, in topic order) as the fence
/// promises it: the first copy of each event comes in sequence order, and
/// any other copy is a repeat of an event already seen (one that trails a
/// later event is allowed: a record on the wire when its relay's lease
/// lapsed). Returns each job's first copies, and how many copies were
/// repeats.
fn without_repeats(
    events: &[(i32, String, WorkflowRunEvent, HashMap<String, String>)],
) -> (BTreeMap<Uuid, Vec<i64>>, usize) {
    let mut repeats = 0;
    let mut distinct = BTreeMap::new();
    for (job, raw) in sequences_by_job(events) {
        let mut first: Vec<i64> = Vec::new();
        for sequence in &raw {
            if first.contains(sequence) {
                repeats += 1;
            } else {
                assert!(
                    first.last().is_none_or(|last| last < sequence),
                    "job {job}: the first copy of sequence {sequence} after a later one: {raw:?}"
                );
                first.push(*sequence);
            }
        }
        distinct.insert(job, first);
    }
    (distinct, repeats)
}
