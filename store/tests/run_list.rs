//! The job list's status index: it holds only the statuses a job rests in,
//! so claims and completions never write to it, and every listing by status
//! still reaches its rows through an index, whatever plan the server picks.

use chrono::{DateTime, Utc};
use flotilla_store::RunStatus;
use flotilla_store::runs::{ListFilter, list, list_statement};
use sqlx::PgPool;
use uuid::Uuid;

mod support;
use support::prepared_plans;

/// `count` rows in `status`, one second apart in creation.
async fn rows(pool: &PgPool, status: RunStatus, count: i64) {
    let running = status == RunStatus::Running;
    sqlx::query(
        "INSERT INTO workflow_run (job_id, workflow_name, definition, input, request_digest, status,
                                   max_attempts, outstanding_step, lease_token, lease_until, created_at)
         SELECT gen_random_uuid(), 'bench', '{}', '{}', 'd', $1, 3,
                CASE WHEN $1 = 'WAITING' THEN 'approve' END,
                CASE WHEN $2 THEN gen_random_uuid() END,
                CASE WHEN $2 THEN now() + interval '1 minute' END,
                now() - n * interval '1 second'
         FROM generate_series(1, $3) n",
    )
    .bind(status)
    .bind(running)
    .bind(count)
    .execute(pool)
    .await
    .unwrap();
}

async fn index_bytes(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT pg_relation_size('workflow_run_by_resting_status')")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn claims_and_completions_add_nothing_to_the_status_index(pool: PgPool) {
    rows(&pool, RunStatus::Queued, 5000).await;
    let before = index_bytes(&pool).await;
    // Each row claimed, then completed: two updates that are never HOT.
    sqlx::query(
        "UPDATE workflow_run SET status = 'RUNNING', lease_token = gen_random_uuid(),
                lease_until = now() + interval '1 minute'",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE workflow_run SET status = 'COMPLETED', lease_token = NULL, lease_until = NULL",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(
        index_bytes(&pool).await,
        before,
        "10,000 updates into RUNNING and COMPLETED wrote no entry"
    );
    // A job parked on a human step does enter it: the list finds it there.
    sqlx::query(
        "UPDATE workflow_run SET status = 'WAITING', outstanding_step = 'approve'
         WHERE job_id = (SELECT job_id FROM workflow_run LIMIT 1)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let filter = ListFilter {
        status: Some(RunStatus::Waiting),
        ..ListFilter::default()
    };
    assert_eq!(list(&mut conn, &filter, 10).await.unwrap().len(), 1);
}

/// The plans of a listing by `status`, with or without a page cursor.
async fn plans(
    pool: &PgPool,
    status: RunStatus,
    cursor: Option<(DateTime<Utc>, Uuid)>,
) -> [(&'static str, String); 2] {
    let filter = ListFilter {
        status: Some(status),
        before: cursor,
        ..ListFilter::default()
    };
    let mut arguments: Vec<String> = cursor
        .map(|(at, job_id)| {
            vec![
                format!("'{}'::timestamptz", at.to_rfc3339()),
                format!("'{job_id}'::uuid"),
            ]
        })
        .unwrap_or_default();
    arguments.push("50".into());
    let statement = list_statement(&filter, 50);
    let mut tx = pool.begin().await.unwrap();
    prepared_plans(&mut tx, statement.sql(), &arguments.join(", ")).await
}

#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn every_listing_by_status_reads_an_index_even_with_a_generic_plan(pool: PgPool) {
    // The shape of a busy fleet's table: mostly history, a little of the rest.
    rows(&pool, RunStatus::Completed, 20_000).await;
    for status in [
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::Waiting,
        RunStatus::Failed,
        RunStatus::Dead,
        RunStatus::Cancelled,
    ] {
        rows(&pool, status, 40).await;
    }
    sqlx::query("ANALYZE workflow_run")
        .execute(&pool)
        .await
        .unwrap();
    let cursor = Some((Utc::now(), Uuid::max()));
    for &status in RunStatus::ALL {
        for page in [None, cursor] {
            for (mode, plan) in plans(&pool, status, page).await {
                assert!(
                    !plan.contains("Seq Scan"),
                    "{mode} {status}: no table scan:\n{plan}"
                );
                let resting = !matches!(status, RunStatus::Running | RunStatus::Completed);
                if resting {
                    assert!(
                        plan.contains("workflow_run_by_resting_status"),
                        "{mode} {status}: the partial status index:\n{plan}"
                    );
                }
            }
        }
    }
}
