//! The worker on a three-broker Kafka cluster of the test's own: the topics
//! it creates are laid out for the cluster it finds, and an existing topic
//! that cannot take `acks=all` writes safely is named in readiness (review
//! finding K4).

use std::process::Command;
use std::time::Duration;

use flotilla_tests::kafka::{KafkaOptions, OwnKafkaCluster};
use flotilla_tests::process::Running;
use flotilla_tests::unique;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use sqlx::PgPool;
use uuid::Uuid;

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// A cluster with Kafka's own topic defaults (one partition, one replica):
/// what a stock cluster hands a topic created without a layout.
async fn stock_cluster(dir: &std::path::Path) -> OwnKafkaCluster {
    OwnKafkaCluster::started(dir, 3, KafkaOptions::default().set("min.insync.replicas=2")).await
}

fn worker(bootstrap: &str, database: &str, dir: &std::path::Path, topic: &str) -> Command {
    std::fs::create_dir_all(dir.join("workflows")).unwrap();
    std::fs::write(
        dir.join("targets.yaml"),
        "targets:\n  svc:\n    kind: http\n    base_url: http://127.0.0.1:9\n",
    )
    .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla-worker"));
    command
        .env("DATABASE_URL", database)
        .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap)
        .env("SCHEMA_REGISTRY_URL", "")
        .env("FLOTILLA_WORKER_ID", unique("cluster-worker"))
        .env("FLOTILLA_HTTP_ADDR", "127.0.0.1:0")
        .env("FLOTILLA_API_TOKENS", "t")
        .env("FLOTILLA_REQUEST_TOPIC", topic)
        .env("FLOTILLA_SIGNAL_TOPIC", "")
        .env("FLOTILLA_CONSUMER_GROUP", unique("cluster-workers"))
        .env("FLOTILLA_WORKER_COUNT", "0")
        .env("FLOTILLA_WORKFLOWS_DIR", dir.join("workflows"))
        .env("FLOTILLA_TARGETS_FILE", dir.join("targets.yaml"))
        .env("NO_COLOR", "1");
    command
}

/// (replicas of its first partition, its `min.insync.replicas`).
async fn layout_of(bootstrap: &str, topic: &str) -> (usize, String) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let described = admin
        .describe_configs([&ResourceSpecifier::Topic(topic)], &AdminOptions::new())
        .await
        .unwrap();
    let min_insync = described[0]
        .as_ref()
        .unwrap()
        .get("min.insync.replicas")
        .and_then(|entry| entry.value.clone())
        .unwrap();
    std::thread::spawn(move || drop(admin));
    let (bootstrap, topic) = (bootstrap.to_owned(), topic.to_owned());
    let replicas = tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .create()
            .unwrap();
        let metadata = consumer
            .fetch_metadata(Some(&topic), Duration::from_secs(10))
            .unwrap();
        let replicas = metadata.topics()[0].partitions()[0].replicas().len();
        std::thread::spawn(move || drop(consumer));
        replicas
    })
    .await
    .unwrap();
    (replicas, min_insync)
}

/// `/readyz` of the worker whose output is `running`'s, asked with its
/// token (the reasons are given to token holders only).
async fn readyz(running: &Running) -> (u16, String) {
    let api = running
        .logged("worker ready", "api")
        .expect("the API's address");
    let response = flotilla_runtime::tls::http_client()
        .build()
        .unwrap()
        .get(format!("http://{api}/readyz"))
        .bearer_auth("t")
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn topics_a_worker_creates_on_three_brokers_get_three_replicas_and_two_in_sync(pool: PgPool) {
    tokio::time::timeout(Duration::from_secs(180), async {
        let dir = std::env::temp_dir().join(format!("flotilla-cluster-topics-{}", Uuid::new_v4()));
        let cluster = stock_cluster(&dir).await;
        let topic = unique("cluster-requests");
        let database = flotilla_tests::database::url_of(&pool).await;
        let running = flotilla_tests::process::started(
            worker(&cluster.bootstrap, &database, &dir, &topic),
            "worker ready",
        )
        .await;
        for created in [
            topic.clone(),
            flotilla_contracts::topics::dead_letter_topic(&topic),
        ] {
            assert_eq!(
                layout_of(&cluster.bootstrap, &created).await,
                (3, "2".to_owned()),
                "{created}: three replicas, two in sync, not the cluster's one"
            );
        }
        let (status, body) = readyz(&running).await;
        assert_eq!(status, 200, "{body}");
        drop(running);
        drop(cluster);
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("timed out");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_topic_with_fewer_replicas_than_its_min_insync_replicas_is_named_in_readiness(
    pool: PgPool,
) {
    tokio::time::timeout(Duration::from_secs(180), async {
        let dir = std::env::temp_dir().join(format!("flotilla-cluster-unfit-{}", Uuid::new_v4()));
        let cluster = stock_cluster(&dir).await;
        // The request topic as a stock cluster makes it: one replica, while
        // the brokers ask for two in sync.
        let topic = unique("cluster-unfit");
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &cluster.bootstrap)
            .create()
            .unwrap();
        let created = admin
            .create_topics(
                [&NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
            )
            .await
            .unwrap();
        assert!(created.iter().all(Result::is_ok), "{created:?}");
        std::thread::spawn(move || drop(admin));
        let database = flotilla_tests::database::url_of(&pool).await;
        let mut running = flotilla_tests::process::started(
            worker(&cluster.bootstrap, &database, &dir, &topic),
            "worker ready",
        )
        .await;
        let (status, body) = readyz(&running).await;
        assert_eq!(status, 503, "{body}");
        assert!(
            body.contains(&topic) && body.contains("min.insync.replicas=2"),
            "{body}"
        );
        let logged = running.output_so_far().iter().any(|line| {
            line.contains("ERROR") && line.contains(&topic) && line.contains("replication factor")
        });
        assert!(logged, "{}", running.output.join("\n"));
        drop(running);
        drop(cluster);
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("timed out");
}
