//! Rows another version (or a bug) wrote: each is handled on its own, and
//! every other row is published.

use super::*;

/// Runs a relay `relay_id` on `topic` until no row is PENDING; a pass that
/// fails fails the test (one bad row must fail nothing else).
async fn drain_every_pending_row(pool: &PgPool, topic: &str, relay_id: &str) {
    let relay = Relay::new(
        pool.clone(),
        Arc::new(SystemClock),
        settings(&bootstrap_servers(), topic, relay_id),
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while count(pool, "PENDING").await > 0 {
        relay
            .drain_once()
            .await
            .expect("one bad row fails nothing else");
        assert!(
            tokio::time::Instant::now() < deadline,
            "rows stayed PENDING"
        );
    }
}

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
            "UPDATE workflow_run_outbox SET body = body || '{\"added_by_v2\": 1}'
             WHERE job_id = $1 AND sequence = 1",
        )
        .bind(jobs[0])
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query(
            "UPDATE workflow_run_outbox SET body = '{\"nonsense\": true}' WHERE job_id = $1 AND sequence = 1",
        )
        .bind(jobs[1])
        .execute(&pool)
        .await
        .unwrap();

        drain_every_pending_row(&pool, &topic, "tolerant").await;
        assert_eq!(count(&pool, "FAILED").await, 1);
        assert_eq!(count(&pool, "PUBLISHED").await, 7);
        let error: String = sqlx::query_scalar(
            "SELECT last_error FROM workflow_run_outbox_state WHERE status = 'FAILED' AND job_id = $1",
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

#[sqlx::test(migrator = "MIGRATOR")]
async fn an_earlier_writers_rows_holding_the_whole_event_publish_as_compact_ones_do(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("relay-forms");
        create_topic(&topic, 3).await.unwrap();
        let jobs = [Uuid::new_v4(), Uuid::new_v4()];
        insert_events(&pool, &jobs, 3, json!({"kept": null})).await;
        let mut conn = pool.acquire().await.unwrap();
        let mut written = Vec::new();
        for job in jobs {
            written.push(
                flotilla_store::outbox::events_of(&mut conn, job)
                    .await
                    .unwrap(),
            );
        }
        let compact: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM workflow_run_outbox
             WHERE payload IS NULL AND NOT body ?| array['event_id', 'job_id', 'sequence', 'type']",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(
            compact, 6,
            "this release writes bodies without the columns' fields"
        );
        // The second job's rows as a writer before compact bodies left them
        // (and as docs/operations.md's statement for going back puts them).
        sqlx::query(
            "UPDATE workflow_run_outbox SET body = NULL,
                 payload = body || jsonb_build_object('event_id', event_id, 'job_id', job_id,
                                                      'sequence', sequence, 'type', event_type)
             WHERE job_id = $1",
        )
        .bind(jobs[1])
        .execute(&pool)
        .await
        .unwrap();

        drain_every_pending_row(&pool, &topic, "forms").await;
        assert_eq!(count(&pool, "PUBLISHED").await, 6);
        let events = read_events(&bootstrap_servers(), &topic, 6).await;
        for (job, written) in jobs.iter().zip(&written) {
            let published: Vec<&WorkflowRunEvent> = events
                .iter()
                .map(|(_, _, event, _)| event)
                .filter(|event| event.job_id() == *job)
                .collect();
            assert_eq!(published, written.iter().collect::<Vec<_>>());
        }
    })
    .await
    .unwrap();
}
