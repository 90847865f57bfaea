//! A run whose stored checkpoints are past what Postgres can put in one
//! jsonb value (a 256 MB container) cannot have its list read. That run
//! alone must suffer: claiming it, and every other run beside it, goes on.
//! Rows like it are written by older releases, which had no bound on a
//! job's stored answers, or by hand.

use chrono::Utc;
use flotilla_store::runs::lease;
use sqlx::PgPool;
use uuid::Uuid;

/// A QUEUED run created `age_s` seconds ago that keeps its checkpoints as
/// rows: `pages` of them, each a 10 MiB answer.
async fn run_with_checkpoints(pool: &PgPool, age_s: i64, pages: i64) -> Uuid {
    let job_id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO workflow_run (job_id, workflow_name, definition, input, request_digest,
                                   status, max_attempts, has_checkpoint_rows, reader_level,
                                   event_sequence, created_at, run_after)
         VALUES ($1, 'export', '{}', '{}', 'd', 'QUEUED', 3, true, 1, $2,
                 now() - $3 * interval '1 second', now() - $3 * interval '1 second')",
    )
    .bind(job_id)
    .bind(pages + 1)
    .bind(age_s)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO workflow_run_checkpoint (job_id, event_sequence, entry)
         SELECT $1, n, jsonb_build_object('name', 'page', 'skipped', false,
                                          'response', repeat('x', 10 * 1024 * 1024))
         FROM generate_series(1, $2) n",
    )
    .bind(job_id)
    .bind(pages)
    .execute(pool)
    .await
    .unwrap();
    job_id
}

#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn a_run_whose_checkpoints_cannot_be_read_does_not_stop_claims(pool: PgPool) {
    // 27 answers of 10 MiB: 270 MiB, past the 256 MB a jsonb value holds.
    let oversized = run_with_checkpoints(&pool, 60, 27).await;
    let good = run_with_checkpoints(&pool, 30, 2).await;
    let mut conn = pool.acquire().await.unwrap();
    let now = Utc::now();
    let claimed = lease::claim(&mut conn, "w", now, now + chrono::Duration::seconds(20), 2)
        .await
        .expect("one run's checkpoints failed the whole claim");
    assert_eq!(claimed.len(), 2);
    let bad = claimed.iter().find(|row| row.job_id == oversized).unwrap();
    let why = bad
        .unreadable
        .as_deref()
        .expect("the oversized run is not marked unreadable");
    assert!(why.contains("exceeds the maximum"), "{why}");
    let fine = claimed.iter().find(|row| row.job_id == good).unwrap();
    assert!(fine.unreadable.is_none());
    assert_eq!(fine.checkpoints.0.as_array().map(Vec::len), Some(2));
}
