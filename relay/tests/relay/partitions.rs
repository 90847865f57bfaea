//! Order under changed partitions: a relay that finds the event topic with
//! another partition count than the one recorded publishes nothing (a job
//! in flight could have its events split across partitions) until the
//! change is accepted, which records the new count.

use super::*;

async fn recorded(pool: &PgPool, topic: &str) -> Option<i32> {
    sqlx::query_scalar("SELECT partitions FROM event_topic WHERE topic = $1")
        .bind(topic)
        .fetch_optional(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_changed_partition_count_stops_publishing_until_the_change_is_accepted(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("events");
        flotilla_tests::create_topic(&topic, 3).await.unwrap();
        let bootstrap = flotilla_tests::bootstrap_servers();
        let jobs: Vec<Uuid> = (0..6).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &jobs, 1, json!({})).await;
        // The relays published to this topic when it had two partitions.
        let mut conn = pool.acquire().await.unwrap();
        flotilla_store::topics::record_partitions(&mut conn, &topic, 2)
            .await
            .unwrap();
        drop(conn);
        let clock = Arc::new(ManualClock::new(Utc::now() + chrono::TimeDelta::seconds(1)));
        let careful = Relay::new(
            pool.clone(),
            clock.clone(),
            settings(&bootstrap, &topic, "careful"),
        )
        .unwrap();
        let report = careful.drain_once().await.unwrap();
        assert_eq!(report.published, 0, "{report:?}");
        assert_eq!(count(&pool, "PENDING").await, 6);
        assert_eq!(
            copies_on_topic(&bootstrap, &topic, 3),
            0,
            "nothing reached the topic"
        );
        let problem = careful.partitions().problem().expect("publishing stopped");
        assert!(problem.contains("3 partitions, 2 recorded"), "{problem}");
        assert!(problem.contains("--accept-partition-change"), "{problem}");
        drop(careful);

        let mut accepting = settings(&bootstrap, &topic, "accepting");
        accepting.accept_partition_change = true;
        let accepting = Relay::new(pool.clone(), clock, accepting).unwrap();
        let report = accepting.drain_once().await.unwrap();
        assert_eq!(report.published, 6, "{report:?}");
        assert_eq!(recorded(&pool, &topic).await, Some(3));
        drop(accepting);
    })
    .await
    .expect("timed out");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn the_first_relay_records_the_event_topics_partition_count(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("events");
        flotilla_tests::create_topic(&topic, 4).await.unwrap();
        let clock = Arc::new(ManualClock::new(Utc::now()));
        let relay = Relay::new(
            pool.clone(),
            clock,
            settings(&flotilla_tests::bootstrap_servers(), &topic, "first"),
        )
        .unwrap();
        relay.drain_once().await.unwrap();
        assert_eq!(recorded(&pool, &topic).await, Some(4));
        assert!(relay.partitions().problem().is_none());
        drop(relay);
    })
    .await
    .expect("timed out");
}
