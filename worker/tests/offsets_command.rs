//! `flotilla-worker offsets set` (review K11): an operator skips a backlog
//! by moving the group's offsets in Kafka and in the database together (Kafka's
//! own tool alone is undone at the next assignment, which goes back to the
//! database's); refused while the group has members.

use std::collections::HashSet;
use std::process::Command;
use std::time::Duration;

use flotilla_contracts::WorkflowRunRequest;
use flotilla_store::consumer_offsets::{self, PartitionOffset};
use flotilla_tests::KAFKA_TEST_TIMEOUT;
use flotilla_tests::process::Running;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use sqlx::PgPool;
use uuid::Uuid;

const BINARY: &str = env!("CARGO_BIN_EXE_flotilla-worker");
const PARTITIONS: i32 = 3;

/// The database's URL, and a request topic and a group of the test's own.
async fn fresh(pool: &PgPool) -> (String, String, String) {
    let topic = flotilla_tests::unique("requests");
    flotilla_tests::create_topic(&topic, PARTITIONS)
        .await
        .unwrap();
    let url = flotilla_tests::database::url_of(pool).await;
    (url, topic, flotilla_tests::unique("workers"))
}

/// The binary with the database and the broker, nothing else.
fn binary(database_url: &str) -> Command {
    flotilla_tests::process::with_services(BINARY, database_url)
}

/// A worker reading `topic` in `group`.
fn worker(database_url: &str, topic: &str, group: &str) -> Command {
    let mut command = binary(database_url);
    command
        .env("FLOTILLA_WORKER_ID", "offsets-test")
        .env("FLOTILLA_HTTP_ADDR", "127.0.0.1:0")
        .env("FLOTILLA_API_TOKENS", "test-token")
        .env("FLOTILLA_REQUEST_TOPIC", topic)
        .env("FLOTILLA_CONSUMER_GROUP", group);
    command
}

/// `offsets set` of `group` on `topic` to its end.
fn to_latest(database_url: &str, topic: &str, group: &str) -> Command {
    let mut command = binary(database_url);
    command.args([
        "offsets",
        "set",
        "--group",
        group,
        "--topic",
        topic,
        "--to-latest",
    ]);
    command
}

/// Runs `command` to its end, off the runtime.
async fn run_to_end(command: Command) -> (std::process::ExitStatus, String) {
    tokio::task::spawn_blocking(move || {
        let mut running = Running::start(command);
        let status = running.wait(Duration::from_secs(60));
        (status, running.output.join("\n"))
    })
    .await
    .unwrap()
}

/// Produces a request per job (a workflow no one registered: each
/// becomes a FAILED row once read, which is all these tests look for).
async fn produce(topic: &str, jobs: &[Uuid]) {
    let producer: FutureProducer = flotilla_tests::broker()
        .idempotent_producer()
        .create()
        .unwrap();
    for job in jobs {
        let request = WorkflowRunRequest::new(*job, "backlog", serde_json::json!({})).unwrap();
        let bytes = flotilla_contracts::json::encode(&request).unwrap();
        let key = job.to_string();
        producer
            .send(
                FutureRecord::to(topic).key(&key).payload(&bytes),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
    std::thread::spawn(move || drop(producer));
}

/// Per partition: (the group's committed offset in Kafka, the end).
async fn kafka_offsets(topic: &str, group: &str) -> Vec<(Option<i64>, i64)> {
    let (topic, group) = (topic.to_owned(), group.to_owned());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = flotilla_tests::manual_commit_consumer_config(&group)
            .create()
            .unwrap();
        let mut list = TopicPartitionList::new();
        for partition in 0..PARTITIONS {
            list.add_partition(&topic, partition);
        }
        let committed = consumer
            .committed_offsets(list, Duration::from_secs(10))
            .unwrap();
        let offsets = (0..PARTITIONS)
            .map(|partition| {
                let kafka = match committed
                    .find_partition(&topic, partition)
                    .unwrap()
                    .offset()
                {
                    Offset::Offset(offset) => Some(offset),
                    _ => None,
                };
                let (_, end) = consumer
                    .fetch_watermarks(&topic, partition, Duration::from_secs(10))
                    .unwrap();
                (kafka, end)
            })
            .collect();
        std::thread::spawn(move || drop(consumer));
        offsets
    })
    .await
    .unwrap()
}

/// The database's offsets of `group`, by partition.
async fn database_offsets(pool: &PgPool, group: &str) -> Vec<(i32, i64)> {
    sqlx::query_as(
        "SELECT partition, next_offset FROM consumer_offset WHERE group_id = $1 ORDER BY 1",
    )
    .bind(group)
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn rows(pool: &PgPool) -> HashSet<Uuid> {
    sqlx::query_scalar("SELECT job_id FROM workflow_run")
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// A worker group stuck at the start of a backlog (the database's offsets
/// at 0, as a worker that never got past it leaves them) is moved past it
/// with `offsets set --to-latest`: both Kafka's committed offsets and the
/// database's stand at the end, and a worker started afterwards reads only
/// what came after, none of the backlog (with Kafka's alone moved, the
/// assignment would seek back to the database's 0 and read it all).
#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn offsets_set_to_latest_skips_a_backlog_in_kafka_and_the_database_for_a_worker_started_after(
    pool: PgPool,
) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let (url, topic, group) = fresh(&pool).await;
        let stuck: Vec<PartitionOffset> = (0..PARTITIONS)
            .map(|partition| PartitionOffset {
                topic: topic.clone(),
                partition,
                next_offset: 0,
            })
            .collect();
        consumer_offsets::record(&pool, &group, &stuck)
            .await
            .unwrap();
        let backlog: Vec<Uuid> = (0..12).map(|_| Uuid::new_v4()).collect();
        produce(&topic, &backlog).await;

        let (status, output) = run_to_end(to_latest(&url, &topic, &group)).await;
        assert!(status.success(), "offsets set failed:\n{output}");
        assert!(
            output.contains(&format!("{topic}/0: group {group} now at")),
            "{output}"
        );
        let kafka = kafka_offsets(&topic, &group).await;
        assert!(
            kafka
                .iter()
                .all(|(committed, end)| *committed == Some(*end)),
            "{kafka:?}"
        );
        let ends: Vec<(i32, i64)> = (0..PARTITIONS)
            .zip(kafka.iter().map(|(_, end)| *end))
            .collect();
        assert_eq!(
            database_offsets(&pool, &group).await,
            ends,
            "the database's moved too"
        );
        assert_eq!(ends.iter().map(|(_, end)| end).sum::<i64>(), 12);

        let after: Vec<Uuid> = (0..6).map(|_| Uuid::new_v4()).collect();
        produce(&topic, &after).await;
        let mut running =
            flotilla_tests::process::started(worker(&url, &topic, &group), "worker ready").await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let kafka = kafka_offsets(&topic, &group).await;
            let read = rows(&pool).await;
            if after.iter().all(|job| read.contains(job))
                && kafka
                    .iter()
                    .all(|(committed, end)| *committed == Some(*end))
            {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the requests after the move were never all read: {kafka:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let read = rows(&pool).await;
        assert!(
            backlog.iter().all(|job| !read.contains(job)),
            "a request of the skipped backlog was read"
        );
        assert_eq!(read.len(), after.len());
        tokio::task::spawn_blocking(move || running.terminate(Duration::from_secs(30)))
            .await
            .unwrap();
    })
    .await
    .expect("timed out");
}

/// While a worker is a member of the group, `offsets set` refuses, naming
/// the members, and moves nothing (as Kafka's own tool refuses): a live
/// member would commit over the move.
#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn offsets_set_refuses_while_a_member_is_in_the_group(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let (url, topic, group) = fresh(&pool).await;
        let backlog: Vec<Uuid> = (0..6).map(|_| Uuid::new_v4()).collect();
        produce(&topic, &backlog).await;
        let mut running =
            flotilla_tests::process::started(worker(&url, &topic, &group), "worker ready").await;
        // A member once the worker has read the backlog and committed it.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let read = loop {
            let kafka = kafka_offsets(&topic, &group).await;
            // A partition no request went to has nothing to commit.
            if rows(&pool).await.len() == backlog.len()
                && kafka
                    .iter()
                    .all(|(committed, end)| committed.unwrap_or(0) == *end)
            {
                break kafka;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the backlog was never read"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let partition = read.iter().position(|(_, end)| *end > 0).unwrap();
        let database = database_offsets(&pool, &group).await;

        // Back to the start of a partition the worker read: refused.
        let mut command = binary(&url);
        command.args([
            "offsets",
            "set",
            "--group",
            &group,
            "--topic",
            &topic,
            "--to-offset",
            "0",
        ]);
        command.args(["--partition", &partition.to_string()]);
        let (status, output) = run_to_end(command).await;
        assert!(!status.success(), "moved under a live member:\n{output}");
        assert!(
            output.contains(&format!("group {group} has 1 members now")),
            "{output}"
        );
        assert!(
            output.contains("stop every consumer of the group"),
            "{output}"
        );
        assert_eq!(
            kafka_offsets(&topic, &group).await,
            read,
            "Kafka's did not move"
        );
        assert_eq!(
            database_offsets(&pool, &group).await,
            database,
            "the database's did not move"
        );
        tokio::task::spawn_blocking(move || running.terminate(Duration::from_secs(30)))
            .await
            .unwrap();
    })
    .await
    .expect("timed out");
}
