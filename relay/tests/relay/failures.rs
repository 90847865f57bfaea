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
        let attempts: i32 = sqlx::query_scalar("SELECT max(attempts) FROM workflow_run_outbox")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(attempts, 0, "an outage of the broker spends no attempt");

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

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_row_the_broker_always_refuses_lands_failed_after_ten_attempts_without_blocking_others(
    pool: PgPool,
) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("events");
        create_topic(&topic, 3).await.unwrap();

        // Job `big`: its COMPLETED (sequence 2) is too large; a later event must wait for it.
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
        // Each job's first event goes; then the big one is the head of its job.
        assert_eq!(relay.drain_once().await.unwrap().published, 6);

        for attempt in 1..=10 {
            relay.drain_once().await.unwrap();
            let (status, attempts): (String, i32) =
                sqlx::query_as("SELECT status, attempts FROM workflow_run_outbox WHERE job_id = $1 AND sequence = 2")
                    .bind(big)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            assert_eq!(attempts, attempt);
            assert_eq!(status, if attempt < 10 { "PENDING" } else { "FAILED" });
            let later: String = sqlx::query_scalar("SELECT status FROM workflow_run_outbox WHERE job_id = $1 AND sequence = 3")
                .bind(big)
                .fetch_one(&pool)
                .await
                .unwrap();
            if attempt < 10 {
                assert_eq!(later, "PENDING", "a later event never overtakes one being retried");
            }
            clock.advance(Duration::from_secs(3600));
        }
        assert_eq!(count(&pool, "FAILED").await, 1);
        let error: String = sqlx::query_scalar("SELECT last_error FROM workflow_run_outbox WHERE status = 'FAILED'").fetch_one(&pool).await.unwrap();
        assert!(error.contains("too large"), "{error}");
        // Other jobs were never held up, and once the big one is dead-lettered its later event goes.
        relay.drain_once().await.unwrap();
        assert_eq!(count(&pool, "PUBLISHED").await, 12);
        let events = read_events(&bootstrap_servers(), &topic, 12).await;
        assert_eq!(sequences_by_job(&events)[&big], [1, 3], "the gap at 2 is visible through sequence");

        let mut conn = pool.acquire().await.unwrap();
        assert_eq!(outbox::relay::replay_failed(&mut conn, Some(big), Utc::now()).await.unwrap(), 1);
        assert_eq!(count(&pool, "PENDING").await, 1, "an operator puts it back");
    })
    .await
    .expect("timed out");
}

/// A produce request refused with a retriable error while the next request
/// (the job's next event) is accepted: a broker that does not enforce the
/// idempotent producer's sequence numbers (the mock cluster, some
/// Kafka-compatible servers) then appends the later event first. The relay
/// must not depend on that enforcement: a job's next event is sent only
/// after its previous one was acknowledged. On librdkafka's mock cluster,
/// which injects the refusal (and is such a broker).
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
/// timeout: the pass marks exactly what was acknowledged, spends no
/// attempt on what timed out, and the rows that timed out go again (a
/// repeat on the topic, never a sequence going back). On librdkafka's mock
/// cluster: two brokers, one of them slowed down by an added round trip.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_delivery_timeout_marks_only_what_was_acknowledged_and_spends_no_attempt(pool: PgPool) {
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
        insert_events(&pool, &jobs, 3, json!({})).await;
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
        let report = relay.drain_once().await.unwrap();
        assert_eq!(report.failed, 0, "{report:?}");
        assert_eq!(report.published + report.deferred, 24, "{report:?}");
        assert!(
            report.published > 0 && report.deferred > 0,
            "both brokers lead some jobs: {report:?}"
        );
        assert_eq!(
            report.misses,
            BTreeMap::from([((Class::World, Reason::Timeout), report.deferred)])
        );
        let marked: std::collections::BTreeSet<Uuid> = sqlx::query_scalar(
            "SELECT job_id FROM workflow_run_outbox WHERE sequence = 2 AND status = 'PUBLISHED'",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
        assert_eq!(marked.len(), report.published);
        let spent: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM workflow_run_outbox WHERE attempts > 0 OR last_error IS NOT NULL",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(spent, 0, "a timeout spends no attempt and records no error");

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
        let max_attempts: i32 = sqlx::query_scalar("SELECT max(attempts) FROM workflow_run_outbox")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(max_attempts, 0);

        let on_topic = copies_on_topic(&bootstrap, &topic, 2);
        let events = read_events(&bootstrap, &topic, on_topic).await;
        let on_broker_1: std::collections::BTreeSet<Uuid> = events
            .iter()
            .filter(|(partition, ..)| *partition == 0)
            .map(|(_, _, event, _)| event.job_id())
            .collect();
        assert_eq!(
            marked, on_broker_1,
            "marked in the slow pass: exactly the jobs whose broker acknowledged"
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
