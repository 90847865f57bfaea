//! Cancelling a RUNNING job: the request is recorded at once, the worker
//! holding the job learns it at its next heartbeat, drops the calls under
//! way (the target sees the request aborted) and ends the job CANCELLED;
//! a job whose worker went away is cancelled when next claimed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use flotilla_contracts::WorkflowRunEventType as E;
use flotilla_store::RunStatus;
use flotilla_worker::engine::{Cancelled, Engine, Outcome};
use flotilla_worker::target::{FnTarget, StepFailure, TargetCall, Targets};
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
