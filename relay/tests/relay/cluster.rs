//! The relay on a three-broker Kafka cluster of the test's own (replication
//! 3, `min.insync.replicas` 2) while a broker dies: review findings K1 and
//! K8. Every `acks=all` write stalls until the controller fences the dead
//! broker (about 11 s); the relay's idempotent producer, with a send window
//! (a third of the default 60 s lease) longer than that stall, writes each
//! event once and in order, and no operator does anything.

use std::collections::HashMap;

use flotilla_tests::kafka::OwnKafkaCluster;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;

use super::*;

/// Partitions of the event topic.
const PARTITIONS: i32 = 6;
/// Jobs of five events each, inserted every 250 ms.
const JOBS_PER_WAVE: usize = 10;
const WAVES: usize = 80;
/// When broker 1 is killed, and when it is started again.
const KILL_AT: Duration = Duration::from_secs(5);
const RESTART_AT: Duration = Duration::from_secs(25);

async fn create_replicated_topic(bootstrap: &str, topic: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let created = admin
        .create_topics(
            [&NewTopic::new(
                topic,
                PARTITIONS,
                TopicReplication::Fixed(3),
            )],
            &options,
        )
        .await
        .unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    std::thread::spawn(move || drop(admin));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_broker_killed_under_the_relay_costs_a_pause_and_no_event_is_written_twice(pool: PgPool) {
    tokio::time::timeout(Duration::from_secs(240), async {
        let dir = std::env::temp_dir().join(format!("flotilla-relay-cluster-{}", Uuid::new_v4()));
        let mut cluster = OwnKafkaCluster::started(
            &dir,
            3,
            flotilla_tests::kafka::KafkaOptions::default()
                .set("default.replication.factor=3")
                .set("min.insync.replicas=2"),
        )
        .await;
        let topic = unique("cluster-events");
        create_replicated_topic(&cluster.bootstrap, &topic).await;
        // The defaults: an idempotent producer, a 60 s lease (a 20 s window).
        let relay = Relay::new(
            pool.clone(),
            Arc::new(SystemClock),
            settings(&cluster.bootstrap, &topic, "through-a-failover"),
        )
        .unwrap();
        let stop = CancellationToken::new();
        let running = {
            let (relay, stop) = (relay.clone(), stop.clone());
            tokio::spawn(async move { relay.run(stop, Duration::from_secs(5)).await })
        };

        let started = tokio::time::Instant::now();
        let mut jobs = Vec::new();
        let mut killed_at = None;
        for wave in 0..WAVES {
            let wave_jobs: Vec<Uuid> = (0..JOBS_PER_WAVE).map(|_| Uuid::new_v4()).collect();
            insert_events(&pool, &wave_jobs, 5, json!({"wave": wave})).await;
            jobs.extend(wave_jobs);
            if killed_at.is_none() && started.elapsed() >= KILL_AT {
                cluster.nodes[0].kill();
                killed_at = Some(tokio::time::Instant::now());
            }
            tokio::time::sleep_until(started + Duration::from_millis(250 * (wave as u64 + 1))).await;
        }
        assert!(killed_at.is_some(), "the broker was killed");
        tokio::time::sleep_until(started + RESTART_AT).await;
        let node = cluster.nodes.remove(0);
        cluster.nodes.insert(0, node.restarted().await);

        let expected = jobs.len() * 5;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        while count(&pool, "PUBLISHED").await < i64::try_from(expected).unwrap() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} of {expected} events published",
                count(&pool, "PUBLISHED").await
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        stop.cancel();
        running.await.unwrap();

        let on_topic = copies_on_topic(&cluster.bootstrap, &topic, PARTITIONS);
        let events = read_events(&cluster.bootstrap, &topic, on_topic).await;
        let mut copies: HashMap<Uuid, usize> = HashMap::new();
        for (_, _, event, _) in &events {
            *copies.entry(event.event_id()).or_default() += 1;
        }
        let twice = copies.values().filter(|n| **n > 1).count();
        let (distinct, repeats) = without_repeats(&events);
        println!(
            "a broker of three killed under the relay: {expected} events, {on_topic} records on the topic, \
             events written twice {twice}"
        );
        assert_eq!(copies.len(), expected, "every event on the topic");
        assert_eq!(twice, 0, "an event written twice");
        assert_eq!(repeats, 0);
        assert!(
            distinct.values().all(|sequences| *sequences == [1, 2, 3, 4, 5]),
            "every job's events in order"
        );
        drop(cluster);
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("timed out");
}

/// A topic whose in-sync replicas fall below its `min.insync.replicas`
/// refuses every write (NOT_ENOUGH_REPLICAS): the relay holds its rows back
/// without failing any, and its readiness names the cause and the
/// topic; once the broker is back, every row goes out.
#[sqlx::test(migrator = "MIGRATOR")]
async fn not_enough_in_sync_replicas_is_named_in_readiness_and_nothing_is_lost(pool: PgPool) {
    tokio::time::timeout(Duration::from_secs(240), async {
        let dir = std::env::temp_dir().join(format!("flotilla-relay-isr-{}", Uuid::new_v4()));
        let mut cluster =
            OwnKafkaCluster::started(&dir, 3, flotilla_tests::kafka::KafkaOptions::default()).await;
        // One partition on brokers 1 and 2, both of which must hold a write.
        let topic = unique("isr-events");
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &cluster.bootstrap)
            .create()
            .unwrap();
        let new_topic = NewTopic::new(&topic, 1, TopicReplication::Variable(&[&[1, 2]]))
            .set("min.insync.replicas", "2");
        let created = admin
            .create_topics([&new_topic], &AdminOptions::new())
            .await
            .unwrap();
        assert!(created.iter().all(Result::is_ok), "{created:?}");
        std::thread::spawn(move || drop(admin));

        let port = flotilla_tests::free_port();
        let url = flotilla_tests::database::url_of(&pool).await;
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla-relay"));
        command
            .env("DATABASE_URL", &url)
            .env("KAFKA_BOOTSTRAP_SERVERS", &cluster.bootstrap)
            .env("FLOTILLA_EVENT_TOPIC", &topic)
            .env("FLOTILLA_RELAY_HTTP_ADDR", format!("127.0.0.1:{port}"))
            .env("SCHEMA_REGISTRY_URL", "")
            .env("FLOTILLA_RELAY_BACKOFF_BASE", "200ms")
            .env("NO_COLOR", "1");
        let relay = flotilla_tests::process::started(command, "relay ready").await;

        cluster.nodes[1].kill();
        let jobs: Vec<Uuid> = (0..5).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &jobs, 2, json!({})).await;
        let client = flotilla_runtime::tls::http_client().build().unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        let body = loop {
            let response = client
                .get(format!("http://127.0.0.1:{port}/readyz"))
                .send()
                .await
                .unwrap();
            let status = response.status();
            let body = response.text().await.unwrap();
            if status == 503 && body.contains("NOT_ENOUGH_REPLICAS") {
                break body;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "readiness never named the cause: {status} {body}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        assert!(body.contains(&topic), "{body}");
        assert_eq!(
            count(&pool, "FAILED").await,
            0,
            "the world's refusal fails no row"
        );

        let node = cluster.nodes.remove(1);
        cluster.nodes.insert(1, node.restarted().await);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        while count(&pool, "PUBLISHED").await < 10 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "rows did not publish after the broker returned"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        drop(relay);
        drop(cluster);
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("timed out");
}
