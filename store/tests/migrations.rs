//! The migrations apply to a fresh database, and applying them again changes nothing.

use flotilla_store as store;
use sqlx::PgPool;

async fn applied(pool: &PgPool) -> Vec<(i64, Vec<u8>)> {
    sqlx::query_as("SELECT version, checksum FROM _sqlx_migrations ORDER BY version")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn migrations_apply_to_a_fresh_database_and_twice_is_a_no_op(pool: PgPool) {
    store::migrate(&pool).await.unwrap();
    let first = applied(&pool).await;
    assert_eq!(first.len(), store::MIGRATOR.iter().count());

    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables
         WHERE table_schema = 'public' AND table_name NOT LIKE '\\_sqlx%' ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        tables,
        [
            "consumer_offset",
            "dead_letter_tally",
            "event_topic",
            "finished_tally",
            "fleet_feature",
            "relay_bucket",
            "relay_member",
            "worker_member",
            "workflow_definition",
            "workflow_family",
            "workflow_run",
            "workflow_run_checkpoint",
            "workflow_run_outbox",
            "workflow_run_outbox_failed",
            "workflow_run_outbox_set_aside",
            // A view: each row's publication state.
            "workflow_run_outbox_state",
            "workflow_run_removed",
            "workflow_run_set_aside",
            "workflow_schedule",
            "workflow_step_request_outbox",
            "workflow_target_rate",
            "workflow_target_slot"
        ]
    );

    // The claim and the sweeper read partial indexes.
    let partial: Vec<String> = sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes
         WHERE schemaname = 'public' AND indexdef LIKE '% WHERE %' ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for index in [
        "workflow_run_claimable",
        "workflow_run_leased",
        "workflow_run_reply_deadline",
        "workflow_run_wake_at",
    ] {
        assert!(
            partial.iter().any(|i| i == index),
            "{index} missing from {partial:?}"
        );
    }

    store::migrate(&pool).await.unwrap();
    assert_eq!(applied(&pool).await, first, "a second run applies nothing");
}

#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn the_schema_refuses_states_outside_the_contract(pool: PgPool) {
    let insert = |status: &'static str| {
        sqlx::query(
            "INSERT INTO workflow_run (job_id, workflow_name, definition, input, request_digest, status, max_attempts)
             VALUES (gen_random_uuid(), 'w', '{}', '{}', 'd', $1, 3)",
        )
        .bind(status)
        .execute(&pool)
    };
    insert("QUEUED").await.unwrap();
    let err = insert("PAUSED").await.unwrap_err();
    assert!(err.to_string().contains("check constraint"), "{err}");
    // RUNNING without a lease token breaks the fencing invariant.
    let err = insert("RUNNING").await.unwrap_err();
    assert!(err.to_string().contains("check constraint"), "{err}");
    // A checkpoint row belongs to a run.
    let err = sqlx::query(
        "INSERT INTO workflow_run_checkpoint (job_id, event_sequence, entry)
         VALUES (gen_random_uuid(), 2, '{}')",
    )
    .execute(&pool)
    .await
    .unwrap_err();
    assert!(err.to_string().contains("foreign key"), "{err}");
}
