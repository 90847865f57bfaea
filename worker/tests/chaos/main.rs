//! The chaos suite: a fleet of worker and relay processes on an Apache
//! Kafka of the suite's own, requests arriving while faults strike, and at
//! quiescence every guarantee checked with the figures printed.
//!
//! - `storm`: workers and relays killed, paused past their leases, the
//!   workers' database cut, the broker restarted; under three kinds of
//!   group membership and behind a transaction-mode pooler.
//! - `brokers`: a three-broker cluster whose brokers are killed, frozen,
//!   lose the group's coordinator during a rebalance and have a leader
//!   moved, while jobs with Kafka request/reply steps run.
//!
//! This file holds what both share: the recording HTTP target, the reads
//! of topics and committed offsets, and the tally of step calls.

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use flotilla_tests::process::Running;
use flotilla_tests::{close_consumer, unique};
use rdkafka::Message as _;
use rdkafka::consumer::{BaseConsumer, Consumer as _, StreamConsumer};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

mod brokers;
mod storm;

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// Partitions of each topic.
const PARTITIONS: i32 = 3;

/// A small deterministic random sequence (xorshift), so a failing run can be replayed.
struct Faults(u64);

impl Faults {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

/// One call the target saw.
#[derive(Clone, Debug)]
struct Call {
    /// Its `Idempotency-Key` header, if it had one.
    key: Option<String>,
    /// Answered 503: an injected transient failure, which the worker retries.
    busy: bool,
}

/// Every call the target saw, by (job, step), and how it answers. The job
/// is the one the request body names (the workflows' rules copy it from the
/// input), not the one in the idempotency key, so the key can be checked
/// against it. A body with `"fail": true` is answered `"ok": false`, which
/// the workflows' `validate` rule on step `two` turns into a verdict
/// (FAILED).
#[derive(Clone, Default)]
struct Recorder {
    calls: Arc<Mutex<Calls>>,
    /// The jobs whose steps' first call answers 503 (retried by the worker).
    flaky: Option<Jobs>,
    /// The jobs whose step `two` answers only after this long, so their
    /// leases are renewed while it runs.
    slow: Option<(Jobs, Duration)>,
}

/// Which jobs a behaviour of the target applies to.
type Jobs = fn(Uuid) -> bool;

/// The calls of each (job, step), in the order they came.
type Calls = HashMap<(Uuid, String), Vec<Call>>;

async fn record(
    State(recorder): State<Recorder>,
    UrlPath(step): UrlPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, axum::Json<serde_json::Value>) {
    // A body that names no job is recorded under the nil id (and fails the run).
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let job = body["job"]
        .as_str()
        .and_then(|job| job.parse().ok())
        .unwrap_or(Uuid::nil());
    let fail = body["fail"].as_bool() == Some(true);
    let key = headers
        .get("idempotency-key")
        .and_then(|key| key.to_str().ok())
        .map(str::to_owned);
    let busy = {
        let mut seen = recorder.calls.lock().unwrap();
        let calls = seen.entry((job, step.clone())).or_default();
        let busy = calls.is_empty() && recorder.flaky.is_some_and(|flaky| flaky(job));
        calls.push(Call { key, busy });
        busy
    };
    if busy {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"busy": true})),
        );
    }
    if let Some((slow, pause)) = recorder.slow
        && step == "two"
        && slow(job)
    {
        tokio::time::sleep(pause).await;
    }
    (
        StatusCode::OK,
        axum::Json(json!({"step": step, "ok": !fail})),
    )
}

async fn start_target(recorder: Recorder) -> String {
    let app = axum::Router::new()
        .route("/{step}", post(record))
        .with_state(recorder);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

fn start(command: Command, ready: &str) -> Running {
    let mut running = Running::start(command);
    running.wait_for_line(ready, Duration::from_secs(60));
    running
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// Polls until `jobs` rows have settled and no event waits in the outbox;
/// fails the run after `within`.
async fn quiesce(pool: &PgPool, jobs: usize, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let settled = count(pool, "SELECT count(*) FROM workflow_run WHERE status IN ('COMPLETED','FAILED','DEAD','CANCELLED')").await;
        let pending = count(
            pool,
            "SELECT count(*) FROM workflow_run_outbox_state WHERE status = 'PENDING'",
        )
        .await;
        if settled == i64::try_from(jobs).unwrap() && pending == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no quiescence: {settled} settled of {jobs}, {pending} events pending"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A record read back from a topic.
struct Record {
    topic: String,
    partition: i32,
    payload: Vec<u8>,
}

/// Every record of `topics` (each of [`PARTITIONS`] partitions), from the
/// start to the end each had when the read began, outside any group.
async fn read_topics(kafka: &flotilla_runtime::BrokerConfig, topics: &[&str]) -> Vec<Record> {
    let consumer: StreamConsumer = kafka
        .manual_commit_consumer(&unique("chaos-reader"))
        .create()
        .unwrap();
    let mut assignment = rdkafka::TopicPartitionList::new();
    let mut ends = HashMap::new();
    for topic in topics {
        for partition in 0..PARTITIONS {
            let (_, high) = consumer
                .fetch_watermarks(topic, partition, Duration::from_secs(10))
                .unwrap();
            ends.insert(((*topic).to_owned(), partition), high);
            assignment
                .add_partition_offset(topic, partition, rdkafka::Offset::Beginning)
                .unwrap();
        }
    }
    consumer.assign(&assignment).unwrap();
    let mut read: HashMap<(String, i32), i64> = HashMap::new();
    let mut records = Vec::new();
    while ends
        .iter()
        .any(|(at, end)| read.get(at).copied().unwrap_or(0) < *end)
    {
        let message = consumer.recv().await.unwrap();
        let topic = message.topic().to_owned();
        read.insert((topic.clone(), message.partition()), message.offset() + 1);
        records.push(Record {
            topic,
            partition: message.partition(),
            payload: message.payload().unwrap_or_default().to_vec(),
        });
    }
    close_consumer(consumer);
    records
}

/// Per partition of `topic`: `group`'s committed offset (0 when it has
/// committed none) and the high watermark. Polled until they agree on every
/// partition or a minute passes: offsets are committed asynchronously, a
/// moment after the rows.
async fn committed_offsets(
    kafka: &flotilla_runtime::BrokerConfig,
    group: &str,
    topic: &str,
) -> Vec<(i32, i64, i64)> {
    let (kafka, group, topic) = (kafka.clone(), group.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        // The workers' group id without joining the group: nothing is
        // subscribed, so this client only asks the coordinator for offsets.
        let consumer: BaseConsumer = kafka.manual_commit_consumer(&group).create().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let offsets = loop {
            let mut partitions = rdkafka::TopicPartitionList::new();
            for partition in 0..PARTITIONS {
                partitions.add_partition(&topic, partition);
            }
            let committed = consumer
                .committed_offsets(partitions, Duration::from_secs(10))
                .expect("the group's committed offsets");
            let offsets: Vec<(i32, i64, i64)> = (0..PARTITIONS)
                .map(|partition| {
                    let at = committed
                        .find_partition(&topic, partition)
                        .and_then(|entry| match entry.offset() {
                            rdkafka::Offset::Offset(at) => Some(at),
                            _ => None,
                        })
                        .unwrap_or(0);
                    let (_, high) = consumer
                        .fetch_watermarks(&topic, partition, Duration::from_secs(10))
                        .unwrap();
                    (partition, at, high)
                })
                .collect();
            if offsets.iter().all(|(_, at, high)| at == high) || Instant::now() >= deadline {
                break offsets;
            }
            std::thread::sleep(Duration::from_millis(250));
        };
        // librdkafka can block in a consumer's destructor.
        std::thread::spawn(move || drop(consumer));
        offsets
    })
    .await
    .unwrap()
}

/// The target's calls, summed up: repeats of a (job, step) call split into
/// those an injected 503 explains (each 503 is retried once) and the rest.
#[derive(Default)]
struct CallFigures {
    calls: usize,
    injected_503s: usize,
    repeats: usize,
    after_503s: usize,
    after_faults: usize,
    /// The most calls one (job, step) got.
    most: usize,
    /// (job, step, keys) whose calls did not all carry `<job>:<step>`.
    wrong_keys: Vec<(Uuid, String, Vec<Option<String>>)>,
}

fn call_figures(calls: &Calls) -> CallFigures {
    let mut figures = CallFigures::default();
    for ((job, step), seen) in calls {
        let busy = seen.iter().filter(|call| call.busy).count();
        let repeats = seen.len() - 1;
        figures.calls += seen.len();
        figures.injected_503s += busy;
        figures.repeats += repeats;
        figures.after_503s += repeats.min(busy);
        figures.after_faults += repeats - repeats.min(busy);
        figures.most = figures.most.max(seen.len());
        // The first call's key is the job's and step's, and every repeat carries it.
        let want = format!("{job}:{step}");
        if seen
            .iter()
            .any(|call| call.key.as_deref() != Some(want.as_str()))
        {
            let keys = seen.iter().map(|call| call.key.clone()).collect();
            figures.wrong_keys.push((*job, step.clone(), keys));
        }
    }
    figures
}
