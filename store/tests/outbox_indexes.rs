//! The outbox's indexes. Marking a row PUBLISHED changes its status, which
//! the partial indexes name, so no mark is a HOT update: every index of the
//! table takes an entry for every row marked, besides the one for the row
//! written. Each index must therefore serve a statement that needs it.

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
            // The operator's count and replay of FAILED rows.
            "workflow_run_outbox_failed",
            // The key: one job's events in order (the timeline), one
            // sequence number per event of a job, and the row a mark, a
            // failure or retention's delete reaches. No index on `id`:
            // it would take an entry for every row written and another
            // for every mark, for no statement the key cannot serve.
            "workflow_run_outbox_job_id_sequence_key",
            // The relay's read of the heads of its buckets.
            "workflow_run_outbox_pending",
            // Retention, oldest published first.
            "workflow_run_outbox_published",
        ]
    );
}
