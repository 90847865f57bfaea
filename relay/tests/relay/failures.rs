//! Broker outages and rows the broker refuses.

use super::*;

#[sqlx::test(migrator = "MIGRATOR")]
async fn rows_stay_pending_while_the_broker_is_down_then_publish_in_order(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let dir = std::env::temp_dir().join(format!("flotilla-outage-{}", Uuid::new_v4()));
        let mut kafka = OwnKafka::started(&dir, KafkaOptions::default()).await;
        let topic = unique("events");
        let bootstrap = kafka.address.clone();
        flotilla_tests::create_topic_on(&bootstrap, &topic, 3)
            .await
            .unwrap();
        let jobs: Vec<Uuid> = (0..10).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &jobs, 4, json!({})).await;
        let clock = Arc::new(ManualClock::new(Utc::now() + chrono::TimeDelta::seconds(1)));
        let mut relay_settings = settings(&bootstrap, &topic, "lonely");
        relay_settings.delivery_timeout = Some(Duration::from_secs(2));
        let relay = Relay::new(pool.clone(), clock.clone(), relay_settings).unwrap();

        kafka.kill();
        let report = relay.drain_once().await.unwrap();
        assert_eq!((report.published, report.failed), (0, 0));
        assert!(report.deferred > 0, "held back by the outage: {report:?}");
        assert_eq!(
            count(&pool, "PENDING").await,
            40,
            "nothing marked while the broker is down"
        );
        assert_eq!(
            count(&pool, "FAILED").await,
            0,
            "an outage of the broker fails no row"
        );

        let kafka = kafka.restarted().await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while count(&pool, "PUBLISHED").await < 40 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "rows did not publish after the broker returned"
            );
            clock.advance(Duration::from_secs(1));
            relay.drain_once().await.unwrap();
        }
        let events = read_events(&bootstrap, &topic, 40).await;
        for (job, sequences) in sequences_by_job(&events) {
            let mut deduped = sequences.clone();
            deduped.dedup();
            assert_eq!(deduped, [1, 2, 3, 4], "job {job} in order: {sequences:?}");
        }
        drop(relay);
        drop(kafka);
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("timed out");
}

/// A record the broker refuses for itself (too large) is refused every
/// time: its row lands FAILED at the first refusal, and nothing waits for
/// it, neither other jobs nor its own job's later events. The gap shows in
/// the sequence; an operator's replay sends it again, after them.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_row_the_broker_refuses_lands_failed_at_once_without_holding_anything_back(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("events");
        create_topic(&topic, 3).await.unwrap();

        // Job `big`: its COMPLETED (sequence 2) is too large; sequence 3 follows it.
        let big = Uuid::new_v4();
        insert_events(&pool, &[big], 2, json!({"blob": "x".repeat(5_000)})).await;
        let mut conn = pool.acquire().await.unwrap();
        let stamp = EventStamp { job_id: big, event_sequence: 3, workflow_name: "relayed".into(), workflow_version: None, metadata: None, attempt: 2, traceparent: None, tracestate: None };
        outbox::insert(&mut conn, &stamp, EventKind::Failed { error: "later".into(), verdict: None }, Utc::now()).await.unwrap();
        let others: Vec<Uuid> = (0..5).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &others, 2, json!({})).await;
        let clock = Arc::new(ManualClock::new(Utc::now() + chrono::TimeDelta::seconds(1)));
        let mut relay_settings = settings(&bootstrap_servers(), &topic, "strict");
        relay_settings.max_message_bytes = 2_000;
        let relay = Relay::new(pool.clone(), clock.clone(), relay_settings).unwrap();

        let report = relay.drain_once().await.unwrap();
        assert_eq!((report.published, report.failed, report.deferred), (12, 1, 0), "{report:?}");
        assert_eq!(count(&pool, "FAILED").await, 1);
        assert_eq!(count(&pool, "PUBLISHED").await, 12);
        let (sequence, error): (i64, String) = sqlx::query_as(
            "SELECT sequence, last_error FROM workflow_run_outbox_state WHERE status = 'FAILED' AND job_id = $1",
        )
        .bind(big)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(sequence, 2);
        assert!(error.contains("too large"), "{error}");
        let events = read_events(&bootstrap_servers(), &topic, 12).await;
        assert_eq!(sequences_by_job(&events)[&big], [1, 3], "the gap at 2 is visible through sequence");

        let mut conn = pool.acquire().await.unwrap();
        assert_eq!(outbox::relay::replay_failed(&mut conn, Some(big)).await.unwrap(), 1);
        assert_eq!(count(&pool, "PENDING").await, 1, "an operator sends it again");
        assert_eq!(count(&pool, "FAILED").await, 0);
        let report = relay.drain_once().await.unwrap();
        assert_eq!((report.published, report.failed), (0, 1), "refused again: {report:?}");
        assert_eq!(count(&pool, "FAILED").await, 1, "and FAILED again, once");
    })
    .await
    .expect("timed out");
}

/// A produce request refused with a retriable error while the next request
/// (the job's next event) is accepted: a broker that does not enforce the
/// idempotent producer's sequence numbers (the mock cluster, some
/// Kafka-compatible servers) then appends the later event first. The relay
/// must not depend on that enforcement: told its broker is such a one
/// (`idempotence = false`), it keeps one request in flight, so a retried
/// request goes before the next. On librdkafka's mock cluster, which
/// injects the refusal (and is such a broker).
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_retried_send_is_never_overtaken_by_the_jobs_next_event(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
        let topic = unique("events");
        cluster.create_topic(&topic, 1, 1).unwrap();
        let bootstrap = cluster.bootstrap_servers();
        let job = Uuid::new_v4();
        insert_events(&pool, &[job], 3, json!({})).await;
        // One record per request, so each event travels in its own request.
        let mut relay_settings = settings(&bootstrap, &topic, "retrying");
        // The mock cluster does not check producer sequences: an idempotent
        // producer would count the refused record as written.
        relay_settings.idempotence = false;
        relay_settings.broker.security.kafka_property = vec![
            ("batch.num.messages".into(), "1".into()),
            ("retry.backoff.ms".into(), "200".into()),
        ];
        cluster.request_errors(
            rdkafka::types::RDKafkaApiKey::Produce,
            &[rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS],
        );
        let relay = Relay::new(pool.clone(), Arc::new(SystemClock), relay_settings).unwrap();
        let stop = CancellationToken::new();
        let running = {
            let stop = stop.clone();
            tokio::spawn(async move { relay.run(stop, Duration::from_secs(5)).await })
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while count(&pool, "PUBLISHED").await < 3 {
            assert!(tokio::time::Instant::now() < deadline, "never published");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.cancel();
        running.await.unwrap();
        // Every copy on the topic, duplicates included.
        let on_topic = {
            let reader: rdkafka::consumer::BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &bootstrap)
                .create()
                .unwrap();
            let (_, high) = reader
                .fetch_watermarks(&topic, 0, Duration::from_secs(10))
                .unwrap();
            usize::try_from(high).unwrap()
        };
        let events = read_events(&bootstrap, &topic, on_topic).await;
        let mut seen = std::collections::HashSet::new();
        let first_seen: Vec<i64> = events
            .iter()
            .filter(|(_, _, event, _)| seen.insert(event.event_id()))
            .map(|(_, _, event, _)| event.sequence())
            .collect();
        assert_eq!(first_seen, [1, 2, 3], "first copies in order: {events:?}");
        drop(cluster);
    })
    .await
    .expect("timed out");
}

/// A broker that takes a request but answers only after the delivery
/// timeout: the pass fails no row, and moves the progress of exactly the
/// buckets every row of which was acknowledged; the others' batches go
/// again (repeats on the topic, never a sequence going back). On
/// librdkafka's mock cluster: two brokers, one of them slowed down by an
/// added round trip.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_delivery_timeout_moves_only_the_buckets_acknowledged_whole_and_fails_nothing(
    pool: PgPool,
) {
    use flotilla_relay::publisher::{Class, Reason};

    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let cluster = rdkafka::mocking::MockCluster::new(2).unwrap();
        let topic = unique("events");
        cluster.create_topic(&topic, 2, 1).unwrap();
        // Partition 0 on broker 1, partition 1 on broker 2.
        cluster.partition_leader(&topic, 0, Some(1)).unwrap();
        cluster.partition_leader(&topic, 1, Some(2)).unwrap();
        let bootstrap = cluster.bootstrap_servers();
        let jobs: Vec<Uuid> = (0..24).map(|_| Uuid::new_v4()).collect();
        insert_event_of(&pool, &jobs, 1, 3, json!({})).await;
        let clock = Arc::new(ManualClock::new(Utc::now() + chrono::TimeDelta::seconds(1)));
        let mut relay_settings = settings(&bootstrap, &topic, "patient");
        relay_settings.idempotence = false; // the mock checks no sequences
        relay_settings.delivery_timeout = Some(Duration::from_secs(2));
        let relay = Relay::new(pool.clone(), clock.clone(), relay_settings).unwrap();
        assert_eq!(
            relay.drain_once().await.unwrap().published,
            24,
            "both brokers answer"
        );

        // Broker 2 now answers three times later than the delivery timeout.
        cluster
            .broker_round_trip_time(2, Duration::from_secs(6))
            .unwrap();
        insert_event_of(&pool, &jobs, 2, 3, json!({})).await;
        insert_event_of(&pool, &jobs, 3, 3, json!({})).await;
        let report = relay.drain_once().await.unwrap();
        assert_eq!(report.failed, 0, "{report:?}");
        assert!(report.deferred > 0, "{report:?}");
        assert_eq!(
            report.misses,
            BTreeMap::from([((Class::World, Reason::Timeout), report.deferred)])
        );
        let marked: std::collections::BTreeSet<Uuid> = sqlx::query_scalar(
            "SELECT job_id FROM workflow_run_outbox_state WHERE sequence = 2 AND status = 'PUBLISHED'",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
        assert_eq!(marked.len() * 2, report.published, "{report:?}");
        assert_eq!(count(&pool, "FAILED").await, 0, "a timeout fails no row");

        cluster.broker_round_trip_time(2, Duration::ZERO).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while count(&pool, "PUBLISHED").await < 72 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "rows did not publish once broker 2 answered in time"
            );
            clock.advance(Duration::from_secs(1));
            relay.drain_once().await.unwrap();
        }
        assert_eq!(count(&pool, "FAILED").await, 0);

        let on_topic = copies_on_topic(&bootstrap, &topic, 2);
        let events = read_events(&bootstrap, &topic, on_topic).await;
        let on_broker_1: std::collections::BTreeSet<Uuid> = events
            .iter()
            .filter(|(partition, ..)| *partition == 0)
            .map(|(_, _, event, _)| event.job_id())
            .collect();
        assert!(
            marked.is_subset(&on_broker_1),
            "moved in the slow pass: only buckets whose every job's broker acknowledged"
        );
        let (distinct, repeats) = without_repeats(&events);
        assert_eq!(distinct.len(), 24);
        for (job, sequences) in distinct {
            assert_eq!(sequences, [1, 2, 3], "job {job}");
        }
        println!("{on_topic} copies on the topic, {repeats} of them repeats");
        drop(relay);
        drop(cluster); // nextest's per-test deadline guards against a hang here
    })
    .await
    .expect("timed out");
}

/// A broker whose acknowledgements take most of the send window (here 90%
/// of it): every record is still acknowledged and marked, and each slow
/// acknowledgement is counted (and logged, at most every ten seconds), so
/// the operator hears of it before acknowledgements outgrow the window and
/// every record is timed out and sent again. On librdkafka's mock cluster,
/// which adds the round trip.
#[sqlx::test(migrator = "MIGRATOR")]
async fn acknowledgements_that_near_the_send_window_are_counted(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
        let topic = unique("slow-acks");
        cluster.create_topic(&topic, 3, 1).unwrap();
        let jobs: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &jobs, 1, json!({})).await;
        let mut relay_settings = settings(&cluster.bootstrap_servers(), &topic, "slow");
        relay_settings.idempotence = false; // the mock checks no sequences
        relay_settings.lease = Duration::from_secs(6); // a window of 2 s
        let clock = Arc::new(ManualClock::new(Utc::now() + chrono::TimeDelta::seconds(1)));
        let relay = Relay::new(pool.clone(), clock, relay_settings).unwrap();
        // Metadata first, at full speed; then every answer takes 1.8 s.
        relay.drain_once().await.unwrap();
        assert_eq!(
            relay.publisher().slow_acks(),
            0,
            "fast acknowledgements are not slow"
        );
        insert_events(
            &pool,
            &(0..4).map(|_| Uuid::new_v4()).collect::<Vec<_>>(),
            1,
            json!({}),
        )
        .await;
        cluster
            .broker_round_trip_time(1, Duration::from_millis(1800))
            .unwrap();
        let report = relay.drain_once().await.unwrap();
        assert_eq!(report.published, 4, "{report:?}");
        assert_eq!(relay.publisher().slow_acks(), 4);
        drop(relay);
        drop(cluster);
    })
    .await
    .expect("timed out");
}
