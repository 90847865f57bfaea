//! Consumer groups and outages: rebalances and a database outage lose nothing.

use super::*;

/// Drives a consumer by hand until `stop`: returns the partitions it persisted from.
async fn drive(
    consumer: flotilla_worker::consumer::RequestConsumer,
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
