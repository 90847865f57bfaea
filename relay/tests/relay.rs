//! The relay against real Postgres and the real broker (the librdkafka mock
//! cluster where the broker must fail): DESIGN.md guarantee 8.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use flotilla_contracts::WorkflowRunEvent;
use flotilla_relay::publisher::EVENT_TYPE_HEADER;
use flotilla_relay::{Relay, RelaySettings};
use flotilla_store::outbox::{self, EventKind, EventStamp};
use flotilla_store::{ManualClock, SystemClock};
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
    let mut conn = pool.acquire().await.unwrap();
    for sequence in 1..=count {
        for job_id in jobs {
            let stamp = EventStamp {
                job_id: *job_id,
                event_sequence: sequence,
                workflow_name: "relayed".into(),
                attempt: 1,
                traceparent: Some(format!("00-{}-00f067aa0ba902b7-01", job_id.simple())),
            };
            let kind = match sequence {
                1 => EventKind::Accepted,
                n if n == count => EventKind::Completed {
                    verdict: "done".into(),
                    result: result.clone(),
                },
                n => EventKind::StepCheckpoint {
                    step: format!("step{n}"),
                },
            };
            outbox::insert(&mut conn, &stamp, kind, Utc::now())
                .await
                .unwrap();
        }
    }
}

fn settings(bootstrap: &str, topic: &str, relay_id: &str) -> RelaySettings {
    let mut settings = RelaySettings::new(
        flotilla_runtime::BrokerConfig::new(bootstrap),
        topic,
        relay_id,
    );
    settings.idle_poll_max = Duration::from_millis(20);
    settings.backoff_base = Duration::from_millis(100);
    settings
}

async fn count(pool: &PgPool, status: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM workflow_run_outbox WHERE status = $1")
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

#[sqlx::test(migrator = "MIGRATOR")]
async fn events_of_one_job_arrive_in_sequence_with_three_relays(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("events");
        create_topic(&topic, 3).await.unwrap();
        let jobs: Vec<Uuid> = (0..200).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &jobs, 5, json!({"ok": true})).await;

        let stop = CancellationToken::new();
        let relays: Vec<_> = (0..3)
            .map(|n| {
                let relay = Relay::new(
                    pool.clone(),
                    Arc::new(SystemClock),
                    settings(&bootstrap_servers(), &topic, &format!("relay-{n}")),
                )
                .unwrap();
                let stop = stop.clone();
                tokio::spawn(async move { relay.run(stop, Duration::from_secs(10)).await })
            })
            .collect();
        let mut owners_seen = 0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while count(&pool, "PUBLISHED").await < 1000 {
            let owners: i64 = sqlx::query_scalar(
                "SELECT count(DISTINCT owner) FROM relay_bucket WHERE owner IS NOT NULL",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            owners_seen = owners_seen.max(owners);
            assert!(
                tokio::time::Instant::now() < deadline,
                "not everything was published"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.cancel();
        for relay in relays {
            relay.await.unwrap();
        }
        assert!(
            owners_seen >= 2,
            "the relays shared the buckets (saw {owners_seen} owners)"
        );
        let released: i64 =
            sqlx::query_scalar("SELECT count(*) FROM relay_bucket WHERE owner IS NOT NULL")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(released, 0, "buckets are released on shutdown");

        let events = read_events(&bootstrap_servers(), &topic, 1000).await;
        for (job, sequences) in sequences_by_job(&events) {
            assert_eq!(sequences, [1, 2, 3, 4, 5], "job {job}");
        }
        let (_, _, _, headers) = &events[0];
        assert!(
            headers["traceparent"].starts_with("00-"),
            "the stored trace context travels"
        );
        assert!(
            ["ACCEPTED", "STEP_CHECKPOINT", "COMPLETED"]
                .contains(&headers[EVENT_TYPE_HEADER].as_str())
        );
        assert_eq!(headers["content-type"], "application/json");
    })
    .await
    .expect("timed out");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_relay_killed_before_marking_is_repeated_with_the_same_event_ids(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("events");
        create_topic(&topic, 3).await.unwrap();
        let jobs: Vec<Uuid> = (0..5).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &jobs, 3, json!({})).await;
        // Rows are due from the database's now(); the manual clock starts after it.
        let clock = Arc::new(ManualClock::new(Utc::now() + chrono::TimeDelta::seconds(1)));

        let doomed = Relay::new(
            pool.clone(),
            clock.clone(),
            settings(&bootstrap_servers(), &topic, "doomed"),
        )
        .unwrap();
        let batch = doomed.publish_once().await.unwrap();
        assert_eq!(batch.acked(), 15, "the broker has them all");
        drop(batch); // killed before marking
        drop(doomed);
        assert_eq!(count(&pool, "PENDING").await, 15);

        let heir = Relay::new(
            pool.clone(),
            clock.clone(),
            settings(&bootstrap_servers(), &topic, "heir"),
        )
        .unwrap();
        assert_eq!(
            heir.drain_once().await.unwrap().published,
            0,
            "the dead relay's buckets are still leased"
        );
        clock.advance(Duration::from_secs(11));
        assert_eq!(heir.drain_once().await.unwrap().published, 15);
        assert_eq!(count(&pool, "PUBLISHED").await, 15);

        let events = read_events(&bootstrap_servers(), &topic, 30).await;
        let mut copies: HashMap<Uuid, usize> = HashMap::new();
        for (_, _, event, _) in &events {
            *copies.entry(event.event_id()).or_default() += 1;
        }
        assert_eq!(copies.len(), 15);
        assert!(
            copies.values().all(|&n| n == 2),
            "each event twice, with one event id: consumers dedupe"
        );
        for (_, sequences) in sequences_by_job(&events) {
            assert_eq!(sequences, [1, 2, 3, 1, 2, 3]);
        }
    })
    .await
    .expect("timed out");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn rows_stay_pending_while_the_broker_is_down_then_publish_in_order(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
        let topic = unique("events");
        cluster.create_topic(&topic, 3, 1).unwrap();
        let bootstrap = cluster.bootstrap_servers();
        let jobs: Vec<Uuid> = (0..10).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &jobs, 4, json!({})).await;
        let clock = Arc::new(ManualClock::new(Utc::now() + chrono::TimeDelta::seconds(1)));
        let mut relay_settings = settings(&bootstrap, &topic, "lonely");
        relay_settings.delivery_timeout = Duration::from_secs(2);
        let relay = Relay::new(pool.clone(), clock.clone(), relay_settings).unwrap();

        cluster.broker_down(1).unwrap();
        let report = relay.drain_once().await.unwrap();
        assert_eq!(report.published, 0);
        assert!(report.failed > 0);
        assert_eq!(
            count(&pool, "PENDING").await,
            40,
            "nothing marked while the broker is down"
        );
        let attempts: i32 = sqlx::query_scalar("SELECT max(attempts) FROM workflow_run_outbox")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(attempts, 1);

        cluster.broker_up(1).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while count(&pool, "PUBLISHED").await < 40 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "rows did not publish after the broker returned"
            );
            clock.advance(Duration::from_secs(1));
            relay.drain_once().await.unwrap();
        }
        let events = read_events(&bootstrap, &topic, 40).await;
        for (job, sequences) in sequences_by_job(&events) {
            let mut deduped = sequences.clone();
            deduped.dedup();
            assert_eq!(deduped, [1, 2, 3, 4], "job {job} in order: {sequences:?}");
        }
        drop(relay);
        drop(cluster); // nextest's per-test deadline guards against a hang here
    })
    .await
    .expect("timed out");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_row_the_broker_always_refuses_lands_failed_after_ten_attempts_without_blocking_others(
    pool: PgPool,
) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("events");
        create_topic(&topic, 3).await.unwrap();

        // Job `big`: its COMPLETED (sequence 2) is too large; a later event must wait for it.
        let big = Uuid::new_v4();
        insert_events(&pool, &[big], 2, json!({"blob": "x".repeat(5_000)})).await;
        let mut conn = pool.acquire().await.unwrap();
        let stamp = EventStamp { job_id: big, event_sequence: 3, workflow_name: "relayed".into(), attempt: 2, traceparent: None };
        outbox::insert(&mut conn, &stamp, EventKind::Failed { error: "later".into(), verdict: None }, Utc::now()).await.unwrap();
        let others: Vec<Uuid> = (0..5).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &others, 2, json!({})).await;
        let clock = Arc::new(ManualClock::new(Utc::now() + chrono::TimeDelta::seconds(1)));
        let mut relay_settings = settings(&bootstrap_servers(), &topic, "strict");
        relay_settings.max_message_bytes = 2_000;
        let relay = Relay::new(pool.clone(), clock.clone(), relay_settings).unwrap();

        for attempt in 1..=10 {
            relay.drain_once().await.unwrap();
            let (status, attempts): (String, i32) =
                sqlx::query_as("SELECT status, attempts FROM workflow_run_outbox WHERE job_id = $1 AND sequence = 2")
                    .bind(big)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            assert_eq!(attempts, attempt);
            assert_eq!(status, if attempt < 10 { "PENDING" } else { "FAILED" });
            let later: String = sqlx::query_scalar("SELECT status FROM workflow_run_outbox WHERE job_id = $1 AND sequence = 3")
                .bind(big)
                .fetch_one(&pool)
                .await
                .unwrap();
            if attempt < 10 {
                assert_eq!(later, "PENDING", "a later event never overtakes one being retried");
            }
            clock.advance(Duration::from_secs(3600));
        }
        assert_eq!(count(&pool, "FAILED").await, 1);
        let error: String = sqlx::query_scalar("SELECT last_error FROM workflow_run_outbox WHERE status = 'FAILED'").fetch_one(&pool).await.unwrap();
        assert!(error.contains("too large"), "{error}");
        // Other jobs were never held up, and once the big one is dead-lettered its later event goes.
        relay.drain_once().await.unwrap();
        assert_eq!(count(&pool, "PUBLISHED").await, 12);
        let events = read_events(&bootstrap_servers(), &topic, 12).await;
        assert_eq!(sequences_by_job(&events)[&big], [1, 3], "the gap at 2 is visible through sequence");

        let mut conn = pool.acquire().await.unwrap();
        assert_eq!(outbox::relay::replay_failed(&mut conn, Some(big), Utc::now()).await.unwrap(), 1);
        assert_eq!(count(&pool, "PENDING").await, 1, "an operator puts it back");
    })
    .await
    .expect("timed out");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn retention_deletes_only_old_published_rows(pool: PgPool) {
    let jobs: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
    insert_events(&pool, &jobs, 1, json!({})).await;
    let now = Utc::now();
    let old = now - chrono::TimeDelta::days(8);
    let set = |job: Uuid, status: &'static str, published_at: Option<chrono::DateTime<Utc>>| {
        sqlx::query(
            "UPDATE workflow_run_outbox SET status = $2, published_at = $3 WHERE job_id = $1",
        )
        .bind(job)
        .bind(status)
        .bind(published_at)
        .execute(&pool)
    };
    set(jobs[0], "PUBLISHED", Some(old)).await.unwrap();
    set(jobs[1], "PUBLISHED", Some(now - chrono::TimeDelta::days(6)))
        .await
        .unwrap();
    set(jobs[2], "FAILED", Some(old)).await.unwrap();
    // jobs[3] stays PENDING.
    let mut relay_settings = settings("127.0.0.1:1", "unused", "janitor");
    relay_settings.retention_batch = 1;
    let relay = Relay::new(
        pool.clone(),
        Arc::new(ManualClock::new(now)),
        relay_settings,
    )
    .unwrap();
    assert_eq!(relay.apply_retention().await.unwrap(), 1);
    let left: Vec<Uuid> = sqlx::query_scalar("SELECT job_id FROM workflow_run_outbox ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, &jobs[1..]);
}
