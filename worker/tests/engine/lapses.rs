//! A lapsed lease is not a failure of the work: it spends no attempt, even
//! on the last one, and only a job that loses its worker several times in a
//! row (the one that crashes its worker every time) goes DEAD, saying so.

use std::time::Duration;

use flotilla_contracts::WorkflowRunEventType as E;
use flotilla_store::RunStatus;
use flotilla_worker::engine::Outcome;
use serde_json::json;
use sqlx::PgPool;

use crate::support::{Calls, echo_targets, engine, event_types, manual_clock, row, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

fn one_attempt(name: &str) -> serde_json::Value {
    json!({"name": name, "input_schema": {}, "max_attempts": 1,
        "steps": [{"name": "only", "target": "echo", "method": "m"}]})
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_lapsed_lease_spends_no_attempt_even_on_the_last_one(pool: PgPool) {
    let clock = manual_clock();
    let engine = engine(&pool, echo_targets(&Calls::default()), clock.clone(), "w");
    engine
        .register_workflow(&one_attempt("single"))
        .await
        .unwrap();
    let job_id = submit(&engine, "single", json!({})).await;
    drop(engine.claim().await.unwrap().expect("claimable")); // its worker dies
    clock.advance(Duration::from_secs(120));
    assert_eq!(engine.sweep().await.unwrap(), 1);
    let requeued = row(&pool, job_id).await;
    assert_eq!(
        (requeued.status, requeued.attempt),
        (RunStatus::Queued, 0),
        "the attempt was given back"
    );
    assert_eq!(
        engine.run_once().await.unwrap(),
        Outcome::Completed(job_id),
        "its one attempt is still there"
    );
    assert_eq!(row(&pool, job_id).await.attempt, 1);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_that_loses_its_worker_three_times_in_a_row_goes_dead_saying_so(pool: PgPool) {
    let clock = manual_clock();
    let engine = engine(&pool, echo_targets(&Calls::default()), clock.clone(), "w");
    engine
        .register_workflow(&one_attempt("crashy"))
        .await
        .unwrap();
    let job_id = submit(&engine, "crashy", json!({})).await;
    for _ in 0..3 {
        drop(engine.claim().await.unwrap().expect("claimable"));
        clock.advance(Duration::from_secs(120));
        assert_eq!(engine.sweep().await.unwrap(), 1);
    }
    let dead = row(&pool, job_id).await;
    assert_eq!(dead.status, RunStatus::Dead);
    let error = dead.error.unwrap();
    assert!(
        error.contains("lost its worker 3 times in a row"),
        "{error}"
    );
    assert_eq!(event_types(&pool, job_id).await, [E::Accepted, E::Dead]);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn progress_between_lapses_starts_the_count_again(pool: PgPool) {
    let clock = manual_clock();
    let engine = engine(&pool, echo_targets(&Calls::default()), clock.clone(), "w");
    engine
        .register_workflow(&crate::support::three_steps("long", "echo"))
        .await
        .unwrap();
    let job_id = submit(&engine, "long", json!({"n": 1})).await;
    for _ in 0..2 {
        drop(engine.claim().await.unwrap().expect("claimable"));
        clock.advance(Duration::from_secs(120));
        engine.sweep().await.unwrap();
    }
    // A segment that checkpoints is progress: the losses before it no longer count.
    let claimed = engine.claim().await.unwrap().expect("claimable");
    claimed
        .checkpoint(&flotilla_store::runs::Checkpoint {
            name: "one".into(),
            skipped: false,
            response: json!({"step": "one", "request": {"n": 1}}),
        })
        .await
        .unwrap();
    drop(claimed);
    for _ in 0..2 {
        clock.advance(Duration::from_secs(120));
        engine.sweep().await.unwrap();
        if let Some(claimed) = engine.claim().await.unwrap() {
            drop(claimed);
        }
    }
    assert_ne!(row(&pool, job_id).await.status, RunStatus::Dead);
}
