//! The fleet behind a connection pooler in transaction mode: PgBouncer
//! (Debian's package, `flotilla_tests::pgbouncer`) between the worker and
//! relay binaries and Postgres, `FLOTILLA_DB_POOLER=transaction`, the
//! wake-ups' `LISTEN` straight to Postgres (`FLOTILLA_DB_LISTEN_URL`).
//!
//! The pooler resets every server connection after every transaction, so a
//! statement of the fleet's that runs outside a transaction of its own
//! (its prepare and its execution two round trips apart), a prepared
//! statement kept past its transaction, or a setting kept on a session
//! fails every time here, not only when another client happens to take
//! the server connection in between.

use std::process::Command;
use std::time::{Duration, Instant};

use flotilla_contracts::WorkflowRunRequest;
use flotilla_tests::pgbouncer::PgBouncer;
use flotilla_tests::process::Running;
use flotilla_tests::{KAFKA_TEST_TIMEOUT, bootstrap_servers, unique};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

/// Requests produced to the fleet.
const REQUESTS: usize = 40;

/// A target that answers every step at once.
async fn target() -> String {
    use axum::routing::post;
    let app = axum::Router::new().route(
        "/{step}",
        post(|| async { axum::Json(json!({"ok": true})) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

struct Fleet {
    dir: std::path::PathBuf,
    topic: String,
    events: String,
    /// Through the pooler, and straight to Postgres (for `LISTEN`).
    pooled: String,
    direct: String,
}

impl Fleet {
    fn pooled(&self, command: &mut Command) {
        command
            .env("DATABASE_URL", &self.pooled)
            .env("FLOTILLA_DB_POOLER", "transaction")
            .env("FLOTILLA_DB_LISTEN_URL", &self.direct)
            .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap_servers())
            .env_remove("SCHEMA_REGISTRY_URL")
            .env("NO_COLOR", "1");
    }

    fn worker(&self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla-worker"));
        self.pooled(&mut command);
        command
            .env("FLOTILLA_WORKER_ID", unique("pooled-worker"))
            .env("FLOTILLA_HTTP_ADDR", "127.0.0.1:0")
            .env("FLOTILLA_API_TOKENS", "pooled")
            .env("FLOTILLA_REQUEST_TOPIC", &self.topic)
            .env("FLOTILLA_CONSUMER_GROUP", unique("pooled-workers"))
            .env("FLOTILLA_TARGETS_FILE", self.dir.join("targets.yaml"))
            .env("FLOTILLA_WORKFLOWS_DIR", self.dir.join("workflows"))
            .env("FLOTILLA_SWEEP_INTERVAL", "1s");
        command
    }

    fn relay(&self) -> Command {
        let mut command = Command::new(flotilla_tests::process::workspace_binary("flotilla-relay"));
        self.pooled(&mut command);
        command
            .env("FLOTILLA_EVENT_TOPIC", &self.events)
            .env("FLOTILLA_RELAY_ID", unique("pooled-relay"))
            .env("FLOTILLA_RELAY_HTTP_ADDR", "127.0.0.1:0");
        command
    }
}

/// PgBouncer in front of `pool`'s server with `pool_size` server
/// connections, and the name of `pool`'s database.
async fn bouncer_for(pool: &PgPool, pool_size: u32) -> (PgBouncer, String) {
    let upstream = flotilla_tests::database::server_address(pool).await;
    let bouncer = tokio::task::spawn_blocking(move || PgBouncer::start(upstream, pool_size))
        .await
        .unwrap();
    (bouncer, flotilla_tests::database::name_of(pool).await)
}

/// Lines of `running`'s output that say a statement met a server
/// connection without what it left there.
fn lost_statements(running: &Running) -> Vec<&String> {
    running
        .output
        .iter()
        .filter(|line| line.contains("prepared statement") || line.contains("does not exist"))
        .collect()
}

#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn the_fleet_runs_end_to_end_through_a_transaction_mode_pooler(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let (bouncer, database) = bouncer_for(&pool, 8).await;

        let dir = std::env::temp_dir().join(format!("flotilla-pooler-{}", Uuid::new_v4()));
        std::fs::create_dir_all(dir.join("workflows")).unwrap();
        std::fs::write(
            dir.join("targets.yaml"),
            format!(
                "targets:\n  svc:\n    kind: http\n    base_url: {}\n",
                target().await
            ),
        )
        .unwrap();
        let workflow = json!({"name": "pooled", "input_schema": {}, "steps": [
            {"name": "one", "target": "svc", "method": "one"},
            {"name": "two", "target": "svc", "method": "two"},
            {"name": "approve", "target": "svc", "method": "approve", "completion": "external"}
        ]});
        std::fs::write(dir.join("workflows/pooled.json"), workflow.to_string()).unwrap();
        let fleet = Fleet {
            dir: dir.clone(),
            topic: unique("pooled-requests"),
            events: unique("pooled-events"),
            pooled: bouncer.url(&database),
            direct: flotilla_tests::database::url_of(&pool).await,
        };
        let mut worker = flotilla_tests::process::started(fleet.worker(), "worker ready").await;
        let mut relay = flotilla_tests::process::started(fleet.relay(), "relay ready").await;
        let api = format!(
            "http://{}",
            worker
                .logged("worker ready", "api")
                .expect("the API's address")
        );

        // Requests through Kafka: each runs two steps and parks on the third.
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap_servers())
            .create()
            .unwrap();
        let mut jobs = Vec::new();
        for _ in 0..REQUESTS {
            let job = Uuid::new_v4();
            let request = WorkflowRunRequest::new(job, "pooled", json!({})).unwrap();
            let payload = flotilla_contracts::json::encode(&request).unwrap();
            producer
                .send(
                    FutureRecord::to(&fleet.topic)
                        .key(&job.to_string())
                        .payload(&payload),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| e)
                .unwrap();
            jobs.push(job);
        }
        wait_for(&pool, &jobs, "WAITING").await;

        // The API's reads and an operator's answers, through the pooler.
        let http = flotilla_runtime::tls::http_client().build().unwrap();
        let get = |path: String| {
            http.get(format!("{api}{path}"))
                .bearer_auth("pooled")
                .send()
        };
        for path in [
            "/v1/jobs?status=WAITING".to_owned(),
            format!("/v1/jobs/{}", jobs[0]),
            format!("/v1/jobs/{}/events", jobs[0]),
            "/v1/fleet".to_owned(),
            "/v1/workflows".to_owned(),
        ] {
            let answer = get(path.clone()).await.unwrap();
            assert_eq!(
                answer.status(),
                200,
                "GET {path}: {}",
                answer.text().await.unwrap()
            );
        }
        for job in &jobs {
            let answer = http
                .post(format!("{api}/v1/jobs/{job}/steps/approve/complete"))
                .bearer_auth("pooled")
                .json(&json!({"response": {"approved": true}}))
                .send()
                .await
                .unwrap();
            assert!(
                answer.status().is_success(),
                "completing {job}: {}",
                answer.text().await.unwrap()
            );
        }
        wait_for(&pool, &jobs, "COMPLETED").await;
        // Every event published by the relay through the pooler.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let pending: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM workflow_run_outbox_state WHERE status <> 'PUBLISHED'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            if pending == 0 {
                break;
            }
            assert!(Instant::now() < deadline, "{pending} events unpublished");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // A cancel and a retry, an operator's writes.
        let answer = http
            .post(format!("{api}/v1/jobs/{}/retry", jobs[0]))
            .bearer_auth("pooled")
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 409, "a COMPLETED job is not retried");

        worker.terminate(Duration::from_secs(30));
        relay.terminate(Duration::from_secs(30));
        for running in [&worker, &relay] {
            let lost = lost_statements(running);
            assert!(
                lost.is_empty(),
                "statements lost behind the pooler: {lost:#?}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
        drop(bouncer);
    })
    .await
    .expect("the pooled fleet timed out");
}

/// Polls until every job of `jobs` is `status`.
async fn wait_for(pool: &PgPool, jobs: &[Uuid], status: &str) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let reached: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM workflow_run WHERE job_id = ANY($1) AND status = $2",
        )
        .bind(jobs)
        .bind(status)
        .fetch_one(pool)
        .await
        .unwrap();
        if reached == i64::try_from(jobs.len()).unwrap() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{reached} of {} jobs {status} within 90 s",
            jobs.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The pooler of these tests is strict enough to catch the mistake the
/// pooler setting exists for: one statement's prepare and execution in two
/// transactions fail there every time; inside one transaction they work.
#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn the_test_pooler_refuses_a_statement_split_across_transactions(pool: PgPool) {
    let (bouncer, database) = bouncer_for(&pool, 2).await;
    let options: sqlx::postgres::PgConnectOptions = bouncer.url(&database).parse().unwrap();
    let pooled = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options.statement_cache_capacity(0).extra_float_digits(None))
        .await
        .unwrap();
    let alone = sqlx::query_scalar::<_, i32>("SELECT $1::int")
        .bind(7)
        .persistent(false)
        .fetch_one(&pooled)
        .await;
    let refused = alone.expect_err("a prepare and an execution in two transactions");
    assert!(refused.to_string().contains("does not exist"), "{refused}");
    let mut tx = pooled.begin().await.unwrap();
    let inside: i32 = sqlx::query_scalar("SELECT $1::int")
        .bind(7)
        .persistent(false)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(inside, 7);
    pooled.close().await;
    drop(bouncer);
}
