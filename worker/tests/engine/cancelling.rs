//! Cancelling a RUNNING job: the request is recorded at once, the worker
//! holding the job learns it at its next heartbeat, drops the calls under
//! way (the target sees the request aborted) and ends the job CANCELLED;
//! a segment that parks, sleeps, ends or requeues the job before that
//! heartbeat lands it CANCELLED instead (a completion included); a job
//! whose worker went away is cancelled when next claimed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use flotilla_contracts::WorkflowRunEventType as E;
use flotilla_store::RunStatus;
use flotilla_worker::engine::{Cancelled, CompleteOutcome, Engine, ManualClock, Outcome};
use flotilla_worker::targets::{FnTarget, StepFailure, TargetCall, Targets};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::sync::Notify;

use crate::support::{checkpoint_names, events, manual_clock, row, settings, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// Sets a flag when dropped before it is disarmed: a call abandoned
/// midway.
struct Aborted(Arc<AtomicBool>, bool);

impl Drop for Aborted {
    fn drop(&mut self) {
        if !self.1 {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

/// A target `slow` that signals `started`, then answers only after `ms`
/// (request field, default a minute), flagging `aborted` if dropped first;
/// `quick` answers at once, counting its calls.
fn targets(started: Arc<Notify>, aborted: Arc<AtomicBool>, quick: Arc<AtomicUsize>) -> Targets {
    let mut targets = Targets::default();
    targets.register(
        "slow",
        Arc::new(FnTarget(move |call: TargetCall| {
            let (started, aborted) = (started.clone(), aborted.clone());
            async move {
                let mut guard = Aborted(aborted, false);
                started.notify_one();
                let ms = call.request["ms"].as_u64().unwrap_or(60_000);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                guard.1 = true;
                Ok::<_, StepFailure>(json!({"slept": ms}))
            }
        })),
        8,
    );
    targets.register(
        "quick",
        Arc::new(FnTarget(move |_call: TargetCall| {
            quick.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, StepFailure>(json!({"ok": true})) }
        })),
        8,
    );
    targets
}

/// An engine whose heartbeat beats every 250 ms (a 1 s lease).
fn engine(pool: &PgPool, targets: Targets) -> Engine {
    let mut settings = settings("w");
    settings.lease = Duration::from_secs(1);
    Engine::new(pool.clone(), targets, manual_clock(), settings)
}

/// Runs one segment in a task of its own; returns once its first (slow)
/// call has started.
async fn segment_started(engine: &Engine, started: &Notify) -> tokio::task::JoinHandle<Outcome> {
    let running = tokio::spawn({
        let engine = engine.clone();
        async move { engine.run_once().await.unwrap() }
    });
    tokio::time::timeout(Duration::from_secs(10), started.notified())
        .await
        .expect("the slow call never started");
    running
}

fn workflow(first_ms: Option<u64>) -> Value {
    let mut first = json!({"name": "first", "target": "slow", "method": "m"});
    if let Some(ms) = first_ms {
        first["rules"] = json!([format!("ms = {ms}")]);
    }
    json!({
        "name": "long", "input_schema": {},
        "steps": [first, {"name": "second", "target": "quick", "method": "m"}]
    })
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_running_job_is_cancelled_within_a_heartbeat_and_its_call_aborted(pool: PgPool) {
    let (started, aborted, quick) = (Arc::new(Notify::new()), Arc::default(), Arc::default());
    let engine = engine(
        &pool,
        targets(started.clone(), Arc::clone(&aborted), Arc::clone(&quick)),
    );
    engine.register_workflow(&workflow(None)).await.unwrap();
    let job_id = submit(&engine, "long", json!({})).await;
    let running = segment_started(&engine, &started).await;

    let asked_at = Instant::now();
    let Cancelled::Asked(asked) = engine.cancel(job_id, "customer withdrew").await.unwrap() else {
        panic!("a running job is asked, not cancelled in place")
    };
    assert_eq!(
        asked.status,
        RunStatus::Running,
        "recorded at once; the worker ends it"
    );
    let outcome = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("the segment never stopped")
        .unwrap();
    let took = asked_at.elapsed();
    assert_eq!(outcome, Outcome::Cancelled(job_id));
    assert!(
        took < Duration::from_millis(1_000),
        "noticed after {took:?}, more than a heartbeat late"
    );
    assert!(
        aborted.load(Ordering::SeqCst),
        "the call under way was aborted"
    );

    let done = row(&pool, job_id).await;
    assert_eq!(done.status, RunStatus::Cancelled);
    assert_eq!(
        done.error.as_deref(),
        Some("customer withdrew (asked while it ran)")
    );
    assert!(checkpoint_names(&done).is_empty());
    assert_eq!(quick.load(Ordering::SeqCst), 0, "nothing further ran");
    let types: Vec<E> = events(&pool, job_id)
        .await
        .iter()
        .map(|e| e.event_type())
        .collect();
    assert_eq!(types, [E::Accepted, E::Cancelled], "one CANCELLED event");
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Idle);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_step_answered_before_the_notice_is_checkpointed_and_the_job_still_cancelled(
    pool: PgPool,
) {
    let (started, aborted, quick) = (Arc::new(Notify::new()), Arc::default(), Arc::default());
    // The first step answers 20 ms after it starts: well before the
    // heartbeat (every 250 ms) notices a cancel asked as it started.
    let engine = engine(
        &pool,
        targets(started.clone(), Arc::clone(&aborted), Arc::clone(&quick)),
    );
    let mut definition = workflow(Some(20));
    definition["steps"][1] = json!({"name": "second", "target": "slow", "method": "m"});
    engine.register_workflow(&definition).await.unwrap();
    let job_id = submit(&engine, "long", json!({})).await;
    let running = segment_started(&engine, &started).await;
    assert!(matches!(
        engine.cancel(job_id, "stop").await.unwrap(),
        Cancelled::Asked(_)
    ));
    let outcome = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("the segment never stopped")
        .unwrap();
    assert_eq!(outcome, Outcome::Cancelled(job_id));
    let done = row(&pool, job_id).await;
    assert_eq!(done.status, RunStatus::Cancelled);
    assert_eq!(
        checkpoint_names(&done),
        ["first"],
        "the answer that came before the notice is kept; the second step, a minute long, never answered"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_whose_worker_went_away_after_the_ask_is_cancelled_when_next_claimed(pool: PgPool) {
    let (started, aborted, quick) = (Arc::new(Notify::new()), Arc::default(), Arc::default());
    let engine = engine(&pool, targets(started, aborted, Arc::clone(&quick)));
    engine.register_workflow(&workflow(Some(1))).await.unwrap();
    let job_id = submit(&engine, "long", json!({})).await;
    // As the sweeper leaves a job whose worker died after the ask.
    sqlx::query(
        "UPDATE workflow_run SET cancel_requested = 'stop (asked while it ran)' WHERE job_id = $1",
    )
    .bind(job_id)
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Cancelled(job_id));
    let done = row(&pool, job_id).await;
    assert_eq!(done.status, RunStatus::Cancelled);
    assert_eq!(quick.load(Ordering::SeqCst), 0, "nothing was called");

    // An operator's retry clears the ask: the job runs.
    engine.retry(job_id).await.unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn the_sweeper_cancels_a_job_asked_to_cancel_whose_worker_is_gone(pool: PgPool) {
    let clock = manual_clock();
    let mut settings = settings("w");
    settings.lease = Duration::from_secs(1);
    let (started, aborted, quick) = (Arc::new(Notify::new()), Arc::default(), Arc::default());
    let engine = Engine::new(
        pool.clone(),
        targets(started, aborted, quick),
        clock.clone(),
        settings,
    );
    engine.register_workflow(&workflow(None)).await.unwrap();
    let job_id = submit(&engine, "long", json!({})).await;
    // Claimed, then its worker vanishes without a word.
    let claimed = engine.claim().await.unwrap().expect("claimable");
    drop(claimed);
    assert!(matches!(
        engine.cancel(job_id, "stop").await.unwrap(),
        Cancelled::Asked(_)
    ));
    clock.advance(Duration::from_secs(120));
    assert_eq!(engine.sweep().await.unwrap(), 1);
    let done = row(&pool, job_id).await;
    assert_eq!(
        (done.status, done.error.as_deref()),
        (RunStatus::Cancelled, Some("stop (asked while it ran)"))
    );
    let types: Vec<E> = events(&pool, job_id)
        .await
        .iter()
        .map(|e| e.event_type())
        .collect();
    assert_eq!(types, [E::Accepted, E::Cancelled]);
}

/// A target `gate` that signals `started` when called and answers only
/// once `open` is notified (a retryable failure when its request says
/// `fail`): a step under way while the test asks to cancel.
fn gated(started: Arc<Notify>, open: Arc<Notify>) -> Targets {
    let mut targets = Targets::default();
    targets.register(
        "gate",
        Arc::new(FnTarget(move |call: TargetCall| {
            let (started, open) = (started.clone(), open.clone());
            async move {
                started.notify_one();
                open.notified().await;
                if call.request["fail"] == json!(true) {
                    return Err(StepFailure::retryable(
                        flotilla_worker::targets::RetryClass::Transport,
                        "connection reset",
                    ));
                }
                Ok::<_, StepFailure>(json!({"ok": true}))
            }
        })),
        8,
    );
    targets
}

/// An engine whose heartbeat would first beat 2.5 minutes in (a 10-minute
/// lease): whatever honours a cancel in these tests, it is not a renewal.
fn quiet_engine(pool: &PgPool, targets: Targets, clock: Arc<ManualClock>) -> Engine {
    let mut settings = settings("w");
    settings.lease = Duration::from_secs(600);
    Engine::new(pool.clone(), targets, clock, settings)
}

/// Submits `workflow` (whose first step runs on `gate`), runs a segment,
/// asks to cancel while the gated step runs, then lets it answer; returns
/// the job and the segment's outcome.
async fn asked_while_the_gate_is_shut(
    engine: &Engine,
    started: &Notify,
    open: &Notify,
    workflow: &str,
) -> (uuid::Uuid, Outcome) {
    let job_id = submit(engine, workflow, json!({})).await;
    let running = segment_started(engine, started).await;
    let Cancelled::Asked(asked) = engine.cancel(job_id, "stop").await.unwrap() else {
        panic!("a running job is asked, not cancelled in place")
    };
    assert_eq!(asked.status, RunStatus::Running);
    open.notify_one();
    let outcome = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the segment never ended")
        .unwrap();
    (job_id, outcome)
}

/// Asserts `job_id` ended CANCELLED as asked, with one CANCELLED event
/// after `before` and no other event after them.
async fn assert_cancelled_as_asked(pool: &PgPool, job_id: uuid::Uuid, before: &[E]) {
    let done = row(pool, job_id).await;
    assert_eq!(
        (done.status, done.error.as_deref(), done.lease_token),
        (
            RunStatus::Cancelled,
            Some("stop (asked while it ran)"),
            None
        ),
        "CANCELLED as the segment ended, no heartbeat needed"
    );
    assert_eq!(done.outstanding_step, None);
    let mut expected = before.to_vec();
    expected.push(E::Cancelled);
    assert_eq!(
        crate::support::event_types(pool, job_id).await,
        expected,
        "one CANCELLED event, nothing written as if the job went on"
    );
}

/// `name`: a gated step `quick`, then `then`.
fn gated_then(name: &str, then: &Value) -> Value {
    json!({
        "name": name, "input_schema": {},
        "steps": [{"name": "quick", "target": "gate", "method": "m"}, then]
    })
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_cancel_asked_while_a_step_runs_wins_over_the_park_on_the_external_step_after_it(
    pool: PgPool,
) {
    let (started, open) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let engine = quiet_engine(&pool, gated(started.clone(), open.clone()), manual_clock());
    let approve =
        json!({"name": "approve", "target": "gate", "method": "m", "completion": "external"});
    engine
        .register_workflow(&gated_then("approval", &approve))
        .await
        .unwrap();
    let (job_id, outcome) =
        asked_while_the_gate_is_shut(&engine, &started, &open, "approval").await;
    assert_eq!(outcome, Outcome::Cancelled(job_id), "not Parked");
    assert_cancelled_as_asked(&pool, job_id, &[E::Accepted, E::StepCheckpoint]).await;
    assert!(
        matches!(
            engine
                .complete_step(job_id, "approve", json!({}))
                .await
                .unwrap(),
            CompleteOutcome::WrongState {
                status: RunStatus::Cancelled,
                ..
            }
        ),
        "nothing waits for the approval"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_cancel_asked_while_a_step_runs_wins_over_the_sleep_after_it(pool: PgPool) {
    let (started, open) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let clock = manual_clock();
    let engine = quiet_engine(&pool, gated(started.clone(), open.clone()), clock.clone());
    let nap = json!({"name": "nap", "sleep": "1h"});
    engine
        .register_workflow(&gated_then("napping", &nap))
        .await
        .unwrap();
    let (job_id, outcome) = asked_while_the_gate_is_shut(&engine, &started, &open, "napping").await;
    assert_eq!(outcome, Outcome::Cancelled(job_id), "not Sleeping");
    assert_cancelled_as_asked(&pool, job_id, &[E::Accepted, E::StepCheckpoint]).await;
    clock.advance(Duration::from_secs(2 * 3600));
    assert_eq!(
        engine.run_once().await.unwrap(),
        Outcome::Idle,
        "nothing wakes an hour on"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_cancel_asked_while_a_step_runs_wins_over_the_signal_park_after_it(pool: PgPool) {
    let (started, open) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let engine = quiet_engine(&pool, gated(started.clone(), open.clone()), manual_clock());
    let paid = json!({"name": "paid", "wait_for": "x"});
    engine
        .register_workflow(&gated_then("paying", &paid))
        .await
        .unwrap();
    let (job_id, outcome) = asked_while_the_gate_is_shut(&engine, &started, &open, "paying").await;
    assert_eq!(outcome, Outcome::Cancelled(job_id), "not Parked");
    assert_cancelled_as_asked(&pool, job_id, &[E::Accepted, E::StepCheckpoint]).await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_cancel_asked_while_a_step_runs_wins_over_the_requeue_of_its_retryable_failure(
    pool: PgPool,
) {
    let (started, open) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let engine = quiet_engine(&pool, gated(started.clone(), open.clone()), manual_clock());
    engine
        .register_workflow(&json!({
            "name": "flaky", "input_schema": {},
            "steps": [{"name": "quick", "target": "gate", "method": "m", "rules": ["fail = true"]}]
        }))
        .await
        .unwrap();
    let (job_id, outcome) = asked_while_the_gate_is_shut(&engine, &started, &open, "flaky").await;
    assert_eq!(outcome, Outcome::Cancelled(job_id), "not Requeued");
    assert_cancelled_as_asked(&pool, job_id, &[E::Accepted]).await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_cancel_asked_during_the_last_step_wins_over_the_completion(pool: PgPool) {
    let (started, open) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let engine = quiet_engine(&pool, gated(started.clone(), open.clone()), manual_clock());
    engine
        .register_workflow(&json!({
            "name": "short", "input_schema": {},
            "steps": [{"name": "quick", "target": "gate", "method": "m"}]
        }))
        .await
        .unwrap();
    let (job_id, outcome) = asked_while_the_gate_is_shut(&engine, &started, &open, "short").await;
    assert_eq!(outcome, Outcome::Cancelled(job_id), "not Completed");
    // The step's answer is kept, as any answer that came before the notice.
    assert_cancelled_as_asked(&pool, job_id, &[E::Accepted, E::StepCheckpoint]).await;
    let done = row(&pool, job_id).await;
    assert_eq!(checkpoint_names(&done), ["quick"]);
    assert_eq!((done.result, done.verdict), (None, None), "no result made");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_parent_cancelled_as_it_parks_on_its_child_cancels_the_child(pool: PgPool) {
    let (started, open) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let engine = quiet_engine(&pool, gated(started.clone(), open.clone()), manual_clock());
    engine
        .register_workflow(&json!({
            "name": "kid", "input_schema": {},
            "steps": [{"name": "hold", "wait_for": "never"}]
        }))
        .await
        .unwrap();
    engine
        .register_workflow(&json!({
            "name": "parent", "input_schema": {},
            "steps": [
                {"name": "quick", "target": "gate", "method": "m", "needs": []},
                {"name": "spawn", "start": {"workflow": "kid", "input": []}, "needs": []}
            ]
        }))
        .await
        .unwrap();
    let (parent, outcome) = asked_while_the_gate_is_shut(&engine, &started, &open, "parent").await;
    assert_eq!(
        outcome,
        Outcome::Cancelled(parent),
        "not Parked on its child"
    );
    assert_eq!(row(&pool, parent).await.status, RunStatus::Cancelled);
    let child = flotilla_worker::engine::child_id(parent, "spawn");
    let child = row(&pool, child).await;
    assert_eq!(
        (child.status, child.error.as_deref()),
        (
            RunStatus::Cancelled,
            Some(format!("its parent {parent} was cancelled").as_str())
        ),
        "the child goes with its parent, at once"
    );
}
