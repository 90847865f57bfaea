//! Grafts onto a job that is not running (review M4): a step grafted onto
//! a WAITING or sleeping job whose needs have ended runs now, not when the
//! wait ends; only plain call steps may be grafted.

use flotilla_store::RunStatus;
use flotilla_store::runs::RunRow;
use flotilla_worker::engine::{Engine, GraftError, Outcome};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{Calls, approval_engine, row, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// An `approval` job parked on its external step `approve`, `prepare`
/// answered: the engine, its calls, the job and the row as it waits.
async fn parked(pool: &PgPool) -> (Engine, Calls, Uuid, RunRow) {
    let calls = Calls::default();
    let engine = approval_engine(pool, &calls, true).await;
    let job_id = submit(&engine, "approval", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    let parked = row(pool, job_id).await;
    (engine, calls, job_id, parked)
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_step_grafted_onto_a_waiting_job_runs_now_and_the_job_waits_again(pool: PgPool) {
    let (engine, calls, job_id, parked) = parked(&pool).await;
    engine
        .graft(
            job_id,
            parked.revision,
            &json!([{"name": "remind", "target": "echo", "method": "remind", "needs": ["prepare"]}]),
        )
        .await
        .unwrap();
    assert_eq!(
        row(&pool, job_id).await.status,
        RunStatus::Queued,
        "the grafted step is ready: the job is taken again"
    );
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    assert_eq!(calls.of(job_id), ["prepare", "remind"]);
    let waiting = row(&pool, job_id).await;
    assert_eq!(waiting.status, RunStatus::Waiting);
    assert_eq!(waiting.outstanding_step.as_deref(), Some("approve"));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_step_grafted_behind_the_wait_leaves_the_job_waiting(pool: PgPool) {
    let (engine, _calls, job_id, parked) = parked(&pool).await;
    engine
        .graft(
            job_id,
            parked.revision,
            &json!([{"name": "archive", "target": "echo", "method": "archive", "needs": ["notify"]}]),
        )
        .await
        .unwrap();
    let still = row(&pool, job_id).await;
    assert_eq!(still.status, RunStatus::Waiting, "nothing grafted is ready");
    assert_eq!(still.attempt, parked.attempt);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn only_plain_call_steps_may_be_grafted(pool: PgPool) {
    let (engine, _calls, job_id, parked) = parked(&pool).await;
    let revision = parked.revision;
    for (step, field) in [
        (
            json!({"name": "child", "start": {"workflow": "approval"}, "needs": []}),
            "start",
        ),
        (
            json!({"name": "hear", "wait_for": "x", "needs": []}),
            "wait_for",
        ),
        (json!({"name": "nap", "sleep": "1h", "needs": []}), "sleep"),
        (
            json!({"name": "each", "target": "echo", "method": "m", "for_each": "[1]", "needs": []}),
            "for_each",
        ),
        (
            json!({"name": "pages", "target": "echo", "method": "m", "paged": true, "needs": []}),
            "paged",
        ),
        (
            json!({"name": "ask", "target": "echo", "method": "m", "completion": "external", "needs": []}),
            "completion",
        ),
    ] {
        let refused = engine
            .graft(job_id, revision, &json!([step]))
            .await
            .unwrap_err();
        let GraftError::Invalid(invalid) = &refused else {
            panic!("{field}: not refused as invalid: {refused:?}");
        };
        let text = invalid.to_string();
        assert!(
            text.contains(field) && text.contains("a grafted step is a plain call"),
            "{field}: {text}"
        );
    }
    assert_eq!(
        row(&pool, job_id).await.revision,
        revision,
        "nothing was grafted"
    );
}
