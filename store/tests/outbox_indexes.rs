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

/// docs/operations.md, "Outbox rows reached by their key": the statements
/// that take the outbox back to what an earlier release expects.
#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn the_documented_rollback_gives_the_outbox_its_key_on_id_back(pool: PgPool) {
    for statement in [
        "CREATE UNIQUE INDEX CONCURRENTLY workflow_run_outbox_pkey ON workflow_run_outbox (id)",
        "ALTER TABLE workflow_run_outbox ADD CONSTRAINT workflow_run_outbox_pkey
             PRIMARY KEY USING INDEX workflow_run_outbox_pkey",
        "ALTER TABLE workflow_run_outbox RESET (fillfactor)",
    ] {
        sqlx::raw_sql(statement).execute(&pool).await.unwrap();
    }
    let forgotten = sqlx::raw_sql(
        "DELETE FROM _sqlx_migrations WHERE version IN (20261208000001, 20261208000002)",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(forgotten.rows_affected(), 2, "the two migrations' records");
    let (primary_key, options): (String, Option<Vec<String>>) = sqlx::query_as(
        "SELECT (SELECT a.attname::text FROM pg_index i
                 JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
                 WHERE i.indrelid = c.oid AND i.indisprimary),
                c.reloptions::text[]
         FROM pg_class c WHERE c.oid = 'workflow_run_outbox'::regclass",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(primary_key, "id");
    assert_eq!(options, None, "the fillfactor back to the default");
}
