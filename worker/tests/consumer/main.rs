//! The request consumer against the real broker, registry and Postgres
//! (DESIGN.md guarantee 9). Every test has its own topics, group, database
//! and deadline.

mod support;

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use flotilla_contracts::framing;
use flotilla_tests::KAFKA_TEST_TIMEOUT;
use flotilla_worker::consumer::BatchReport;
use flotilla_worker::consumer::dead_letter::{
    CODE, REASON, SOURCE_OFFSET, SOURCE_PARTITION, SOURCE_TOPIC,
};
use serde_json::json;
use sqlx::PgPool;
use support::{count, produce_raw, produce_request, producer, topics};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

async fn within_deadline(test: impl Future<Output = ()>) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, test)
        .await
        .expect("the consumer test timed out");
}

/// Runs the consumer in the background; returns its stop switch and handle.
fn spawn(
    consumer: flotilla_worker::consumer::RequestConsumer,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let handle = tokio::spawn(consumer.run(stop.clone()));
    (stop, handle)
}

async fn wait_rows(pool: &PgPool, expected: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while count(pool, "SELECT count(*) FROM workflow_run").await < expected {
        assert!(
            tokio::time::Instant::now() < deadline,
            "rows never reached {expected}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_thousand_mixed_avro_and_json_requests_become_a_thousand_completed_jobs(pool: PgPool) {
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let producer = producer();
        let mut ids = Vec::new();
        for n in 0..1000 {
            let job_id = Uuid::new_v4();
            produce_request(
                &producer,
                &topics.requests,
                job_id,
                json!({"name": format!("n{n}")}),
                n % 2 == 0,
            )
            .await;
            ids.push(job_id);
        }
        let (stop, handle) = spawn(support::consumer(&engine, &topics));
        wait_rows(&pool, 1000).await;
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        stop.cancel();
        handle.await.unwrap();
        assert_eq!(
            count(
                &pool,
                "SELECT count(*) FROM workflow_run WHERE status = 'QUEUED'"
            )
            .await,
            1000
        );
        let stored: HashSet<Uuid> = sqlx::query_scalar("SELECT job_id FROM workflow_run")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(stored, ids.iter().copied().collect());

        let run = CancellationToken::new();
        let runner = tokio::spawn({
            let (engine, run) = (engine.clone(), run.clone());
            async move { engine.run(run, Duration::from_secs(10)).await }
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while count(
            &pool,
            "SELECT count(*) FROM workflow_run WHERE status = 'COMPLETED'",
        )
        .await
            < 1000
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "jobs did not complete"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        run.cancel();
        runner.await.unwrap();
    })
    .await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_consumer_killed_between_row_commit_and_offset_commit_loses_and_duplicates_nothing(
    pool: PgPool,
) {
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let producer = producer();
        for n in 0..30 {
            produce_request(
                &producer,
                &topics.requests,
                Uuid::new_v4(),
                json!({"name": format!("n{n}")}),
                n % 3 == 0,
            )
            .await;
        }
        // First life: rows committed, then the process dies before the offset commit.
        let doomed = support::consumer(&engine, &topics);
        let never = CancellationToken::new();
        let mut seen = 0;
        while seen < 30 {
            let batch = doomed.next_batch(&never).await.unwrap();
            seen += batch.len();
            doomed.persist(&batch).await.unwrap();
        }
        doomed.close();
        assert_eq!(count(&pool, "SELECT count(*) FROM workflow_run").await, 30);

        // Second life: everything is redelivered and recognised.
        let reborn = support::consumer(&engine, &topics);
        let mut total = BatchReport::default();
        let mut redelivered = 0;
        while redelivered < 30 {
            let batch = reborn.next_batch(&never).await.unwrap();
            redelivered += batch.len();
            let report = reborn.persist(&batch).await.unwrap();
            total.existing += report.existing;
            total.created += report.created;
            reborn.commit(&batch);
        }
        assert_eq!(
            total,
            BatchReport {
                existing: 30,
                ..BatchReport::default()
            }
        );
        assert_eq!(count(&pool, "SELECT count(*) FROM workflow_run").await, 30);
        assert_eq!(
            count(
                &pool,
                "SELECT count(*) FROM workflow_run_outbox WHERE event_type = 'ACCEPTED'"
            )
            .await,
            30
        );
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        reborn.close();
    })
    .await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn poison_messages_are_dead_lettered_with_reasons_and_the_partitions_move_on(pool: PgPool) {
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let producer = producer();
        let good = |n: usize| json!({"name": format!("good{n}")});
        let request_avro = support::codec()
            .encode(&topics.requests, &flotilla_contracts::WorkflowRunRequest::new(Uuid::new_v4(), "greet", good(99)).unwrap())
            .await
            .unwrap();
        let poison: Vec<(&str, Vec<u8>)> = vec![
            ("unknown_magic_byte", b"\x07 garbage bytes".to_vec()),
            ("avro_mismatch", request_avro[..request_avro.len() - 3].to_vec()),
            ("unknown_schema_id", framing::frame(999_999_999, b"\x02")),
            ("json_mismatch", br#"{"job_id":"not-a-uuid","workflow_name":"greet","input":{}}"#.to_vec()),
            ("json_mismatch", br#"{"workflow_name":"greet","input":{}}"#.to_vec()),
            ("oversize", {
                let mut big = br#"{"job_id":"6f1c1c9e-0d7a-4d53-9a55-1f8f6b1c2d3e","workflow_name":"greet","input":{"name":""#.to_vec();
                big.extend(std::iter::repeat_n(b'x', support::MAX_REQUEST_BYTES + 10));
                big.extend_from_slice(br#""}}"#);
                big
            }),
            ("empty", Vec::new()),
        ];
        let mut good_ids = Vec::new();
        for (n, (_, bytes)) in poison.iter().enumerate() {
            let job_id = Uuid::new_v4();
            produce_request(&producer, &topics.requests, job_id, good(n), n % 2 == 0).await;
            good_ids.push(job_id);
            let headers = support::traceparent_header("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
            produce_raw(&producer, &topics.requests, &format!("poison-{n}"), bytes, Some(headers)).await;
        }
        let (stop, handle) = spawn(support::consumer(&engine, &topics));
        let letters = support::dead_letters(&topics.dead_letters, poison.len()).await;
        wait_rows(&pool, good_ids.len() as i64).await;
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        stop.cancel();
        handle.await.unwrap();

        assert_eq!(count(&pool, "SELECT count(*) FROM workflow_run WHERE status = 'QUEUED'").await, good_ids.len() as i64);
        let mut by_key: Vec<(String, String)> = letters
            .iter()
            .map(|l| (String::from_utf8(l.key.clone().unwrap()).unwrap(), l.headers[CODE].clone()))
            .collect();
        by_key.sort();
        let expected: Vec<(String, String)> = poison.iter().enumerate().map(|(n, (code, _))| (format!("poison-{n}"), (*code).to_owned())).collect();
        assert_eq!(by_key, expected);
        for letter in &letters {
            let n: usize = String::from_utf8(letter.key.clone().unwrap()).unwrap()["poison-".len()..].parse().unwrap();
            assert_eq!(letter.payload, poison[n].1, "the original value is kept");
            assert_eq!(letter.headers[SOURCE_TOPIC], topics.requests);
            assert!(letter.headers[SOURCE_PARTITION].parse::<i32>().is_ok());
            assert!(letter.headers[SOURCE_OFFSET].parse::<i64>().is_ok());
            assert!(!letter.headers[REASON].is_empty());
            assert!(letter.headers.contains_key("traceparent"), "original headers are kept");
        }
        let reason_of = |code: &str| letters.iter().find(|l| l.headers[CODE] == code).unwrap().headers[REASON].clone();
        assert!(reason_of("unknown_schema_id").contains("999999999"));
        assert!(reason_of("oversize").contains(&format!("over the limit of {} bytes", support::MAX_REQUEST_BYTES)));
    })
    .await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn unknown_workflows_and_bad_inputs_become_failed_rows_with_events(pool: PgPool) {
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let producer = producer();
        let (unknown, bad_input, conflicting) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let ghost =
            flotilla_contracts::WorkflowRunRequest::new(unknown, "ghost", json!({})).unwrap();
        produce_raw(
            &producer,
            &topics.requests,
            "a",
            &flotilla_contracts::json::encode(&ghost).unwrap(),
            None,
        )
        .await;
        produce_request(
            &producer,
            &topics.requests,
            bad_input,
            json!({"name": 42}),
            true,
        )
        .await;
        produce_request(
            &producer,
            &topics.requests,
            conflicting,
            json!({"name": "first"}),
            false,
        )
        .await;
        produce_request(
            &producer,
            &topics.requests,
            conflicting,
            json!({"name": "second"}),
            false,
        )
        .await;

        let (stop, handle) = spawn(support::consumer(&engine, &topics));
        let letters = support::dead_letters(&topics.dead_letters, 1).await;
        wait_rows(&pool, 3).await;
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        stop.cancel();
        handle.await.unwrap();

        for (job_id, needle) in [
            (unknown, "unknown workflow \"ghost\""),
            (bad_input, "/name: 42 is not of type \"string\""),
        ] {
            let (status, error): (String, String) =
                sqlx::query_as("SELECT status, error FROM workflow_run WHERE job_id = $1")
                    .bind(job_id)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            assert_eq!(status, "FAILED");
            assert!(error.contains(needle), "{error}");
            let events: Vec<String> =
                sqlx::query_scalar("SELECT event_type FROM workflow_run_outbox WHERE job_id = $1")
                    .bind(job_id)
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            assert_eq!(events, ["FAILED"]);
        }
        let input: serde_json::Value =
            sqlx::query_scalar("SELECT input FROM workflow_run WHERE job_id = $1")
                .bind(conflicting)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(input, json!({"name": "first"}), "the original stays");
        assert_eq!(letters[0].headers[CODE], "conflict");
        assert!(letters[0].headers[REASON].contains(&conflicting.to_string()));
    })
    .await;
}

/// Drives a consumer by hand until `stop`: returns the partitions it persisted from.
async fn drive(
    consumer: flotilla_worker::consumer::RequestConsumer,
    stop: CancellationToken,
) -> HashSet<i32> {
    use rdkafka::Message as _;
    let mut partitions = HashSet::new();
    while let Some(batch) = consumer.next_batch(&stop).await {
        consumer.persist(&batch).await.unwrap();
        consumer.commit(&batch);
        partitions.extend(batch.iter().map(|m| m.partition()));
    }
    consumer.close();
    partitions
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn consumers_in_one_group_split_partitions_and_a_joining_one_rebalances_without_loss(
    pool: PgPool,
) {
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let producer = producer();
        let stop = CancellationToken::new();
        let first = tokio::spawn(drive(support::consumer(&engine, &topics), stop.clone()));
        let second = tokio::spawn(drive(support::consumer(&engine, &topics), stop.clone()));
        for n in 0..300 {
            produce_request(
                &producer,
                &topics.requests,
                Uuid::new_v4(),
                json!({"name": format!("a{n}")}),
                n % 2 == 0,
            )
            .await;
        }
        wait_rows(&pool, 300).await;
        let third = tokio::spawn(drive(support::consumer(&engine, &topics), stop.clone()));
        for n in 0..300 {
            produce_request(
                &producer,
                &topics.requests,
                Uuid::new_v4(),
                json!({"name": format!("b{n}")}),
                n % 2 == 1,
            )
            .await;
        }
        wait_rows(&pool, 600).await;
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        stop.cancel();
        let first = first.await.unwrap();
        let second = second.await.unwrap();
        let third = third.await.unwrap();

        assert!(
            !first.is_empty() && !second.is_empty(),
            "both first members got partitions: {first:?} {second:?}"
        );
        let all: HashSet<i32> = first.iter().chain(&second).chain(&third).copied().collect();
        assert_eq!(
            all.len(),
            support::PARTITIONS as usize,
            "every partition was consumed"
        );
        assert_eq!(count(&pool, "SELECT count(*) FROM workflow_run").await, 600);
        assert_eq!(
            count(
                &pool,
                "SELECT count(*) FROM workflow_run_outbox WHERE event_type = 'ACCEPTED'"
            )
            .await,
            600,
            "one ACCEPTED event per job: no duplicate submissions"
        );
    })
    .await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_database_outage_pauses_ingestion_commits_nothing_undurable_and_loses_nothing(
    pool: PgPool,
) {
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    within_deadline(async {
        let topics = topics().await;
        support::register_greet(&support::engine(&pool)).await;
        let options: PgConnectOptions = pool.connect_options().as_ref().clone();
        let upstream = format!("{}:{}", options.get_host(), options.get_port());
        let upstream = tokio::net::lookup_host(upstream)
            .await
            .unwrap()
            .next()
            .unwrap();
        let proxy = flotilla_tests::proxy::Proxy::start(upstream).await;
        let proxied = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(1))
            .connect_with(options.host("127.0.0.1").port(proxy.address().port()))
            .await
            .unwrap();
        let engine = support::engine(&proxied);
        let producer = producer();
        let (stop, handle) = spawn(support::consumer(&engine, &topics));
        for n in 0..50 {
            produce_request(
                &producer,
                &topics.requests,
                Uuid::new_v4(),
                json!({"name": format!("before{n}")}),
                n % 2 == 0,
            )
            .await;
        }
        wait_rows(&pool, 50).await;
        support::wait_committed_to_end(&topics.requests, &topics.group).await;

        proxy.cut();
        for n in 0..50 {
            produce_request(
                &producer,
                &topics.requests,
                Uuid::new_v4(),
                json!({"name": format!("during{n}")}),
                n % 2 == 1,
            )
            .await;
        }
        // While the database is unreachable, offsets never pass what is durable.
        let outage_end = tokio::time::Instant::now() + Duration::from_secs(3);
        while tokio::time::Instant::now() < outage_end {
            let (t, g) = (topics.requests.clone(), topics.group.clone());
            let committed: i64 =
                tokio::task::spawn_blocking(move || support::committed_and_end(&t, &g))
                    .await
                    .unwrap()
                    .iter()
                    .map(|(committed, _)| committed)
                    .sum();
            assert_eq!(
                committed, 50,
                "an offset was committed for a row that is not durable"
            );
            assert_eq!(count(&pool, "SELECT count(*) FROM workflow_run").await, 50);
            tokio::time::sleep(Duration::from_millis(250)).await;
        }

        proxy.restore();
        wait_rows(&pool, 100).await;
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        stop.cancel();
        handle.await.unwrap();
        assert_eq!(
            count(
                &pool,
                "SELECT count(*) FROM workflow_run_outbox WHERE event_type = 'ACCEPTED'"
            )
            .await,
            100
        );
    })
    .await;
}
