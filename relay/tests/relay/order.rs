//! Per-job order across relays, and republishing after a crash.

use super::*;

#[sqlx::test(migrator = "MIGRATOR")]
async fn events_of_one_job_arrive_in_sequence_with_three_relays(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("events");
        create_topic(&topic, 3).await.unwrap();
        let stop = CancellationToken::new();
        let relays: Vec<_> = (0..3)
            .map(|n| {
                let mut settings = settings(&bootstrap_servers(), &topic, &format!("relay-{n}"));
                // Rebalanced every third of a second, so the three share soon.
                settings.lease = Duration::from_secs(1);
                let relay = Relay::new(pool.clone(), Arc::new(SystemClock), settings).unwrap();
                let stop = stop.clone();
                tokio::spawn(async move { relay.run(stop, Duration::from_secs(10)).await })
            })
            .collect();
        // The buckets are shared before the events arrive.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let owners: i64 = sqlx::query_scalar(
                "SELECT count(DISTINCT owner) FROM relay_bucket WHERE owner IS NOT NULL",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            if owners == 3 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the relays never shared the buckets ({owners} owners)"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let jobs: Vec<Uuid> = (0..200).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &jobs, 5, json!({"ok": true})).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while count(&pool, "PUBLISHED").await < 1000 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "not everything was published"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let publishers: i64 = sqlx::query_scalar(
            "SELECT count(DISTINCT b.owner) FROM workflow_run_outbox o JOIN relay_bucket b ON b.bucket = o.bucket",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(publishers, 3, "the events' buckets belong to all three relays");
        stop.cancel();
        for relay in relays {
            relay.await.unwrap();
        }
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
        let (_, _, event, headers) = &events[0];
        assert_eq!(event.workflow_version(), Some(3), "the job's version travels");
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
        assert_eq!(batch.acked(), 15, "the broker has the whole batch");
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
        let mut copies: HashMap<Uuid, Vec<i64>> = HashMap::new();
        for (_, _, event, _) in &events {
            copies
                .entry(event.event_id())
                .or_default()
                .push(event.sequence());
        }
        assert_eq!(copies.len(), 15);
        assert!(
            copies.values().all(|sequences| sequences.len() == 2),
            "the unmarked batch twice, with the same event ids (consumers dedupe): {copies:?}"
        );
        let (distinct, repeats) = without_repeats(&events);
        assert_eq!(repeats, 15);
        for (_, sequences) in distinct {
            assert_eq!(sequences, [1, 2, 3], "first copies in order");
        }
    })
    .await
    .expect("timed out");
}
