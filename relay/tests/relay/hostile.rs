//! Rows another version (or a bug) wrote: each is handled on its own, and
//! every other row is published.

use super::*;

#[sqlx::test(migrator = "MIGRATOR")]
async fn an_outbox_row_with_an_unknown_field_is_published_and_one_that_does_not_parse_lands_failed(
    pool: PgPool,
) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("relay-hostile");
        create_topic(&topic, 3).await.unwrap();
        let jobs: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &jobs, 2, json!({"ok": true})).await;
        // A newer writer added a field; something else wrote nonsense.
        sqlx::query(
            "UPDATE workflow_run_outbox SET payload = payload || '{\"added_by_v2\": 1}'
             WHERE job_id = $1 AND sequence = 1",
        )
        .bind(jobs[0])
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query(
            "UPDATE workflow_run_outbox SET payload = '{\"nonsense\": true}' WHERE job_id = $1 AND sequence = 1",
        )
        .bind(jobs[1])
        .execute(&pool)
        .await
        .unwrap();

        let relay = Relay::new(
            pool.clone(),
            Arc::new(SystemClock),
            settings(&bootstrap_servers(), &topic, "tolerant"),
        )
        .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while count(&pool, "PENDING").await > 0 {
            relay.drain_once().await.expect("one bad row fails nothing else");
            assert!(tokio::time::Instant::now() < deadline, "rows stayed PENDING");
        }
        assert_eq!(count(&pool, "FAILED").await, 1);
        assert_eq!(count(&pool, "PUBLISHED").await, 7);
        let error: String = sqlx::query_scalar(
            "SELECT last_error FROM workflow_run_outbox WHERE status = 'FAILED' AND job_id = $1",
        )
        .bind(jobs[1])
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(error.contains("does not decode"), "{error}");

        let events = read_events(&bootstrap_servers(), &topic, 7).await;
        let by_job = sequences_by_job(&events);
        assert_eq!(by_job[&jobs[0]], [1, 2], "the unknown field was dropped, the event published");
        assert_eq!(by_job[&jobs[1]], [2], "the broken row's successor still goes out");
        assert_eq!((by_job[&jobs[2]].len(), by_job[&jobs[3]].len()), (2, 2));
    })
    .await
    .expect("timed out");
}
