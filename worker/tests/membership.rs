//! Static group membership: a worker killed with SIGKILL and restarted with
//! the same id gets its partitions back at once. (On the test broker a new
//! dynamic member is never given a killed member's partitions, so without
//! static membership this test would stall for good.)

use std::process::Command;
use std::time::Duration;

use flotilla_tests::process::Running;
use flotilla_tests::{KAFKA_TEST_TIMEOUT, unique};
use sqlx::PgPool;
use uuid::Uuid;

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// A worker that only ingests: no claim loops, so rows stay QUEUED.
fn ingesting_worker(
    database_url: &str,
    topic: &str,
    group: &str,
    dir: &std::path::Path,
) -> Command {
    ingesting_worker_on(
        &flotilla_tests::bootstrap_servers(),
        database_url,
        topic,
        group,
        dir,
    )
}

/// As [`ingesting_worker`], on the broker at `bootstrap`.
fn ingesting_worker_on(
    bootstrap: &str,
    database_url: &str,
    topic: &str,
    group: &str,
    dir: &std::path::Path,
) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla-worker"));
    command
        .env("DATABASE_URL", database_url)
        .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap)
        .env("FLOTILLA_WORKER_ID", "static-member")
        .env("FLOTILLA_HTTP_ADDR", "127.0.0.1:0")
        .env("FLOTILLA_API_TOKENS", "t")
        .env("FLOTILLA_REQUEST_TOPIC", topic)
        .env("FLOTILLA_CONSUMER_GROUP", group)
        .env("FLOTILLA_WORKER_COUNT", "0")
        .env("FLOTILLA_WORKFLOWS_DIR", dir)
        .env("FLOTILLA_TARGETS_FILE", dir.with_extension("targets.yaml"))
        .env("NO_COLOR", "1");
    command
}

async fn produce(topic: &str, count: usize) {
    produce_on(&flotilla_tests::bootstrap_servers(), topic, count).await;
}

async fn produce_on(bootstrap: &str, topic: &str, count: usize) {
    let producer: rdkafka::producer::FutureProducer =
        flotilla_runtime::BrokerConfig::new(bootstrap)
            .idempotent_producer()
            .create()
            .unwrap();
    for _ in 0..count {
        let request = flotilla_contracts::WorkflowRunRequest::new(
            Uuid::new_v4(),
            "noop",
            serde_json::json!({}),
        )
        .unwrap();
        let payload = flotilla_contracts::json::encode(&request).unwrap();
        let key = request.job_id().to_string();
        producer
            .send(
                rdkafka::producer::FutureRecord::to(topic)
                    .key(&key)
                    .payload(&payload),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
}

async fn wait_rows(pool: &PgPool, expected: i64, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM workflow_run")
            .fetch_one(pool)
            .await
            .unwrap();
        if rows >= expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{rows} rows of {expected}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn start(command: Command) -> Running {
    flotilla_tests::process::started(command, "worker ready").await
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_worker_killed_and_restarted_with_its_id_gets_its_partitions_back(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let dir = std::env::temp_dir().join(format!("flotilla-membership-{}", Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let noop = serde_json::json!({"name": "noop", "input_schema": {},
            "steps": [{"name": "never", "target": "svc", "method": "m"}]});
        std::fs::write(dir.join("noop.json"), noop.to_string()).unwrap();
        let targets = dir.with_extension("targets.yaml");
        std::fs::write(
            &targets,
            "targets:\n  svc:\n    kind: http\n    base_url: http://127.0.0.1:1\n",
        )
        .unwrap();
        let (topic, group) = (unique("membership-requests"), unique("membership-workers"));
        flotilla_tests::create_topic(&topic, 3).await.unwrap();
        let url = flotilla_tests::database::url_of(&pool).await;

        let mut first = start(ingesting_worker(&url, &topic, &group, &dir)).await;
        produce(&topic, 6).await;
        wait_rows(&pool, 6, Duration::from_secs(60)).await;
        first.kill();

        produce(&topic, 6).await;
        let mut second = start(ingesting_worker(&url, &topic, &group, &dir)).await;
        // Well inside the 45 s session timeout: no rebalance was waited for.
        wait_rows(&pool, 12, Duration::from_secs(40)).await;
        let status = tokio::task::spawn_blocking(move || second.terminate(Duration::from_secs(30)))
            .await
            .unwrap();
        assert!(status.success());
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_file(dir.with_extension("targets.yaml")).unwrap();
    })
    .await
    .expect("the membership test timed out");
}

/// Dynamic membership, the chart's default (Deployment pod names never come
/// back): a worker stopped gracefully (a rollout, a scale-in) leaves the
/// group, and its partitions are read by the survivor within seconds, not
/// after a session timeout. Prints how long the partitions went unread.
///
/// On a test broker of its own: the shared one, after a suite's worth of
/// groups (and right after the test above left a static member in its
/// session), sometimes never told the survivor to rejoin (two CI runs
/// waited 40 s for the handover; alone on the same broker it took 2 s).
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_worker_scaled_in_with_dynamic_membership_hands_its_partitions_over_at_once(
    pool: PgPool,
) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let dir = std::env::temp_dir().join(format!("flotilla-scale-in-{}", Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let noop = serde_json::json!({"name": "noop", "input_schema": {},
            "steps": [{"name": "never", "target": "svc", "method": "m"}]});
        std::fs::write(dir.join("noop.json"), noop.to_string()).unwrap();
        std::fs::write(
            dir.with_extension("targets.yaml"),
            "targets:\n  svc:\n    kind: http\n    base_url: http://127.0.0.1:1\n",
        )
        .unwrap();
        let bin = flotilla_tests::tansu::binary()
            .expect("FLOTILLA_TANSU_BIN is unset: run the tests through scripts/test");
        let broker = {
            let dir = dir.clone();
            tokio::task::spawn_blocking(move || {
                flotilla_tests::tansu::OwnBroker::start(&bin, &dir, None, &[])
            })
            .await
            .unwrap()
        };
        let bootstrap = broker.address.clone();
        let (topic, group) = (unique("scale-in-requests"), unique("scale-in-workers"));
        flotilla_tests::create_topic_on(&bootstrap, &topic, 4)
            .await
            .unwrap();
        let url = flotilla_tests::database::url_of(&pool).await;
        let member = |id: &str| {
            let mut command = ingesting_worker_on(&bootstrap, &url, &topic, &group, &dir);
            command
                .env("FLOTILLA_WORKER_ID", id)
                .env("FLOTILLA_STATIC_MEMBERSHIP", "false");
            command
        };
        let mut leaving = start(member("leaving")).await;
        let mut staying = start(member("staying")).await;
        // Both members hold partitions once every partition is read.
        produce_on(&bootstrap, &topic, 40).await;
        wait_rows(&pool, 40, Duration::from_secs(60)).await;
        let status =
            tokio::task::spawn_blocking(move || leaving.terminate(Duration::from_secs(30)))
                .await
                .unwrap();
        assert!(status.success());
        let stopped = std::time::Instant::now();
        produce_on(&bootstrap, &topic, 40).await;
        let handed_over = tokio::time::timeout(
            Duration::from_secs(40),
            wait_rows(&pool, 80, Duration::from_secs(60)),
        )
        .await;
        if handed_over.is_err() {
            panic!(
                "the survivor did not read the leaver's partitions within 40 s; its log:\n{}",
                staying.output_so_far().join("\n")
            );
        }
        let unread = stopped.elapsed();
        println!("partitions unread after a graceful scale-in (dynamic membership): {unread:?}");
        assert!(
            unread < Duration::from_secs(30),
            "{unread:?}: a session timeout was waited for"
        );
        let status =
            tokio::task::spawn_blocking(move || staying.terminate(Duration::from_secs(30)))
                .await
                .unwrap();
        assert!(status.success());
        drop(broker);
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_file(dir.with_extension("targets.yaml")).unwrap();
    })
    .await
    .expect("the scale-in test timed out");
}
