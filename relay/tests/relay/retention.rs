//! Retention of published rows.

use super::*;

#[sqlx::test(migrator = "MIGRATOR")]
async fn retention_deletes_only_old_published_rows(pool: PgPool) {
    let jobs: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
    insert_events(&pool, &jobs, 1, json!({})).await;
    let now = Utc::now();
    let old = now - chrono::TimeDelta::days(8);
    let set = |job: Uuid, status: &'static str, published_at: Option<chrono::DateTime<Utc>>| {
        sqlx::query(
            "UPDATE workflow_run_outbox SET status = $2, published_at = $3 WHERE job_id = $1",
        )
        .bind(job)
        .bind(status)
        .bind(published_at)
        .execute(&pool)
    };
    set(jobs[0], "PUBLISHED", Some(old)).await.unwrap();
    set(jobs[1], "PUBLISHED", Some(now - chrono::TimeDelta::days(6)))
        .await
        .unwrap();
    set(jobs[2], "FAILED", Some(old)).await.unwrap();
    // jobs[3] stays PENDING.
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
    sqlx::query("UPDATE workflow_run_outbox SET status = 'PUBLISHED', published_at = now() - interval '30 days'")
        .execute(&pool)
        .await
        .unwrap();
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
