//! Every compression codec Kafka producers use is read: batches compressed
//! with gzip, lz4, zstd (on the test broker) and snappy (on librdkafka's
//! mock cluster: the test broker cannot serve snappy) all become rows.

use super::*;

/// A producer compressing its batches with `codec`, the way a Java or Go
/// client configured with `compression.type` sends them.
fn compressing_producer(bootstrap: &str, codec: &str) -> rdkafka::producer::FutureProducer {
    flotilla_runtime::BrokerConfig::new(bootstrap)
        .idempotent_producer()
        .set("compression.type", codec)
        .set("linger.ms", "20")
        .create()
        .unwrap()
}

async fn produce_compressed(bootstrap: &str, topic: &str, codec: &str, count: usize) {
    let producer = compressing_producer(bootstrap, codec);
    let sends: Vec<_> = (0..count)
        .map(|n| {
            let request = flotilla_contracts::WorkflowRunRequest::new(
                Uuid::new_v4(),
                "greet",
                json!({"name": format!("{codec}-{n}")}),
            )
            .unwrap();
            let bytes = flotilla_contracts::json::encode(&request).unwrap();
            let key = request.job_id().to_string();
            let producer = producer.clone();
            let topic = topic.to_owned();
            async move {
                producer
                    .send(
                        rdkafka::producer::FutureRecord::to(&topic)
                            .key(&key)
                            .payload(&bytes),
                        Duration::from_secs(10),
                    )
                    .await
                    .map_err(|(e, _)| e)
                    .unwrap();
            }
        })
        .collect();
    futures_util::future::join_all(sends).await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn requests_compressed_with_gzip_lz4_and_zstd_become_rows(pool: PgPool) {
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let (stop, handle) = spawn(support::consumer(&engine, &topics));
        let bootstrap = flotilla_tests::bootstrap_servers();
        for codec in ["gzip", "lz4", "zstd"] {
            produce_compressed(&bootstrap, &topics.requests, codec, 20).await;
        }
        wait_rows(&pool, 60).await;
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        for codec in ["gzip", "lz4", "zstd"] {
            let sql =
                format!("SELECT count(*) FROM workflow_run WHERE input->>'name' LIKE '{codec}-%'");
            assert_eq!(count(&pool, &sql).await, 20, "{codec}");
        }
        stop.cancel();
        handle.await.unwrap();
    })
    .await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn requests_compressed_with_snappy_become_rows(pool: PgPool) {
    within_deadline(async {
        let mock = support::MockTopics::new("snappy");
        let bootstrap = mock.cluster.bootstrap_servers();
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let consumer = flotilla_worker::consumer::RequestConsumer::subscribe(
            engine,
            support::codec(),
            mock.settings(),
        )
        .unwrap();
        let (stop, handle) = spawn(consumer);
        produce_compressed(&bootstrap, &mock.requests, "snappy", 20).await;
        wait_rows(&pool, 20).await;
        stop.cancel();
        handle.await.unwrap();
        drop(mock);
    })
    .await;
}
