//! Checkpoints kept as rows of their own (`checkpoint_rows`): a step's write
//! never rewrites the steps before it, reads still see one ordered list,
//! and a job keeps its order across the setting being turned on or off.

use flotilla_store::RunStatus;
use flotilla_worker::engine::{CompleteOutcome, Engine, Outcome};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{Calls, approval_engine, row, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// What the run row itself holds in its `checkpoints` column.
async fn in_row(pool: &PgPool, job_id: Uuid) -> Value {
    sqlx::query_scalar("SELECT checkpoints FROM workflow_run WHERE job_id = $1")
        .bind(job_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The job's checkpoint rows as (step, transaction that wrote the row), in order.
async fn checkpoint_rows(pool: &PgPool, job_id: Uuid) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT entry->>'name', xmin::text FROM workflow_run_checkpoint
         WHERE job_id = $1 ORDER BY event_sequence",
    )
    .bind(job_id)
    .fetch_all(pool)
    .await
    .unwrap()
}

fn names(checkpoints: &Value) -> Vec<&str> {
    checkpoints
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect()
}

fn approved() -> Value {
    json!({"approved": true, "by": "ada"})
}

async fn answer(engine: &Engine, job_id: Uuid) {
    let outcome = engine
        .complete_step(job_id, "approve", approved())
        .await
        .unwrap();
    assert_eq!(outcome, CompleteOutcome::Completed);
}

/// A job whose first step and parking are `begin`'s, and whose answer and
/// last step are `finish`'s; checks it reads back whole and in order.
async fn begun_by_and_finished_by(pool: &PgPool, begin: &Engine, finish: &Engine) -> Uuid {
    let job_id = submit(begin, "approval", json!({})).await;
    assert_eq!(begin.run_once().await.unwrap(), Outcome::Parked(job_id));
    answer(finish, job_id).await;
    assert_eq!(finish.run_once().await.unwrap(), Outcome::Completed(job_id));
    let read = row(pool, job_id).await;
    assert_eq!(names(&read.checkpoints.0), ["prepare", "approve", "notify"]);
    assert_eq!(read.result.unwrap().0["request"], json!({"by": "ada"}));
    job_id
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn each_checkpoint_is_written_once_and_never_rewritten_by_later_steps(pool: PgPool) {
    let calls = Calls::default();
    let engine = approval_engine(&pool, &calls, true).await;
    let job_id = submit(&engine, "approval", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    let first = checkpoint_rows(&pool, job_id).await;
    assert_eq!(first.len(), 1, "{first:?}");

    answer(&engine, job_id).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));

    let rows = checkpoint_rows(&pool, job_id).await;
    let steps: Vec<&str> = rows.iter().map(|(step, _)| step.as_str()).collect();
    assert_eq!(steps, ["prepare", "approve", "notify"]);
    assert_eq!(
        rows[0], first[0],
        "the first checkpoint's row is the one its own step wrote"
    );
    assert_eq!(
        in_row(&pool, job_id).await,
        json!([]),
        "the run row carries none of them"
    );

    let read = row(&pool, job_id).await;
    assert_eq!(read.status, RunStatus::Completed);
    assert_eq!(names(&read.checkpoints.0), ["prepare", "approve", "notify"]);
    assert_eq!(read.checkpoints.0[1]["response"], approved());
    assert_eq!(read.result.unwrap().0["request"], json!({"by": "ada"}));
    assert_eq!(calls.of(job_id), ["prepare", "notify"]);

    // The statement docs/operations.md gives for a rollback to a release
    // that reads only the row's array.
    sqlx::query(
        "WITH moved AS (DELETE FROM workflow_run_checkpoint RETURNING job_id, event_sequence, entry)
         UPDATE workflow_run r SET checkpoints = r.checkpoints || m.entries, has_checkpoint_rows = false,
             reader_level = CASE WHEN r.definition IS NULL THEN 1 ELSE 0 END
         FROM (SELECT job_id, jsonb_agg(entry ORDER BY event_sequence) AS entries
               FROM moved GROUP BY job_id) m
         WHERE r.job_id = m.job_id",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(
        names(&in_row(&pool, job_id).await),
        ["prepare", "approve", "notify"]
    );
    assert!(checkpoint_rows(&pool, job_id).await.is_empty());
    let folded = row(&pool, job_id).await;
    assert_eq!(folded.checkpoints.0, read.checkpoints.0);
    assert_eq!(
        folded.reader_level, 0,
        "an earlier release may claim it again"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_keeps_its_order_when_the_setting_changes_under_it(pool: PgPool) {
    let calls = Calls::default();
    let in_rows = approval_engine(&pool, &calls, true).await;
    let in_array = approval_engine(&pool, &calls, false).await;

    // Begun in the row's array, finished in rows of their own.
    let moved_out = begun_by_and_finished_by(&pool, &in_array, &in_rows).await;
    assert_eq!(names(&in_row(&pool, moved_out).await), ["prepare"]);

    // Begun in rows of their own, then the setting turned off: the job
    // stays in its rows, so nothing lands in the array out of order.
    let stays_out = begun_by_and_finished_by(&pool, &in_rows, &in_array).await;
    assert_eq!(in_row(&pool, stays_out).await, json!([]));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_checkpoint_row_another_writer_broke_fails_its_job_alone(pool: PgPool) {
    let calls = Calls::default();
    let engine = approval_engine(&pool, &calls, true).await;
    let broken = submit(&engine, "approval", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(broken));
    sqlx::query(
        "UPDATE workflow_run_checkpoint SET entry = '{\"name\": \"prepare\", \"extra\": 1}'
         WHERE job_id = $1",
    )
    .bind(broken)
    .execute(&pool)
    .await
    .unwrap();
    answer(&engine, broken).await;
    let good = submit(&engine, "approval", json!({})).await;

    let mut outcomes = vec![
        engine.run_once().await.unwrap(),
        engine.run_once().await.unwrap(),
    ];
    outcomes.sort_by_key(|outcome| format!("{outcome:?}"));
    assert_eq!(outcomes, [Outcome::Failed(broken), Outcome::Parked(good)]);
    let failed = row(&pool, broken).await;
    assert!(
        failed
            .error
            .as_deref()
            .unwrap()
            .contains("checkpoint 0 is malformed"),
        "{:?}",
        failed.error
    );
}
