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

/// docs/operations.md, "The outbox written once": the statements that give
/// the outbox back the layout of the release before, with each row's state.
#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn the_documented_rollback_gives_the_outbox_its_status_columns_back(pool: PgPool) {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/operations.md"
    ))
    .unwrap();
    let section = &doc[doc.find("### The outbox written once").unwrap()..];
    let start = section.find("```sql\n").unwrap() + "```sql\n".len();
    let statements = &section[start..start + section[start..].find("```").unwrap()];
    // Three rows, one per state; each statement its own transaction (a
    // snapshot does not see its own transaction's rows).
    for setup in [
        "INSERT INTO workflow_run_outbox (event_id, job_id, sequence, event_type, payload)
         SELECT gen_random_uuid(), gen_random_uuid(), 1, 'ACCEPTED', '{}' FROM generate_series(1, 2)",
        "UPDATE relay_bucket SET published = pg_current_snapshot()",
        "INSERT INTO workflow_run_outbox_failed (job_id, sequence, bucket, error)
         SELECT job_id, sequence, bucket, 'too large' FROM workflow_run_outbox LIMIT 1",
        "INSERT INTO workflow_run_outbox (event_id, job_id, sequence, event_type, payload)
         VALUES (gen_random_uuid(), gen_random_uuid(), 1, 'ACCEPTED', '{}')",
    ] {
        sqlx::query(setup).execute(&pool).await.unwrap();
    }
    sqlx::raw_sql(statements).execute(&pool).await.unwrap();
    let states: Vec<(String, Option<String>, bool)> = sqlx::query_as(
        "SELECT status, last_error, published_at IS NOT NULL FROM workflow_run_outbox ORDER BY status",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        states,
        [
            ("FAILED".to_owned(), Some("too large".to_owned()), false),
            ("PENDING".to_owned(), None, false),
            ("PUBLISHED".to_owned(), None, true),
        ]
    );
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
            "workflow_run_outbox_failed",
            "workflow_run_outbox_job_id_sequence_key",
            "workflow_run_outbox_pending",
            "workflow_run_outbox_published",
        ]
    );
    let recorded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE version = 20261213000001")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(recorded, 0);
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
