//! Heterogeneous fleets during a rolling deploy: a worker that lacks a
//! target a job needs hands the job back for one that has it, spending no
//! attempt; the job fails only when no such worker took it in time.

use std::sync::Arc;
use std::time::Duration;

use flotilla_store::RunStatus;
use flotilla_worker::engine::Outcome;
use flotilla_worker::targets::{FnTarget, StepFailure, TargetCall, Targets};
use serde_json::json;
use sqlx::PgPool;

use crate::support::{engine, manual_clock, row, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// Targets named `names`, each answering `{"by": <name>}`.
fn targets(names: &[&'static str]) -> Targets {
    let mut targets = Targets::default();
    for &name in names {
        targets.register(
            name,
            Arc::new(FnTarget(move |_: TargetCall| async move {
                Ok::<_, StepFailure>(json!({"by": name}))
            })),
            8,
        );
    }
    targets
}

fn needing(name: &str, target: &str) -> serde_json::Value {
    json!({"name": name, "input_schema": {}, "max_attempts": 1,
        "steps": [{"name": "call", "target": target, "method": "m"}]})
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn an_old_worker_hands_a_job_needing_a_new_target_to_a_new_worker(pool: PgPool) {
    let clock = manual_clock();
    let old = engine(&pool, targets(&["base"]), clock.clone(), "old");
    let new = engine(&pool, targets(&["base", "added"]), clock.clone(), "new");
    new.register_workflow(&needing("uses-added", "added"))
        .await
        .unwrap();
    // The old worker takes the submission (a request on the topic) too.
    let job_id = submit(&old, "uses-added", json!({})).await;
    assert_eq!(
        row(&pool, job_id).await.status,
        RunStatus::Queued,
        "accepted, not refused"
    );

    assert_eq!(old.run_once().await.unwrap(), Outcome::Released(job_id));
    let released = row(&pool, job_id).await;
    assert_eq!(
        (released.status, released.attempt),
        (RunStatus::Queued, 0),
        "no attempt spent"
    );
    assert!(released.error.unwrap().contains("lacks target(s) added"));
    clock.advance(Duration::from_secs(5));
    assert_eq!(new.run_once().await.unwrap(), Outcome::Completed(job_id));
    let done = row(&pool, job_id).await;
    assert_eq!(done.result.unwrap().0, json!({"by": "added"}));
    assert_eq!(done.unplaced_since, None);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_new_worker_hands_a_job_needing_a_removed_target_to_an_old_worker(pool: PgPool) {
    let clock = manual_clock();
    let old = engine(&pool, targets(&["base", "retired"]), clock.clone(), "old");
    let new = engine(&pool, targets(&["base"]), clock.clone(), "new");
    old.register_workflow(&needing("uses-retired", "retired"))
        .await
        .unwrap();
    let job_id = submit(&old, "uses-retired", json!({})).await;
    assert_eq!(new.run_once().await.unwrap(), Outcome::Released(job_id));
    clock.advance(Duration::from_secs(5));
    assert_eq!(old.run_once().await.unwrap(), Outcome::Completed(job_id));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_no_worker_can_run_fails_after_the_documented_wait(pool: PgPool) {
    let clock = manual_clock();
    let lonely = engine(&pool, targets(&["base"]), clock.clone(), "lonely");
    let gone = engine(&pool, targets(&["base", "gone"]), clock.clone(), "gone");
    gone.register_workflow(&needing("uses-gone", "gone"))
        .await
        .unwrap();
    let job_id = submit(&lonely, "uses-gone", json!({})).await;
    let wait = lonely.settings().missing_target_wait;
    assert_eq!(lonely.run_once().await.unwrap(), Outcome::Released(job_id));
    clock.advance(wait / 2);
    assert_eq!(
        lonely.run_once().await.unwrap(),
        Outcome::Released(job_id),
        "still waiting"
    );
    clock.advance(wait);
    assert_eq!(lonely.run_once().await.unwrap(), Outcome::Failed(job_id));
    let error = row(&pool, job_id).await.error.unwrap();
    assert!(
        error.contains("no worker with target(s) gone claimed this job within 15m"),
        "{error}"
    );
}
