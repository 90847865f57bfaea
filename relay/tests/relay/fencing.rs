//! Fenced relays: a relay publishes and marks only rows of buckets it
//! holds, by the database's clock. One that stalls past its lease (SIGSTOP)
//! while another takes over publishes nothing out of order when it wakes.

use std::process::Command;

use flotilla_store::Clock as _;
use flotilla_store::buckets;
use flotilla_tests::process::Running;

use super::*;

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_relay_that_lost_its_buckets_marks_nothing_and_sends_nothing_more(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("fenced");
        create_topic(&topic, 3).await.unwrap();
        let jobs: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &jobs, 2, json!({})).await;
        let clock = Arc::new(ManualClock::new(Utc::now() + chrono::TimeDelta::seconds(1)));
        let stale = Relay::new(pool.clone(), clock.clone(), settings(&bootstrap_servers(), &topic, "stale")).unwrap();
        let batch = stale.publish_once().await.unwrap();
        assert_eq!(batch.acked(), 4, "each job's first event");
        // Its leases run out (it stalled), and another relay takes them.
        sqlx::query("UPDATE relay_bucket SET lease_until = now() - interval '1 second' WHERE owner = 'stale'")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("DELETE FROM relay_member WHERE relay_id = 'stale'")
            .execute(&pool)
            .await
            .unwrap();
        let fresh = Relay::new(pool.clone(), clock.clone(), settings(&bootstrap_servers(), &topic, "fresh")).unwrap();
        assert_eq!(fresh.drain_once().await.unwrap().published, 4);
        let report = batch
            .mark(&pool, "stale", clock.now(), Duration::from_millis(100))
            .await
            .unwrap();
        assert_eq!(report.published, 0, "the stale relay's marks are fenced off");

        // A renewal finds the buckets gone: nothing more is sent from them.
        let leases = flotilla_relay::buckets::BucketLeases::new(pool.clone(), "stale".into(), Duration::from_secs(10));
        leases.renew().await.unwrap();
        let mut conn = pool.acquire().await.unwrap();
        let owned: Vec<i16> = sqlx::query_scalar("SELECT bucket FROM relay_bucket WHERE owner = 'fresh'")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
        assert!(owned.iter().all(|b| !leases.held().holds(*b)));
        assert_eq!(buckets::BUCKETS, 64);
    })
    .await
    .expect("timed out");
}

fn relay_process(topic: &str, id: &str, database_url: &str) -> Running {
    let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla-relay"));
    command
        .env("DATABASE_URL", database_url)
        .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap_servers())
        .env("FLOTILLA_EVENT_TOPIC", topic)
        .env("FLOTILLA_RELAY_ID", id)
        .env("FLOTILLA_RELAY_HTTP_ADDR", "127.0.0.1:0")
        .env("SCHEMA_REGISTRY_URL", "")
        .env("FLOTILLA_RELAY_LEASE", "2s")
        .env("FLOTILLA_RELAY_IDLE_POLL_MAX", "50ms")
        .env("NO_COLOR", "1");
    let mut running = Running::start(command);
    running.wait_for_line("relay ready", Duration::from_secs(60));
    running
}

async fn wait_until_none(pool: &PgPool, status: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while count(pool, status).await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "rows stayed {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_relay_paused_past_its_lease_and_resumed_publishes_nothing_out_of_order(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("stalled");
        create_topic(&topic, 3).await.unwrap();
        let url = flotilla_tests::database::url_of(&pool).await;

        let first: Vec<Uuid> = (0..20).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &first, 3, json!({})).await;
        let (topic_a, url_a) = (topic.clone(), url.clone());
        let sleeper =
            tokio::task::spawn_blocking(move || relay_process(&topic_a, "sleeper", &url_a))
                .await
                .unwrap();
        wait_until_none(&pool, "PENDING").await;

        sleeper.signal("STOP");
        let second: Vec<Uuid> = (0..20).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &second, 3, json!({})).await;
        let (topic_b, url_b) = (topic.clone(), url.clone());
        let mut heir = tokio::task::spawn_blocking(move || relay_process(&topic_b, "heir", &url_b))
            .await
            .unwrap();
        wait_until_none(&pool, "PENDING").await;

        sleeper.signal("CONT");
        let third: Vec<Uuid> = (0..20).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &third, 3, json!({})).await;
        wait_until_none(&pool, "PENDING").await;

        let events = read_events(&bootstrap_servers(), &topic, 180).await;
        let mut seen = std::collections::HashSet::new();
        let mut partition_of: HashMap<Uuid, i32> = HashMap::new();
        let mut streams: BTreeMap<Uuid, Vec<i64>> = BTreeMap::new();
        for (partition, _, event, _) in &events {
            assert_eq!(
                *partition_of.entry(event.job_id()).or_insert(*partition),
                *partition
            );
            if seen.insert(event.event_id()) {
                streams
                    .entry(event.job_id())
                    .or_default()
                    .push(event.sequence());
            }
        }
        assert_eq!(streams.len(), 60);
        for (job, stream) in streams {
            assert_eq!(
                stream,
                [1, 2, 3],
                "job {job}: deduplicated by event id, in order"
            );
        }
        let mut sleeper = sleeper;
        let (a, b) = tokio::task::spawn_blocking(move || {
            (
                sleeper.terminate(Duration::from_secs(30)),
                heir.terminate(Duration::from_secs(30)),
            )
        })
        .await
        .unwrap();
        assert!(a.success() && b.success());
    })
    .await
    .expect("timed out");
}
