//! Per-job order across relays, and republishing after a crash.

use super::*;

#[sqlx::test(migrator = "MIGRATOR")]
async fn events_of_one_job_arrive_in_sequence_with_three_relays(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("events");
        create_topic(&topic, 3).await.unwrap();
        let jobs: Vec<Uuid> = (0..200).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &jobs, 5, json!({"ok": true})).await;

        let stop = CancellationToken::new();
        let relays: Vec<_> = (0..3)
            .map(|n| {
                let relay = Relay::new(
                    pool.clone(),
                    Arc::new(SystemClock),
                    settings(&bootstrap_servers(), &topic, &format!("relay-{n}")),
                )
                .unwrap();
                let stop = stop.clone();
                tokio::spawn(async move { relay.run(stop, Duration::from_secs(10)).await })
            })
            .collect();
        let mut owners_seen = 0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while count(&pool, "PUBLISHED").await < 1000 {
            let owners: i64 = sqlx::query_scalar(
                "SELECT count(DISTINCT owner) FROM relay_bucket WHERE owner IS NOT NULL",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            owners_seen = owners_seen.max(owners);
            assert!(
                tokio::time::Instant::now() < deadline,
                "not everything was published"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.cancel();
        for relay in relays {
            relay.await.unwrap();
        }
        assert!(
            owners_seen >= 2,
            "the relays shared the buckets (saw {owners_seen} owners)"
        );
        let released: i64 =
            sqlx::query_scalar("SELECT count(*) FROM relay_bucket WHERE owner IS NOT NULL")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(released, 0, "buckets are released on shutdown");

        let events = read_events(&bootstrap_servers(), &topic, 1000).await;
        for (job, sequences) in sequences_by_job(&events) {
            assert_eq!(sequences, [1, 2, 3, 4, 5], "job {job}");
        }
        let (_, _, _, headers) = &events[0];
        assert!(
            headers["traceparent"].starts_with("00-"),
            "the stored trace context travels"
        );
        assert_eq!(
            headers["tracestate"], "flotilla=relayed",
            "and its tracestate with it"
        );
        assert!(
            ["ACCEPTED", "STEP_CHECKPOINT", "COMPLETED"]
                .contains(&headers[EVENT_TYPE_HEADER].as_str())
        );
        assert_eq!(headers["content-type"], "application/json");
    })
    .await
    .expect("timed out");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_relay_killed_before_marking_is_repeated_with_the_same_event_ids(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("events");
        create_topic(&topic, 3).await.unwrap();
        let jobs: Vec<Uuid> = (0..5).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &jobs, 3, json!({})).await;
        // Rows are due from the database's now(); the manual clock starts after it.
        let clock = Arc::new(ManualClock::new(Utc::now() + chrono::TimeDelta::seconds(1)));

        // Short bucket leases, on the database's clock: the heir waits for them.
        let short = |id: &str| {
            let mut settings = settings(&bootstrap_servers(), &topic, id);
            settings.lease = Duration::from_secs(1);
            settings
        };
        let doomed = Relay::new(pool.clone(), clock.clone(), short("doomed")).unwrap();
        let batch = doomed.publish_once().await.unwrap();
        assert_eq!(batch.acked(), 15, "the broker has them all");
        drop(batch); // killed before marking
        drop(doomed);
        assert_eq!(count(&pool, "PENDING").await, 15);

        let heir = Relay::new(pool.clone(), clock.clone(), short("heir")).unwrap();
        assert_eq!(
            heir.drain_once().await.unwrap().published,
            0,
            "the dead relay's buckets are still leased"
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let mut published = 0;
        while published < 15 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the heir never took over"
            );
            published += heir.drain_once().await.unwrap().published;
        }
        assert_eq!(count(&pool, "PUBLISHED").await, 15);

        let events = read_events(&bootstrap_servers(), &topic, 30).await;
        let mut copies: HashMap<Uuid, usize> = HashMap::new();
        for (_, _, event, _) in &events {
            *copies.entry(event.event_id()).or_default() += 1;
        }
        assert_eq!(copies.len(), 15);
        assert!(
            copies.values().all(|&n| n == 2),
            "each event twice, with one event id: consumers dedupe"
        );
        for (_, sequences) in sequences_by_job(&events) {
            assert_eq!(sequences, [1, 2, 3, 1, 2, 3]);
        }
    })
    .await
    .expect("timed out");
}
