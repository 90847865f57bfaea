//! Retention of published rows.

use super::*;

/// Every row committed so far counts as published: each bucket's progress
/// moves to a snapshot taken now.
async fn publish_everything(pool: &PgPool) {
    sqlx::query("UPDATE relay_bucket SET published = pg_current_snapshot()")
        .execute(pool)
        .await
        .unwrap();
}

async fn written_at(pool: &PgPool, job: Uuid, at: chrono::DateTime<Utc>) {
    sqlx::query("UPDATE workflow_run_outbox SET created_at = $2 WHERE job_id = $1")
        .bind(job)
        .bind(at)
        .execute(pool)
        .await
        .unwrap();
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn retention_deletes_only_old_published_rows(pool: PgPool) {
    let jobs: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
    insert_events(&pool, &jobs[..3], 1, json!({})).await;
    let now = Utc::now();
    let old = now - chrono::TimeDelta::days(8);
    written_at(&pool, jobs[0], old).await;
    written_at(&pool, jobs[1], now - chrono::TimeDelta::days(6)).await;
    written_at(&pool, jobs[2], old).await;
    publish_everything(&pool).await;
    sqlx::query(
        "INSERT INTO workflow_run_outbox_failed (job_id, sequence, bucket, error)
         SELECT job_id, sequence, bucket, 'refused' FROM workflow_run_outbox WHERE job_id = $1",
    )
    .bind(jobs[2])
    .execute(&pool)
    .await
    .unwrap();
    // jobs[3] is written after the progress moved: PENDING, however old.
    insert_events(&pool, &jobs[3..], 1, json!({})).await;
    written_at(&pool, jobs[3], old).await;
    assert_eq!(count(&pool, "PENDING").await, 1);
    let mut relay_settings = settings("127.0.0.1:1", "unused", "janitor");
    relay_settings.retention_batch = 1;
    let relay = Relay::new(
        pool.clone(),
        Arc::new(ManualClock::new(now)),
        relay_settings,
    )
    .unwrap();
    assert_eq!(relay.apply_retention().await.unwrap(), 1);
    let left: Vec<Uuid> = sqlx::query_scalar("SELECT job_id FROM workflow_run_outbox ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, &jobs[1..]);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn retention_runs_on_one_relay_at_a_time(pool: PgPool) {
    let jobs: Vec<Uuid> = (0..3).map(|_| Uuid::new_v4()).collect();
    insert_events(&pool, &jobs, 1, json!({})).await;
    sqlx::query("UPDATE workflow_run_outbox SET created_at = now() - interval '30 days'")
        .execute(&pool)
        .await
        .unwrap();
    publish_everything(&pool).await;
    let relay = Relay::new(
        pool.clone(),
        Arc::new(SystemClock),
        settings("127.0.0.1:1", "unused", "janitor"),
    )
    .unwrap();
    // Another relay is pruning right now: it holds the retention lock.
    let mut other = pool.begin().await.unwrap();
    let held: bool = sqlx::query_scalar(
        "SELECT pg_try_advisory_xact_lock(hashtext('flotilla:outbox-retention'))",
    )
    .fetch_one(&mut *other)
    .await
    .unwrap();
    assert!(held);
    assert_eq!(
        relay.apply_retention().await.unwrap(),
        0,
        "it leaves the work to the holder"
    );
    other.rollback().await.unwrap();
    assert_eq!(relay.apply_retention().await.unwrap(), 3);
}
