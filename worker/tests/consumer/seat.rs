//! An outage longer than the poll interval: the consumer keeps polling with
//! its partitions paused, so it keeps its group seat, a member joining
//! meanwhile gets its share, and nothing is lost when the outage ends.

use super::*;

#[sqlx::test(migrator = "MIGRATOR")]
async fn an_outage_longer_than_the_poll_interval_keeps_the_consumer_in_its_group(pool: PgPool) {
    use sqlx::postgres::PgPoolOptions;
    within_deadline(async {
        let topics = topics().await;
        support::register_greet(&support::engine(&pool)).await;
        let options = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(1));
        let (proxy, proxied) = flotilla_tests::database::behind_proxy(&pool, options).await;
        let engine = support::engine(&proxied);
        let short_poll = |engine| {
            let mut settings = flotilla_worker::ingest::ConsumerSettings::new(
                flotilla_tests::broker(),
                &topics.requests,
                &topics.group,
            );
            settings.max_poll_interval = Some(Duration::from_secs(7));
            settings.outage_backoff_max = Duration::from_millis(500);
            flotilla_worker::ingest::RequestConsumer::subscribe(engine, support::codec(), settings)
                .unwrap()
        };
        let (stop_first, first) = spawn(short_poll(engine.clone()));
        let producer = producer();
        proxy.cut();
        for n in 0..30 {
            produce_request(
                &producer,
                &topics.requests,
                Uuid::new_v4(),
                json!({"name": format!("n{n}")}),
                false,
            )
            .await;
        }
        // A member joins while the first rides out the outage.
        let (stop_second, second) = spawn(short_poll(engine.clone()));
        // The outage lasts past the 7 s poll interval: that is the scenario.
        tokio::time::sleep(Duration::from_secs(12)).await;
        assert_eq!(count(&pool, "SELECT count(*) FROM workflow_run").await, 0);
        proxy.restore();
        wait_rows(&pool, 30).await;
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        stop_first.cancel();
        stop_second.cancel();
        let (first, second) = (first.await.unwrap(), second.await.unwrap());
        assert_eq!(
            first.poll_interval_exceeded, 0,
            "the first member kept its seat"
        );
        assert_eq!(
            second.poll_interval_exceeded, 0,
            "the second member kept its seat"
        );
    })
    .await;
}
