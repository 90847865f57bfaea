//! Request ingestion figures: requests per second from the topic to durable
//! rows with committed offsets, one consumer, JSON and then Avro.
//!
//! `cargo run --release -p flotilla-worker --example ingest_throughput -- [requests]`
//! with `DATABASE_URL`, `KAFKA_BOOTSTRAP_SERVERS` and `SCHEMA_REGISTRY_URL`
//! (as `scripts/services env` prints them). A scratch database and fresh
//! topics are used.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_codec::Codec;
use flotilla_contracts::{WorkflowRunRequest, topics};
use flotilla_runtime::BrokerConfig;
use flotilla_tests::scratch::ScratchDatabase;
use flotilla_worker::engine::{Engine, EngineSettings, SystemClock};
use flotilla_worker::ingest::{ConsumerSettings, RequestConsumer};
use flotilla_worker::test_support::echo_targets;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const PARTITIONS: i32 = 3;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let requests: usize = std::env::args().nth(1).map_or(Ok(100_000), |a| a.parse())?;
    let bootstrap = std::env::var("KAFKA_BOOTSTRAP_SERVERS")?;
    let registry = std::env::var("SCHEMA_REGISTRY_URL")?;
    for (label, registry) in [("JSON", None), ("Avro (registry)", Some(registry.as_str()))] {
        let scratch = ScratchDatabase::create("flotilla_ingest", 8).await?;
        let outcome = measure(&scratch.pool, &bootstrap, registry, requests).await;
        scratch.drop_now().await?;
        let (produced, ingested) = outcome?;
        println!(
            "{label}: produced {requests} in {:.1} s; ingested (rows durable, offsets committed) in {:.1} s = {:.0} requests/s",
            produced.as_secs_f64(),
            ingested.as_secs_f64(),
            requests as f64 / ingested.as_secs_f64()
        );
    }
    Ok(())
}

async fn measure(
    pool: &PgPool,
    bootstrap: &str,
    registry: Option<&str>,
    requests: usize,
) -> anyhow::Result<(Duration, Duration)> {
    let topic = format!("ingest-{}", Uuid::new_v4().simple());
    let group = format!("ingest-{}", Uuid::new_v4().simple());
    let broker = BrokerConfig::new(bootstrap);
    let dead_letters = topics::dead_letter_topic(&topic);
    flotilla_runtime::kafka::ensure_topics(&broker, &[&topic, &dead_letters], layout()).await?;
    let engine = Engine::new(
        pool.clone(),
        echo_targets(),
        Arc::new(SystemClock),
        EngineSettings::new("ingest"),
    );
    engine
        .register_workflow(&json!({"name": "small", "input_schema": {}, "steps": [{"name": "s", "target": "echo", "method": "m"}]}))
        .await?;

    let codec = Arc::new(match registry {
        Some(url) => Codec::with_registry(url)?,
        None => Codec::json(),
    });
    let producer: FutureProducer = broker
        .idempotent_producer()
        .set("linger.ms", "20")
        .set("compression.type", "lz4")
        .create()?;
    let started = Instant::now();
    let mut pending = Vec::with_capacity(requests);
    for n in 0..requests {
        let request = WorkflowRunRequest::new(Uuid::new_v4(), "small", json!({"n": n}))?;
        let bytes = codec.encode(&topic, &request).await?;
        let key = request.job_id().to_string();
        pending.push(
            producer
                .send_result(FutureRecord::to(&topic).key(&key).payload(&bytes))
                .map_err(|(e, _)| e)?,
        );
    }
    for delivery in pending {
        delivery.await?.map_err(|(e, _)| e)?;
    }
    let produced = started.elapsed();

    let settings = ConsumerSettings::new(broker.clone(), &topic, &group);
    let consumer = RequestConsumer::subscribe(engine, codec, settings)?;
    let stop = CancellationToken::new();
    let started = Instant::now();
    let handle = tokio::spawn(consumer.run(stop.clone()));
    let watcher: BaseConsumer = broker.client().set("group.id", &group).create()?;
    loop {
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM workflow_run")
            .fetch_one(pool)
            .await?;
        if rows == requests as i64 && committed(&watcher, &topic)? == requests as i64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ingested = started.elapsed();
    stop.cancel();
    handle.await?;
    std::thread::spawn(move || drop(watcher));
    Ok((produced, ingested))
}

fn committed(watcher: &BaseConsumer, topic: &str) -> anyhow::Result<i64> {
    let mut partitions = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        partitions.add_partition(topic, p);
    }
    let offsets = watcher.committed_offsets(partitions, Duration::from_secs(10))?;
    Ok(offsets
        .elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(o) => o,
            _ => 0,
        })
        .sum())
}

/// Three partitions, one replica: the single broker of `scripts/services`.
fn layout() -> flotilla_runtime::kafka::TopicLayout {
    flotilla_runtime::kafka::TopicLayout {
        create_topics: true,
        topic_partitions: 3,
        topic_replication: 1,
        topic_min_insync_replicas: flotilla_runtime::kafka::BROKER_DEFAULT,
    }
}
