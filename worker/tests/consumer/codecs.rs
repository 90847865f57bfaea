//! Every compression codec Kafka producers use is read: batches compressed
//! with gzip, snappy, lz4 and zstd all become rows.

use super::*;

/// Kafka's compression codecs (`compression.type`).
const CODECS: [&str; 4] = ["gzip", "snappy", "lz4", "zstd"];

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
async fn requests_compressed_with_gzip_snappy_lz4_and_zstd_become_rows(pool: PgPool) {
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let (stop, handle) = spawn(support::consumer(&engine, &topics));
        let bootstrap = flotilla_tests::bootstrap_servers();
        for codec in CODECS {
            produce_compressed(&bootstrap, &topics.requests, codec, 20).await;
        }
        wait_rows(&pool, 80).await;
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        for codec in CODECS {
            let sql =
                format!("SELECT count(*) FROM workflow_run WHERE input->>'name' LIKE '{codec}-%'");
            assert_eq!(count(&pool, &sql).await, 20, "{codec}");
        }
        stop.cancel();
        handle.await.unwrap();
    })
    .await;
}
