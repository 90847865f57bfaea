//! A job's stored answers are bounded (review H3): a paged step fetches at
//! most `max_pages` pages, the job's checkpoints take at most
//! `FLOTILLA_MAX_STORED_BYTES`, each crossing is the job's verdict naming
//! the bound, and a row stored past what Postgres can read (by a release
//! without these bounds) fails alone while claims go on for the others.

use std::sync::{Arc, Mutex};

use flotilla_store::RunStatus;
use flotilla_worker::engine::{Engine, Outcome};
use flotilla_worker::targets::{FnTarget, StepFailure, TargetCall, Targets};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{manual_clock, row, settings, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// A target `endless` whose every page says there is more, recording each
/// cursor it was given; and `big`, which answers `bytes` bytes.
fn targets(cursors: Arc<Mutex<Vec<Value>>>, bytes: usize) -> Targets {
    let mut targets = Targets::default();
    targets.register(
        "endless",
        Arc::new(FnTarget(move |call: TargetCall| {
            let cursor = call.request["cursor"].clone();
            cursors.lock().unwrap().push(cursor.clone());
            let next = cursor.as_u64().unwrap_or(0) + 1;
            async move { Ok::<_, StepFailure>(json!({"more": true, "cursor": next})) }
        })),
        8,
    );
    targets.register(
        "big",
        Arc::new(FnTarget(move |_call: TargetCall| async move {
            Ok::<_, StepFailure>(json!({"blob": "x".repeat(bytes)}))
        })),
        8,
    );
    targets
}

fn engine_with(pool: &PgPool, targets: Targets, max_stored_bytes: u64) -> Engine {
    let mut settings = settings("w");
    settings.max_stored_bytes = max_stored_bytes;
    Engine::new(pool.clone(), targets, manual_clock(), settings)
}

/// The bytes a job's checkpoint list takes as JSON text.
async fn stored_bytes(pool: &PgPool, job_id: Uuid) -> usize {
    serde_json::to_vec(&row(pool, job_id).await.checkpoints.0)
        .unwrap()
        .len()
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_paged_step_whose_target_always_says_more_ends_at_max_pages_with_a_verdict(pool: PgPool) {
    let cursors = Arc::new(Mutex::new(Vec::new()));
    let engine = engine_with(&pool, targets(cursors.clone(), 0), 64 * 1024 * 1024);
    engine
        .register_workflow(&json!({
            "name": "export", "input_schema": {},
            "steps": [{"name": "pages", "target": "endless", "method": "page", "paged": true,
                       "max_pages": 5, "rules": ["cursor = cursor"]}]
        }))
        .await
        .unwrap();
    let job_id = submit(&engine, "export", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
    assert_eq!(
        *cursors.lock().unwrap(),
        [json!(null), json!(1), json!(2), json!(3), json!(4)],
        "five pages fetched, no sixth"
    );
    let failed = row(&pool, job_id).await;
    assert_eq!(failed.status, RunStatus::Failed);
    let error = failed.error.unwrap_or_default();
    assert!(
        error.contains("page 4 says more: true, but the step fetches at most 5 pages"),
        "{error}"
    );
    assert_eq!(failed.verdict.as_deref(), Some("max_pages: 5"));
    let pages = failed.checkpoints.0.as_array().map_or(0, Vec::len);
    assert_eq!(
        pages, 4,
        "the cursors of pages 0 to 3 were stored, not the fifth"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_paged_step_may_not_ask_for_more_pages_than_the_bound(pool: PgPool) {
    let engine = engine_with(&pool, Targets::default(), 64 * 1024 * 1024);
    let refused = engine
        .register_workflow(&json!({
            "name": "export", "input_schema": {},
            "steps": [{"name": "pages", "target": "endless", "method": "page", "paged": true,
                       "max_pages": 2_000_000}]
        }))
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("must be 1 to 1000000"), "{refused}");
    let refused = engine
        .register_workflow(&json!({
            "name": "flat", "input_schema": {}, "max_attempts": 1000, "deadline_ms": 100_000_000_000u64,
            "steps": [{"name": "one", "target": "big", "method": "m", "max_pages": 3}]
        }))
        .await
        .unwrap_err()
        .to_string();
    for expected in [
        "max_attempts: must be 1 to 100",
        "deadline_ms: must be 1 to 86400000",
        "max_pages: is for a paged step",
    ] {
        assert!(refused.contains(expected), "{expected:?} not in {refused}");
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_whose_answers_would_pass_the_stored_bytes_bound_fails_with_a_verdict_naming_it(
    pool: PgPool,
) {
    // Ten items of 200 KB against a budget of 1 MiB: the sixth crosses it.
    let budget = 1024 * 1024;
    let engine = engine_with(&pool, targets(Arc::default(), 200_000), budget);
    engine
        .register_workflow(&json!({
            "name": "fetch", "input_schema": {}, "parallelism": 1,
            "steps": [{"name": "each", "target": "big", "method": "m",
                       "for_each": "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]"}]
        }))
        .await
        .unwrap();
    let job_id = submit(&engine, "fetch", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
    let failed = row(&pool, job_id).await;
    let error = failed.error.clone().unwrap_or_default();
    assert!(
        error.contains("over the bound of 1048576 (FLOTILLA_MAX_STORED_BYTES)"),
        "{error}"
    );
    assert_eq!(failed.verdict.as_deref(), Some("max_stored_bytes: 1048576"));
    let items = failed.checkpoints.0.as_array().map_or(0, Vec::len);
    assert_eq!(items, 5, "five items stored, the sixth refused");
    let stored = stored_bytes(&pool, job_id).await;
    assert!(stored <= budget as usize, "{stored} bytes stored");
}

/// Gives `job_id` 27 answers of 10 MiB kept as rows: 270 MiB, past the
/// 256 MB one jsonb value holds.
async fn store_answers_past_one_read(pool: &PgPool, job_id: Uuid) {
    sqlx::query(
        "INSERT INTO workflow_run_checkpoint (job_id, event_sequence, entry)
         SELECT $1, n, jsonb_build_object('name', 'one', 'skipped', false,
                                          'response', repeat('x', 10 * 1024 * 1024))
         FROM generate_series(1, 27) n",
    )
    .bind(job_id)
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_whose_stored_checkpoints_cannot_be_read_fails_and_the_others_still_run(
    pool: PgPool,
) {
    let engine = engine_with(&pool, targets(Arc::default(), 10), 64 * 1024 * 1024);
    engine
        .register_workflow(&json!({
            "name": "small", "input_schema": {},
            "steps": [{"name": "one", "target": "big", "method": "m"}]
        }))
        .await
        .unwrap();
    // An older release's row: 27 answers of 10 MiB kept as rows, 270 MiB,
    // past the 256 MB one jsonb value holds; due before the engine's clock
    // (2026-01-01) and older than any other job.
    let oversized = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO workflow_run (job_id, workflow_name, definition, input, request_digest,
                                   status, max_attempts, has_checkpoint_rows, reader_level,
                                   event_sequence, created_at, run_after)
         VALUES ($1, 'small', '{}', '{}', 'd', 'QUEUED', 3, true, 1, 28,
                 '2025-12-31T00:00:00Z', '2025-12-31T00:00:00Z')",
    )
    .bind(oversized)
    .execute(&pool)
    .await
    .unwrap();
    store_answers_past_one_read(&pool, oversized).await;
    let fine = submit(&engine, "small", json!({})).await;
    // Oldest first: the unreadable job is claimed first and fails alone.
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(oversized));
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(fine));
    // Its list still cannot be read: the row's own columns only.
    let (status, error): (RunStatus, Option<String>) =
        sqlx::query_as("SELECT status, error FROM workflow_run WHERE job_id = $1")
            .bind(oversized)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(status, RunStatus::Failed);
    let error = error.unwrap_or_default();
    assert!(
        error.contains("its stored checkpoints cannot be read")
            && error.contains("exceeds the maximum"),
        "{error}"
    );
}

/// A signal reads its job once, locked, without the answers (review M6):
/// it reaches a job whose stored answers are past what one read of them
/// may build (27 answers of 10 MiB, an older release's row), and wakes it.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_signal_reaches_a_job_whose_stored_answers_are_past_what_one_read_may_build(
    pool: PgPool,
) {
    let engine = engine_with(&pool, targets(Arc::default(), 10), 64 * 1024 * 1024);
    let waiting = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO workflow_run (job_id, workflow_name, definition, input, request_digest,
                                   status, outstanding_step, max_attempts, has_checkpoint_rows,
                                   reader_level, event_sequence, created_at, run_after)
         VALUES ($1, 'waits', $2, '{}', 'd', 'WAITING', 'go', 3, true, 1, 28,
                 '2025-12-31T00:00:00Z', '2025-12-31T00:00:00Z')",
    )
    .bind(waiting)
    .bind(json!({
        "name": "waits", "input_schema": {},
        "steps": [{"name": "one", "target": "big", "method": "m"},
                  {"name": "go", "wait_for": "go"}]
    }))
    .execute(&pool)
    .await
    .unwrap();
    store_answers_past_one_read(&pool, waiting).await;
    let receipt = engine
        .send_signal(flotilla_worker::engine::ops::signal::Signal {
            job_id: waiting,
            name: "go".into(),
            payload: json!({"ok": true}),
            source: json!({}),
            idempotency_key: "k".into(),
        })
        .await
        .expect("the signal is kept");
    assert!(receipt.woke_job, "{receipt:?}");
    let status: RunStatus = sqlx::query_scalar("SELECT status FROM workflow_run WHERE job_id = $1")
        .bind(waiting)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(status, RunStatus::Queued);
}
