//! Timeouts on every wait: a `wait_for`, an external and a `start` step
//! with `timeout_ms` stop waiting at it, on the engine's clock, and end as
//! their `on_timeout` says (fail, skip, or a given value) with the step's
//! checkpoint saying so; what comes after is refused with its own code.

use std::sync::Arc;
use std::time::Duration;

use flotilla_contracts::WorkflowRunEventType as E;
use flotilla_store::RunStatus;
use flotilla_worker::engine::CompleteOutcome;
use flotilla_worker::engine::ops::signal::{Signal, SignalError};
use flotilla_worker::engine::{Clock as _, Engine, Outcome};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{Calls, echo_targets, engine, events, manual_clock, row, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

const HOUR: Duration = Duration::from_secs(3600);

/// `approve` waits an hour for the signal `approval`, then `after` runs
/// when it has an answer and `noted` whatever it came to.
fn waiting(name: &str, on_timeout: Option<Value>) -> Value {
    let mut wait = json!({"name": "approve", "wait_for": "approval", "timeout_ms": 3_600_000});
    if let Some(on_timeout) = on_timeout {
        wait["on_timeout"] = on_timeout;
    }
    json!({
        "name": name, "input_schema": {},
        "steps": [
            wait,
            {"name": "after", "target": "echo", "method": "go", "needs": ["approve"],
             "when": "has(steps.approve) && steps.approve.approved"},
            {"name": "noted", "target": "echo", "method": "go", "needs": ["after"]}
        ]
    })
}

fn approval(job_id: Uuid, key: &str) -> Signal {
    Signal {
        job_id,
        name: "approval".into(),
        payload: json!({"approved": true}),
        source: json!({}),
        idempotency_key: key.into(),
    }
}

async fn setup(pool: &PgPool) -> (Engine, Arc<flotilla_store::ManualClock>, Calls) {
    let calls = Calls::default();
    let clock = manual_clock();
    let engine = engine(pool, echo_targets(&calls), clock.clone(), "w");
    for (name, on_timeout) in [
        ("fails", None),
        ("skips", Some(json!("skip"))),
        (
            "takes",
            Some(json!({"value": {"approved": false, "why": "no answer"}})),
        ),
    ] {
        engine
            .register_workflow(&waiting(name, on_timeout))
            .await
            .unwrap();
    }
    (engine, clock, calls)
}

/// A job waiting for a signal that never comes wakes at the deadline by
/// itself (the due-waits sweep) and fails with a verdict naming the step;
/// a signal a minute late is refused as `wait_timed_out`.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_signal_that_never_comes_fails_the_job_at_its_timeout_naming_the_step(pool: PgPool) {
    let (engine, clock, _calls) = setup(&pool).await;
    let job_id = submit(&engine, "fails", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    let parked = row(&pool, job_id).await;
    assert_eq!(parked.status, RunStatus::Waiting);
    assert_eq!(
        parked.wake_at,
        Some(parked.wait_deadline("approve").unwrap())
    );

    clock.advance(HOUR - Duration::from_secs(1));
    assert_eq!(engine.wake_due_waits().await.unwrap(), 0, "not yet");
    clock.advance(Duration::from_secs(61));
    let late = engine.send_signal(approval(job_id, "late")).await;
    assert!(
        matches!(&late, Err(SignalError::TimedOut { step, .. }) if step == "approve"),
        "{late:?}"
    );
    assert_eq!(late.unwrap_err().code(), Some("wait_timed_out"));

    assert_eq!(engine.wake_due_waits().await.unwrap(), 1);
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
    let failed = row(&pool, job_id).await;
    assert_eq!(
        failed.error.as_deref(),
        Some("step approve: timed out after 1h of waiting")
    );
    assert_eq!(
        failed.verdict.as_deref(),
        Some("approve: timed out after 1h")
    );
}

/// `skip` checkpoints the wait as skipped and timed out, and the job goes
/// on without it; a signal in time wins over a deadline passed before the
/// job ran again.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_wait_that_skips_at_its_timeout_lets_the_job_go_on_without_it(pool: PgPool) {
    let (engine, clock, calls) = setup(&pool).await;
    let job_id = submit(&engine, "skips", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    clock.advance(HOUR);
    engine.wake_due_waits().await.unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    let done = row(&pool, job_id).await;
    let checkpoints = done.checkpoints.0.as_array().unwrap().clone();
    assert_eq!(checkpoints[0]["name"], "approve");
    assert_eq!(checkpoints[0]["skipped"], true);
    assert_eq!(checkpoints[0]["timed_out"], true);
    assert_eq!(calls.of(job_id), ["noted"], "after was skipped by its when");
    let verdicts: Vec<Option<String>> = events(&pool, job_id)
        .await
        .iter()
        .filter(|e| e.event_type() == E::StepCheckpoint)
        .map(|e| e.verdict().map(str::to_owned))
        .collect();
    assert_eq!(verdicts[0].as_deref(), Some("timed out"));

    // In time: the signal is taken even though the job runs after the
    // deadline (the signal was accepted before it).
    let on_time = submit(&engine, "skips", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(on_time));
    clock.advance(HOUR - Duration::from_secs(1));
    engine
        .send_signal(approval(on_time, "in-time"))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(10));
    assert_eq!(
        engine.run_once().await.unwrap(),
        Outcome::Completed(on_time)
    );
    assert_eq!(calls.of(on_time), ["after", "noted"]);
}

/// `{value: …}` gives the step that response: dependants branch on it.
/// The deadline is the row's: a worker started later (a restart) keeps it.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_wait_that_takes_a_value_at_its_timeout_keeps_its_deadline_across_a_restart(
    pool: PgPool,
) {
    let (engine, clock, calls) = setup(&pool).await;
    let job_id = submit(&engine, "takes", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    let deadline = row(&pool, job_id).await.wait_deadline("approve").unwrap();
    clock.advance(Duration::from_secs(1800));
    drop(engine);

    let restarted = crate::support::engine(&pool, echo_targets(&calls), clock.clone(), "w2");
    assert_eq!(restarted.wake_due_waits().await.unwrap(), 0);
    clock.advance(Duration::from_secs(1800));
    assert_eq!(restarted.wake_due_waits().await.unwrap(), 1);
    assert_eq!(
        restarted.run_once().await.unwrap(),
        Outcome::Completed(job_id)
    );
    let done = row(&pool, job_id).await;
    assert_eq!(done.wait_deadline("approve"), Some(deadline));
    let checkpoints = done.checkpoints.0.as_array().unwrap().clone();
    assert_eq!(
        checkpoints[0]["response"],
        json!({"approved": false, "why": "no answer"})
    );
    assert_eq!(checkpoints[0]["timed_out"], true);
    assert_eq!(calls.of(job_id), ["noted"]);
}

/// An external step with `timeout_ms`: an answer after it is refused as
/// TIMED_OUT, before or after the job wakes to end the wait.
#[sqlx::test(migrator = "MIGRATOR")]
async fn an_answer_after_a_persons_timeout_is_refused(pool: PgPool) {
    let (engine, clock, _calls) = setup(&pool).await;
    let document = json!({
        "name": "asks", "input_schema": {},
        "steps": [
            {"name": "review", "target": "echo", "method": "go", "completion": "external",
             "timeout_ms": 60_000, "on_timeout": {"value": {"ok": false}}}
        ]
    });
    engine.register_workflow(&document).await.unwrap();
    let job_id = submit(&engine, "asks", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    clock.advance(Duration::from_secs(61));
    let answer = engine
        .complete_step(job_id, "review", json!({"ok": true}))
        .await;
    assert_eq!(answer.unwrap(), CompleteOutcome::TimedOut);
    engine.wake_due_waits().await.unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(
        row(&pool, job_id).await.result.unwrap().0,
        json!({"ok": false})
    );
    let answer = engine
        .complete_step(job_id, "review", json!({"ok": true}))
        .await;
    assert_eq!(answer.unwrap(), CompleteOutcome::TimedOut);
}

/// A `start` step with `timeout_ms`: its child is cancelled at the
/// deadline, and the parent fails naming the step.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_child_past_its_parents_timeout_is_cancelled_and_the_parent_fails(pool: PgPool) {
    let (engine, clock, _calls) = setup(&pool).await;
    let child = json!({
        "name": "slow-child", "input_schema": {},
        "steps": [{"name": "wait", "wait_for": "never"}]
    });
    let parent = json!({
        "name": "impatient", "input_schema": {},
        "steps": [{"name": "child", "start": {"workflow": "slow-child"}, "timeout_ms": 60_000}]
    });
    engine.register_workflow(&child).await.unwrap();
    engine.register_workflow(&parent).await.unwrap();
    let job_id = submit(&engine, "impatient", json!({})).await;
    for _ in 0..3 {
        engine.run_once().await.unwrap();
    }
    assert_eq!(row(&pool, job_id).await.status, RunStatus::Waiting);
    let child_id = flotilla_worker::engine::child_id(job_id, "child");
    assert_eq!(row(&pool, child_id).await.status, RunStatus::Waiting);
    clock.advance(Duration::from_secs(60));
    assert_eq!(engine.wake_due_waits().await.unwrap(), 1);
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
    assert_eq!(row(&pool, child_id).await.status, RunStatus::Cancelled);
    assert_eq!(
        row(&pool, job_id).await.error.as_deref(),
        Some("step child: timed out after 1m of waiting")
    );
}

/// A workflow's `execution_timeout_ms` ends the job wherever it is: asleep
/// on a day-long timer, or waiting for a signal with no bound of its own.
/// The due-waits sweep brings it back at the instant, and it fails as
/// timed out after its compensation ran.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_past_its_execution_timeout_fails_as_timed_out_after_compensating(pool: PgPool) {
    let (engine, clock, calls) = setup(&pool).await;
    let document = |name: &str, first: Value| {
        json!({
            "name": name, "input_schema": {}, "execution_timeout_ms": 7_200_000,
            "steps": [
                {"name": "charge", "target": "echo", "method": "go"},
                first,
                {"name": "ship", "target": "echo", "method": "go"}
            ],
            "on_failure": [{"name": "refund", "target": "echo", "method": "go"}]
        })
    };
    let sleeper = document("sleeper", json!({"name": "pause", "sleep": "24h"}));
    let waiter = document("waiter", json!({"name": "pause", "wait_for": "go-on"}));
    engine.register_workflow(&sleeper).await.unwrap();
    engine.register_workflow(&waiter).await.unwrap();
    let asleep = submit(&engine, "sleeper", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Sleeping(asleep));
    let waiting = submit(&engine, "waiter", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(waiting));

    clock.advance(2 * HOUR - Duration::from_millis(1));
    assert_eq!(engine.wake_due_waits().await.unwrap(), 0);
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Idle);
    clock.advance(Duration::from_millis(1));
    assert_eq!(engine.wake_due_waits().await.unwrap(), 1, "the waiting one");
    for _ in 0..2 {
        assert!(matches!(
            engine.run_once().await.unwrap(),
            Outcome::Failed(_)
        ));
    }
    for job_id in [asleep, waiting] {
        let ended = row(&pool, job_id).await;
        assert_eq!(ended.status, RunStatus::Failed);
        let error = ended.error.unwrap();
        assert!(
            error.starts_with("timed out: the workflow's execution_timeout_ms"),
            "{error}"
        );
        assert_eq!(calls.of(job_id), ["charge", "refund"]);
    }
}

/// An operator's retry of a job whose wait timed out gives the wait its
/// whole `timeout_ms` again (the old deadline is dropped), so a signal
/// sent then is taken.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_retried_job_waits_its_whole_timeout_again(pool: PgPool) {
    let (engine, clock, calls) = setup(&pool).await;
    let job_id = submit(&engine, "fails", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    clock.advance(HOUR);
    engine.wake_due_waits().await.unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));

    engine.retry(job_id).await.unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    let parked = row(&pool, job_id).await;
    let deadline = parked.wait_deadline("approve").unwrap();
    assert_eq!((deadline - clock.now()).num_seconds(), 3600);
    engine.send_signal(approval(job_id, "again")).await.unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(calls.of(job_id), ["after", "noted"]);
}
