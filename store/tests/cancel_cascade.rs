//! The cancel cascade's list of what is left to do leaves out the running
//! children already asked to cancel (their holders honour the ask, or the
//! sweeper does when their leases lapse), so a queued orphan behind
//! many of them is still reached (review L6).

use flotilla_store::runs::children::orphaned_by_cancel;
use sqlx::PgPool;
use uuid::Uuid;

#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn children_already_asked_to_cancel_do_not_fill_the_cascades_pass(pool: PgPool) {
    let parent = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO workflow_run (job_id, workflow_name, definition, input, request_digest, status, max_attempts)
         VALUES ($1, 'p', '{}', '{}', 'd', 'CANCELLED', 3)",
    )
    .bind(parent)
    .execute(&pool)
    .await
    .unwrap();
    // 80 running children, each already asked, older than the queued one.
    sqlx::query(
        "INSERT INTO workflow_run (job_id, workflow_name, definition, input, request_digest, status,
                                   max_attempts, parent_job_id, parent_step, depth, cancel_with_parent,
                                   lease_token, lease_until, cancel_requested, updated_at)
         SELECT gen_random_uuid(), 'c', '{}', '{}', 'd', 'RUNNING', 3, $1, 's' || n, 1, true,
                gen_random_uuid(), now() + interval '1 minute', 'parent cancelled',
                now() - interval '1 hour'
         FROM generate_series(1, 80) n",
    )
    .bind(parent)
    .execute(&pool)
    .await
    .unwrap();
    let queued = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO workflow_run (job_id, workflow_name, definition, input, request_digest, status,
                                   max_attempts, parent_job_id, parent_step, depth, cancel_with_parent)
         VALUES ($1, 'c', '{}', '{}', 'd', 'QUEUED', 3, $2, 'last', 1, true)",
    )
    .bind(queued)
    .bind(parent)
    .execute(&pool)
    .await
    .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let left = orphaned_by_cancel(&mut conn, 64).await.unwrap();
    assert_eq!(
        left,
        [(queued, parent, flotilla_store::RunStatus::Cancelled)]
    );
}
