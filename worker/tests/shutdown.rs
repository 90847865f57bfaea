//! One grace period for the whole worker: claim loops, the request consumer
//! and the API stop together, even when the consumer is stuck on an outage
//! and an API client never finishes its request.

use std::time::{Duration, Instant};

use flotilla_tests::{KAFKA_TEST_TIMEOUT, create_topic, unique};
use flotilla_worker::test_support::{TestApp, echo_targets};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::json;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::io::AsyncWriteExt as _;
use uuid::Uuid;

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;
const GRACE: Duration = Duration::from_secs(2);

#[sqlx::test(migrator = "MIGRATOR")]
async fn the_worker_stops_within_its_grace_with_a_stuck_api_client_and_a_paused_consumer(
    pool: PgPool,
) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("shutdown-requests");
        create_topic(&topic, 1).await.unwrap();
        // The worker reaches Postgres through a proxy the test can cut; a
        // connection it waits for would take a minute to give up.
        let options = PgPoolOptions::new().acquire_timeout(Duration::from_secs(60));
        let (proxy, proxied) = flotilla_tests::database::behind_proxy(&pool, options).await;
        let group = unique("shutdown-workers");
        let flags = [
            "--consume-requests",
            "true",
            "--request-topic",
            &topic,
            "--consumer-group",
            &group,
            "--worker-count",
            "0",
            "--sweep-interval",
            "1h",
            "--shutdown-grace",
            "2s",
        ];
        let app = TestApp::spawn_with(proxied, &flags, echo_targets()).await;
        app.engine
            .register_workflow(&json!({"name": "greet", "input_schema": {},
                "steps": [{"name": "hello", "target": "echo", "method": "hello"}]}))
            .await
            .unwrap();

        proxy.cut();
        let producer: FutureProducer = flotilla_tests::broker()
            .idempotent_producer()
            .create()
            .unwrap();
        let request =
            json!({"job_id": Uuid::new_v4(), "workflow_name": "greet", "input": {}}).to_string();
        producer
            .send(
                FutureRecord::<(), _>::to(&topic).payload(&request),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        // The consumer took the request and is trying the database: paused.
        let deadline = Instant::now() + Duration::from_secs(90);
        while proxy.refused_connections() == 0 {
            assert!(
                Instant::now() < deadline,
                "the consumer never tried to persist the request"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // An API client that never finishes its request, and one whose
        // handler waits on the database.
        let address = app.url.trim_start_matches("http://").to_owned();
        let mut stuck = tokio::net::TcpStream::connect(&address).await.unwrap();
        stuck
            .write_all(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
            .await
            .unwrap();
        let waiting = tokio::spawn(
            flotilla_runtime::tls::http_client()
                .build()
                .unwrap()
                .get(format!("{}/v1/jobs/{}", app.url, Uuid::new_v4()))
                .bearer_auth(flotilla_worker::test_support::TEST_TOKEN)
                .send(),
        );

        let stopping = Instant::now();
        app.stop().await;
        let took = stopping.elapsed();
        assert!(
            took < GRACE + Duration::from_secs(3),
            "the worker took {took:?} to stop with a grace period of {GRACE:?}"
        );
        drop((stuck, waiting));
    })
    .await
    .expect("the shutdown test timed out");
}
