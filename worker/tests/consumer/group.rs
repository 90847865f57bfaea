//! Consumer groups and outages: rebalances and a database outage lose nothing.

use super::*;

/// Drives a consumer by hand until `stop`: returns the partitions it persisted from.
async fn drive(
    consumer: flotilla_worker::ingest::RequestConsumer,
    stop: CancellationToken,
) -> HashSet<i32> {
    use rdkafka::Message as _;
    let mut partitions = HashSet::new();
    while let Some(batch) = consumer.next_batch(&stop).await {
        consumer.persist(&batch).await.unwrap();
        consumer.commit(&batch);
        partitions.extend(batch.iter().map(|m| m.partition()));
    }
    consumer.close();
    partitions
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn consumers_in_one_group_split_partitions_and_a_joining_one_rebalances_without_loss(
    pool: PgPool,
) {
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let producer = producer();
        let stop = CancellationToken::new();
        let first = tokio::spawn(drive(support::consumer(&engine, &topics), stop.clone()));
        let second = tokio::spawn(drive(support::consumer(&engine, &topics), stop.clone()));
        // Both have their share before the first requests: a member that
        // joined late would find them consumed already.
        support::wait_members(&topics.group, 2).await;
        for n in 0..300 {
            produce_request(
                &producer,
                &topics.requests,
                Uuid::new_v4(),
                json!({"name": format!("a{n}")}),
                n % 2 == 0,
            )
            .await;
        }
        wait_rows(&pool, 300).await;
        let third = tokio::spawn(drive(support::consumer(&engine, &topics), stop.clone()));
        for n in 0..300 {
            produce_request(
                &producer,
                &topics.requests,
                Uuid::new_v4(),
                json!({"name": format!("b{n}")}),
                n % 2 == 1,
            )
            .await;
        }
        wait_rows(&pool, 600).await;
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        stop.cancel();
        let first = first.await.unwrap();
        let second = second.await.unwrap();
        let third = third.await.unwrap();

        assert!(
            !first.is_empty() && !second.is_empty(),
            "both first members got partitions: {first:?} {second:?}"
        );
        let all: HashSet<i32> = first.iter().chain(&second).chain(&third).copied().collect();
        assert_eq!(
            all.len(),
            support::PARTITIONS as usize,
            "every partition was consumed"
        );
        assert_eq!(count(&pool, "SELECT count(*) FROM workflow_run").await, 600);
        assert_eq!(
            count(
                &pool,
                "SELECT count(*) FROM workflow_run_outbox WHERE event_type = 'ACCEPTED'"
            )
            .await,
            600,
            "one ACCEPTED event per job: no duplicate submissions"
        );
    })
    .await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_database_outage_pauses_ingestion_commits_nothing_undurable_and_loses_nothing(
    pool: PgPool,
) {
    use sqlx::postgres::PgPoolOptions;
    within_deadline(async {
        let topics = topics().await;
        support::register_greet(&support::engine(&pool)).await;
        let options = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(1));
        let (proxy, proxied) = flotilla_tests::database::behind_proxy(&pool, options).await;
        let engine = support::engine(&proxied);
        let producer = producer();
        let (stop, handle) = spawn(support::consumer(&engine, &topics));
        for n in 0..50 {
            produce_request(
                &producer,
                &topics.requests,
                Uuid::new_v4(),
                json!({"name": format!("before{n}")}),
                n % 2 == 0,
            )
            .await;
        }
        wait_rows(&pool, 50).await;
        support::wait_committed_to_end(&topics.requests, &topics.group).await;

        proxy.cut();
        for n in 0..50 {
            produce_request(
                &producer,
                &topics.requests,
                Uuid::new_v4(),
                json!({"name": format!("during{n}")}),
                n % 2 == 1,
            )
            .await;
        }
        // While the database is unreachable, offsets never pass what is durable.
        let outage_end = tokio::time::Instant::now() + Duration::from_secs(3);
        while tokio::time::Instant::now() < outage_end {
            let (t, g) = (topics.requests.clone(), topics.group.clone());
            let committed: i64 =
                tokio::task::spawn_blocking(move || support::committed_and_end(&t, &g))
                    .await
                    .unwrap()
                    .iter()
                    .map(|(committed, _)| committed)
                    .sum();
            assert_eq!(
                committed, 50,
                "an offset was committed for a row that is not durable"
            );
            assert_eq!(count(&pool, "SELECT count(*) FROM workflow_run").await, 50);
            tokio::time::sleep(Duration::from_millis(250)).await;
        }

        proxy.restore();
        wait_rows(&pool, 100).await;
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        stop.cancel();
        handle.await.unwrap();
        assert_eq!(
            count(
                &pool,
                "SELECT count(*) FROM workflow_run_outbox WHERE event_type = 'ACCEPTED'"
            )
            .await,
            100
        );
    })
    .await;
}

/// A consumer whose `group.instance.id` another live member took (two
/// workers given one id) is fenced by the broker (FENCED_INSTANCE_ID): it
/// stops for good and says so, its task dead in the health that readiness
/// reads, naming the duplicate id.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_consumer_fenced_by_a_second_member_with_its_instance_id_is_a_dead_task(pool: PgPool) {
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let instance = flotilla_tests::unique("twin");
        let mut settings = flotilla_worker::ingest::ConsumerSettings::new(
            flotilla_tests::broker(),
            &topics.requests,
            &topics.group,
        );
        settings.group_instance_id = Some(instance.clone());
        let consumer = flotilla_worker::ingest::RequestConsumer::subscribe(
            engine.clone(),
            support::codec(),
            settings,
        )
        .unwrap();
        let (stop, handle) = spawn(consumer);
        // The first member holds the partitions once a request became a row.
        let producer = support::producer();
        support::produce_request(
            &producer,
            &topics.requests,
            Uuid::new_v4(),
            json!({"name": "a"}),
            false,
        )
        .await;
        wait_rows(&pool, 1).await;

        // A second process joins with the same instance id (polled on a
        // thread of its own): the broker hands it the first member's seat
        // and fences the first.
        let twin: BaseConsumer = flotilla_tests::manual_commit_consumer_config(&topics.group)
            .set("group.instance.id", &instance)
            // The group's assignor: a member offering none in common is
            // refused before it could take a seat.
            .set("partition.assignment.strategy", "cooperative-sticky")
            .create()
            .unwrap();
        twin.subscribe(&[&topics.requests]).unwrap();
        let twin_stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let twin_thread = {
            let stop = twin_stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let _ = twin.poll(Duration::from_millis(100));
                }
                twin
            })
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let problems = loop {
            let problems = engine.health().problems();
            if !problems.is_empty() {
                break problems;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the consumer never said it was fenced"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            problems
                .iter()
                .any(|p| p.contains(&format!("\"{instance}\"")) && p.contains("group.instance.id")),
            "{problems:?}"
        );
        stop.cancel();
        handle.await.unwrap();
        twin_stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let twin = twin_thread.join().unwrap();
        std::thread::spawn(move || drop(twin));
    })
    .await;
}

/// An offset commit the broker refuses (here REBALANCE_IN_PROGRESS, which a
/// real group answers while a paused member rejoins) is made again even when
/// no request follows it: otherwise the durable offset stays behind until the
/// next request arrives, and a quiet partition shows lag for good. On
/// librdkafka's mock cluster, which injects the refusal.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_refused_offset_commit_is_made_again_without_a_new_request(pool: PgPool) {
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    within_deadline(async {
        let mock = support::MockTopics::new("refused-commit");
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let settings = mock.settings();
        let group = settings.group.clone();
        let consumer =
            flotilla_worker::ingest::RequestConsumer::subscribe(engine, support::codec(), settings)
                .unwrap();
        let (stop, handle) = spawn(consumer);
        // The first commit request is the batch's own (with nothing stored
        // the client sends none).
        mock.cluster.request_errors(
            RDKafkaApiKey::OffsetCommit,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS],
        );
        let producer: rdkafka::producer::FutureProducer =
            mock.broker().idempotent_producer().create().unwrap();
        produce_request(
            &producer,
            &mock.requests,
            Uuid::new_v4(),
            json!({"name": "once"}),
            false,
        )
        .await;
        wait_rows(&pool, 1).await;

        let reader: BaseConsumer = mock
            .broker()
            .manual_commit_consumer(&group)
            .create()
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let mut partitions = rdkafka::TopicPartitionList::new();
            partitions.add_partition(&mock.requests, 0);
            let committed = reader
                .committed_offsets(partitions, Duration::from_secs(5))
                .unwrap();
            let at = committed
                .find_partition(&mock.requests, 0)
                .map(|entry| entry.offset());
            if at == Some(rdkafka::Offset::Offset(1)) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the refused commit was never made again: committed {at:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        stop.cancel();
        handle.await.unwrap();
        std::thread::spawn(move || drop(reader));
        drop(mock);
    })
    .await;
}
