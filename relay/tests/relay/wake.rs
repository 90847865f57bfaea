//! An idle relay publishes a worker's events when the worker rings
//! (`flotilla_store::wake`), not at its next poll.

use flotilla_store::wake::{Channel, Doorbell};

use super::*;

/// The relay polls once an hour here: once it has read twice (at its start,
/// and again when its listener came up) and found nothing, only the ring
/// can bring the event out within the test's time.
#[sqlx::test(migrator = "MIGRATOR")]
async fn an_idle_relay_publishes_at_once_when_a_worker_rings(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("woken");
        create_topic(&topic, 1).await.unwrap();
        let mut settings = settings(&bootstrap_servers(), &topic, "woken");
        settings.idle_poll_min = Duration::from_secs(3600);
        settings.idle_poll_max = Duration::from_secs(3600);
        let relay = Relay::new(pool.clone(), Arc::new(SystemClock), settings).unwrap();
        let stop = CancellationToken::new();
        let running = tokio::spawn({
            let (relay, stop) = (relay.clone(), stop.clone());
            async move { relay.run(stop, Duration::from_secs(5)).await }
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let listening: bool = sqlx::query_scalar(
                "SELECT count(*) > 0 FROM pg_stat_activity
                 WHERE datname = current_database() AND query ILIKE 'LISTEN%flotilla_outbox%'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            if listening && relay.reads_answered() >= 2 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the relay never listened and went idle"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        let job = Uuid::new_v4();
        insert_events(&pool, &[job], 1, json!({})).await;
        let doorbell = Doorbell::new(pool.clone());
        doorbell.ring(Channel::Outbox);
        let events = read_events(&bootstrap_servers(), &topic, 1).await;
        assert_eq!(events[0].2.job_id(), job);
        drop(doorbell);
        stop.cancel();
        running.await.unwrap();
    })
    .await
    .expect("the test timed out");
}
