//! Order under changed partitions: the relay places every event by the
//! partition count recorded for the event topic, with librdkafka's own hash,
//! so partitions added to the topic get no events (and no job's events are
//! split across partitions) until the change is accepted, which records
//! the new count; a topic with fewer partitions than recorded stops
//! publishing until then.

use super::*;

async fn recorded(pool: &PgPool, topic: &str) -> Option<i32> {
    sqlx::query_scalar("SELECT partitions FROM event_topic WHERE topic = $1")
        .bind(topic)
        .fetch_optional(pool)
        .await
        .unwrap()
}

/// A topic deleted and made again with fewer partitions than recorded
/// cannot take the recorded mapping (its partitions do not all exist).
#[sqlx::test(migrator = "MIGRATOR")]
async fn fewer_partitions_than_recorded_stop_publishing_until_the_change_is_accepted(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("events");
        flotilla_tests::create_topic(&topic, 3).await.unwrap();
        let bootstrap = flotilla_tests::bootstrap_servers();
        let jobs: Vec<Uuid> = (0..6).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &jobs, 1, json!({})).await;
        // The relays published to this topic when it had four partitions.
        let mut conn = pool.acquire().await.unwrap();
        flotilla_store::topics::record_partitions(&mut conn, &topic, 4)
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
        assert!(problem.contains("3 partitions, 4 recorded"), "{problem}");
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

/// Writes event `sequence` of three of each of `jobs`.
async fn insert_event(pool: &PgPool, jobs: &[Uuid], sequence: i64) {
    insert_event_of(pool, jobs, sequence, 3, json!({})).await;
}

/// Waits until `expected` rows are PUBLISHED.
async fn until_published(pool: &PgPool, expected: i64, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let published = count(pool, "PUBLISHED").await;
        if published >= expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {published} of {expected} published"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The partition count `topic` has in a fresh client's metadata.
fn partitions_listed(bootstrap: &str, topic: &str) -> usize {
    let reader: rdkafka::consumer::BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let metadata = reader
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    metadata.topics()[0].partitions().len()
}

/// Review K5: an admin (or an autoscaler) adds partitions to the event
/// topic while a relay publishes, without stopping the relays first. The
/// relay's producer refreshes its metadata every 100 ms here, so it lists
/// the new partitions long before the guard's next check would; still
/// every job's later events go to the partition of its first one (the
/// recorded count's), none to the new partitions, and publishing goes on,
/// until the new count is accepted; from then on the accepted count maps.
#[sqlx::test(migrator = "MIGRATOR")]
async fn partitions_added_while_publishing_get_no_events_until_the_new_count_is_accepted(
    pool: PgPool,
) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("events");
        flotilla_tests::create_topic(&topic, 3).await.unwrap();
        let bootstrap = flotilla_tests::bootstrap_servers();
        let mut relay_settings = settings(&bootstrap, &topic, "grown");
        relay_settings
            .broker
            .security
            .kafka_property
            .push(("topic.metadata.refresh.interval.ms".into(), "100".into()));
        let relay = Relay::new(pool.clone(), Arc::new(SystemClock), relay_settings).unwrap();
        let stop = CancellationToken::new();
        let running = {
            let (relay, stop) = (relay.clone(), stop.clone());
            tokio::spawn(async move { relay.run(stop, Duration::from_secs(5)).await })
        };
        let jobs: Vec<Uuid> = (0..60).map(|_| Uuid::new_v4()).collect();
        insert_event(&pool, &jobs, 1).await;
        until_published(&pool, 60, "ACCEPTED").await;

        let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
            ClientConfig::new()
                .set("bootstrap.servers", &bootstrap)
                .create()
                .unwrap();
        let options =
            rdkafka::admin::AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        for result in admin
            .create_partitions([&rdkafka::admin::NewPartitions::new(&topic, 12)], &options)
            .await
            .unwrap()
        {
            result.unwrap();
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while partitions_listed(&bootstrap, &topic) < 12 {
            assert!(tokio::time::Instant::now() < deadline, "never listed 12");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Published while the relay's producer, and then its guard, list 12.
        insert_event(&pool, &jobs, 2).await;
        until_published(&pool, 120, "checkpoints after the increase").await;
        let checked = relay.partitions().check(&pool).await.unwrap();
        assert_eq!(
            checked,
            flotilla_relay::partitions::Checked::Grown {
                recorded: 3,
                found: 12
            }
        );
        assert!(relay.partitions().problem().is_none(), "still publishing");
        insert_event(&pool, &jobs, 3).await;
        until_published(&pool, 180, "COMPLETED after the guard saw 12").await;
        stop.cancel();
        running.await.unwrap();
        assert_eq!(recorded(&pool, &topic).await, Some(3));

        let events = read_events(&bootstrap, &topic, 180).await;
        let by_job = sequences_by_job(&events); // one job, one partition
        assert!(by_job.values().all(|s| s == &[1, 2, 3]), "{by_job:?}");
        for (partition, key, _, _) in &events {
            assert_eq!(
                *partition,
                flotilla_relay::placement::partition_for(key.as_bytes(), 3),
                "job {key}: its events stay where the recorded count maps it"
            );
        }
        let on_new =
            copies_on_topic(&bootstrap, &topic, 12) - copies_on_topic(&bootstrap, &topic, 3);
        assert_eq!(on_new, 0, "nothing on the added partitions");

        // Accepted (after the relays were stopped and the consumers caught
        // up, as docs/operations.md says): the new count maps new events.
        let mut accepting = settings(&bootstrap, &topic, "accepting");
        accepting.accept_partition_change = true;
        let accepting = Relay::new(pool.clone(), Arc::new(SystemClock), accepting).unwrap();
        let later: Vec<Uuid> = (0..60).map(|_| Uuid::new_v4()).collect();
        insert_event(&pool, &later, 1).await;
        let report = accepting.drain_once().await.unwrap();
        assert_eq!(report.published, 60, "{report:?}");
        assert_eq!(recorded(&pool, &topic).await, Some(12));
        let events = read_events(&bootstrap, &topic, 240).await;
        let mut on_added = 0;
        for (partition, key, event, _) in &events {
            if later.contains(&event.job_id()) {
                assert_eq!(
                    *partition,
                    flotilla_relay::placement::partition_for(key.as_bytes(), 12)
                );
                on_added += usize::from(*partition >= 3);
            }
        }
        assert!(on_added > 0, "the added partitions are used once accepted");
        drop(accepting);
        drop(relay);
    })
    .await
    .expect("timed out");
}

/// The relay places records by the hash librdkafka's `consistent_random`
/// partitioner uses, so the jobs of a topic published to before this
/// relay chose partitions itself keep theirs: the partition it computes for
/// a key is the one the broker put a record of that key in when the
/// producer chose (a real topic of seven partitions, keys of every length
/// events and others have).
#[tokio::test]
async fn the_relays_partition_of_a_key_is_where_librdkafkas_partitioner_put_it() {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("placement");
        flotilla_tests::create_topic(&topic, 7).await.unwrap();
        let producer: rdkafka::producer::FutureProducer = flotilla_tests::broker()
            .idempotent_producer()
            .create()
            .unwrap();
        let mut keys: Vec<String> = (0..300).map(|_| Uuid::new_v4().to_string()).collect();
        keys.extend((1..=40).map(|n| "k".repeat(n)));
        for key in &keys {
            let record = rdkafka::producer::FutureRecord::to(&topic)
                .key(key)
                .payload("x");
            let delivered = producer
                .send(record, Duration::from_secs(10))
                .await
                .unwrap();
            assert_eq!(
                delivered.partition,
                flotilla_relay::placement::partition_for(key.as_bytes(), 7),
                "key {key}"
            );
        }
        let used: std::collections::BTreeSet<i32> = keys
            .iter()
            .map(|k| flotilla_relay::placement::partition_for(k.as_bytes(), 7))
            .collect();
        assert_eq!(used.len(), 7, "the keys spread over every partition");
        std::thread::spawn(move || drop(producer));
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
