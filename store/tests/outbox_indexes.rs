//! The outbox's indexes. Rows are written once and never updated, so each
//! index costs one entry per row written: each must serve a statement that
//! needs it.

use sqlx::PgPool;

#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn every_index_of_the_outbox_serves_a_statement(pool: PgPool) {
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes
         WHERE schemaname = 'public' AND tablename = 'workflow_run_outbox' ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        indexes,
        [
            // The relay's batches (a range per bucket from its progress),
            // the rows of a page, retention's oldest published rows, the
            // backlog's count.
            "workflow_run_outbox_by_txid",
            // The key: one job's events in order (the timeline), one
            // sequence number per event of a job, the replay of a FAILED
            // row.
            "workflow_run_outbox_job_id_sequence_key",
        ]
    );
}

#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn the_outbox_is_filled_to_the_default_no_room_kept_for_marks(pool: PgPool) {
    let options: Option<Vec<String>> = sqlx::query_scalar(
        "SELECT c.reloptions::text[] FROM pg_class c WHERE c.oid = 'workflow_run_outbox'::regclass",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(options, None);
}
