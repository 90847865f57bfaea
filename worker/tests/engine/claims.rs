//! Claims, leases, fencing, resume and the concurrency cap.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_contracts::WorkflowRunEventType as E;
use flotilla_store::RunStatus;
use flotilla_store::runs::Checkpoint;
use flotilla_worker::engine::{Outcome, SegmentStop, SystemClock};
use flotilla_worker::targets::{FnTarget, StepFailure, TargetCall, Targets};
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support::{
    self, Calls, checkpoint_names, echo_targets, engine, eventually, manual_clock, row, submit,
    three_steps,
};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

#[sqlx::test(migrator = "MIGRATOR")]
async fn every_job_is_claimed_by_one_loop_at_a_time_and_checkpointed_once(pool: PgPool) {
    const JOBS: usize = 500;
    let calls = Calls::default();
    // Jobs in flight right now, to catch two holders of one job at once.
    let holders: Arc<Mutex<HashMap<Uuid, usize>>> = Arc::default();
    let overlap = Arc::new(AtomicUsize::new(0));
    let mut targets = Targets::default();
    let (calls_in, holders_in, overlap_in) = (calls.clone(), holders.clone(), overlap.clone());
    targets.register(
        "echo",
        Arc::new(FnTarget(move |call: TargetCall| {
            calls_in.record(&call);
            let (holders, overlap) = (holders_in.clone(), overlap_in.clone());
            async move {
                let held = {
                    let mut h = holders.lock().unwrap();
                    let n = h.entry(call.job_id).or_insert(0);
                    *n += 1;
                    *n
                };
                if held > 1 {
                    overlap.fetch_add(1, Ordering::SeqCst);
                }
                tokio::task::yield_now().await;
                *holders.lock().unwrap().get_mut(&call.job_id).unwrap() -= 1;
                Ok::<_, StepFailure>(json!({"step": call.step_name, "request": call.request}))
            }
        })),
        8,
    );
    let first = engine(&pool, targets.clone(), Arc::new(SystemClock), "worker-a");
    let second = engine(&pool, targets, Arc::new(SystemClock), "worker-b");
    first
        .register_workflow(&three_steps("count", "echo"))
        .await
        .unwrap();
    let mut jobs = Vec::with_capacity(JOBS);
    for n in 0..JOBS {
        jobs.push(submit(&first, "count", json!({"n": n})).await);
    }

    let shutdown = CancellationToken::new();
    let runners = [first.clone(), second.clone()].map(|engine| {
        let shutdown = shutdown.clone();
        tokio::spawn(async move { engine.run(shutdown, Duration::from_secs(10)).await })
    });
    eventually(Duration::from_secs(120), "all jobs COMPLETED", || async {
        let done: i64 =
            sqlx::query_scalar("SELECT count(*) FROM workflow_run WHERE status = 'COMPLETED'")
                .fetch_one(&pool)
                .await
                .unwrap();
        done == JOBS as i64
    })
    .await;
    shutdown.cancel();
    for runner in runners {
        runner.await.unwrap();
    }

    assert_eq!(
        overlap.load(Ordering::SeqCst),
        0,
        "a job was held by two loops at once"
    );
    let per_step = calls.per_job_step();
    assert_eq!(per_step.len(), JOBS * 3);
    assert!(
        per_step.values().all(|&n| n == 1),
        "a step ran twice on the happy path"
    );
    let owners: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT lease_owner FROM workflow_run WHERE lease_owner IS NOT NULL",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(owners.is_empty(), "settled rows hold no lease: {owners:?}");
    for (n, job_id) in jobs.iter().enumerate() {
        let events = support::events(&pool, *job_id).await;
        let sequences: Vec<i64> = events.iter().map(|e| e.sequence()).collect();
        assert_eq!(sequences, [1, 2, 3, 4, 5], "job {job_id}");
        let types: Vec<E> = events.iter().map(|e| e.event_type()).collect();
        assert_eq!(
            types,
            [
                E::Accepted,
                E::StepCheckpoint,
                E::StepCheckpoint,
                E::StepCheckpoint,
                E::Completed
            ]
        );
        let row = row(&pool, *job_id).await;
        assert_eq!(row.result.unwrap().0, json!({"total": n + 2}));
        assert_eq!(
            row.verdict.as_deref(),
            Some(format!("total {}", n + 2).as_str())
        );
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn checkpoint_survives_worker_crash(pool: PgPool) {
    let calls = Calls::default();
    let crash = Arc::new(tokio::sync::Notify::new());
    let mut targets = Targets::default();
    let (calls_in, crash_in) = (calls.clone(), crash.clone());
    // Step three hangs the first time, as a worker that dies mid-call.
    let hung = Arc::new(AtomicUsize::new(0));
    targets.register(
        "echo",
        Arc::new(FnTarget(move |call: TargetCall| {
            calls_in.record(&call);
            let (crash, hung) = (crash_in.clone(), hung.clone());
            async move {
                if call.step_name == "three" && hung.fetch_add(1, Ordering::SeqCst) == 0 {
                    crash.notify_one();
                    std::future::pending::<()>().await;
                }
                Ok::<_, StepFailure>(json!({"step": call.step_name, "request": call.request}))
            }
        })),
        8,
    );
    let clock = manual_clock();
    let dying = engine(&pool, targets.clone(), clock.clone(), "dying");
    dying
        .register_workflow(&three_steps("resume", "echo"))
        .await
        .unwrap();
    let job_id = submit(&dying, "resume", json!({"n": 1})).await;

    let segment = tokio::spawn({
        let dying = dying.clone();
        async move { dying.run_once().await }
    });
    crash.notified().await;
    segment.abort(); // the worker dies mid-flight; its lease stays on the row
    assert!(segment.await.unwrap_err().is_cancelled());
    let stuck = row(&pool, job_id).await;
    assert_eq!(stuck.status, RunStatus::Running);
    assert_eq!(stuck.checkpoints.0.as_array().unwrap().len(), 2);

    let survivor = engine(&pool, targets, clock.clone(), "survivor");
    assert_eq!(
        survivor.run_once().await.unwrap(),
        Outcome::Idle,
        "the lease still holds"
    );
    clock.advance(Duration::from_secs(61));
    assert_eq!(survivor.sweep().await.unwrap(), 1);
    clock.advance(Duration::from_secs(60)); // past the lapse's backoff
    assert_eq!(
        survivor.run_once().await.unwrap(),
        Outcome::Completed(job_id)
    );

    assert_eq!(
        calls.of(job_id),
        ["one", "two", "three", "three"],
        "steps 1-2 are not called again"
    );
    let done = row(&pool, job_id).await;
    assert_eq!(done.attempt, 1, "the lapsed lease gave its attempt back");
    assert_eq!(done.result.as_ref().unwrap().0, json!({"total": 3}));
    let names = checkpoint_names(&done);
    assert_eq!(names, ["one", "two", "three"]);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn stale_worker_cannot_write_after_lease_taken(pool: PgPool) {
    let clock = manual_clock();
    let calls = Calls::default();
    let stale = engine(&pool, echo_targets(&calls), clock.clone(), "stale");
    let fresh = engine(&pool, echo_targets(&calls), clock.clone(), "fresh");
    stale
        .register_workflow(&three_steps("fenced", "echo"))
        .await
        .unwrap();
    let job_id = submit(&stale, "fenced", json!({"n": 1})).await;

    let old = stale.claim().await.unwrap().unwrap();
    clock.advance(Duration::from_secs(61));
    assert_eq!(fresh.sweep().await.unwrap(), 1);
    clock.advance(Duration::from_secs(60)); // past the lapse's backoff
    let new = fresh.claim().await.unwrap().unwrap();
    assert_eq!(new.job_id(), job_id);
    assert_ne!(new.row().lease_token, old.row().lease_token);

    let checkpoint = Checkpoint {
        name: "one".into(),
        skipped: false,
        response: json!({"stale": true}),
        item: None,
        page: None,
        signal: None,
        child: None,
        list: None,
        timed_out: false,
        call: None,
        poll: None,
    };
    assert!(matches!(
        old.checkpoint(&checkpoint).await,
        Err(SegmentStop::LeaseLost(_))
    ));
    assert!(matches!(old.renew().await, Err(SegmentStop::LeaseLost(_))));
    assert!(matches!(
        old.complete(&json!({}), "stale done").await,
        Err(SegmentStop::LeaseLost(_))
    ));

    let current = row(&pool, job_id).await;
    assert_eq!(current.status, RunStatus::Running);
    assert_eq!(current.lease_owner.as_deref(), Some("fresh"));
    assert_eq!(
        current.checkpoints.0,
        json!([]),
        "the stale checkpoint was not written"
    );
    assert_eq!(
        support::event_types(&pool, job_id).await,
        [E::Accepted],
        "no stale event either"
    );

    assert_eq!(fresh.run_segment(new).await, Outcome::Completed(job_id));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn concurrency_cap_bounds_calls_to_one_target(pool: PgPool) {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let mut targets = Targets::default();
    let (in_flight_in, peak_in) = (in_flight.clone(), peak.clone());
    targets.register(
        "slow",
        Arc::new(FnTarget(move |_call: TargetCall| {
            let (in_flight, peak) = (in_flight_in.clone(), peak_in.clone());
            async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, StepFailure>(json!({}))
            }
        })),
        2,
    );
    let mut settings = support::settings("capped");
    settings.claim_loops = 6;
    let engine = flotilla_worker::engine::Engine::new(
        pool.clone(),
        targets,
        Arc::new(SystemClock),
        settings,
    );
    engine
        .register_workflow(&json!({"name": "slow", "input_schema": {}, "steps": [{"name": "s", "target": "slow", "method": "m"}]}))
        .await
        .unwrap();
    for _ in 0..12 {
        submit(&engine, "slow", json!({})).await;
    }
    let shutdown = CancellationToken::new();
    let runner = tokio::spawn({
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        async move { engine.run(shutdown, Duration::from_secs(10)).await }
    });
    eventually(Duration::from_secs(60), "12 jobs COMPLETED", || async {
        let done: i64 =
            sqlx::query_scalar("SELECT count(*) FROM workflow_run WHERE status = 'COMPLETED'")
                .fetch_one(&pool)
                .await
                .unwrap();
        done == 12
    })
    .await;
    shutdown.cancel();
    runner.await.unwrap();
    assert_eq!(
        peak.load(Ordering::SeqCst),
        2,
        "6 loops, cap 2: the cap is reached and never passed"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn store_failure_while_checkpointing_requeues_and_never_settles(pool: PgPool) {
    let clock = manual_clock();
    // The doomed engine has pools of its own, closed by its target mid-step.
    let doomed_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(pool.connect_options().as_ref().clone())
        .await
        .unwrap();
    let mut targets = Targets::default();
    let closer: Arc<std::sync::OnceLock<flotilla_worker::engine::Engine>> = Arc::default();
    let close = closer.clone();
    targets.register(
        "echo",
        Arc::new(FnTarget(move |call: TargetCall| {
            let close = close.clone();
            async move {
                if call.step_name == "two" {
                    close.get().unwrap().close().await;
                }
                Ok::<_, StepFailure>(json!({"step": call.step_name, "request": call.request}))
            }
        })),
        8,
    );
    let doomed = flotilla_worker::engine::Engine::new(
        doomed_pool,
        targets,
        clock.clone(),
        support::settings("doomed"),
    );
    closer.set(doomed.clone()).unwrap();
    doomed
        .register_workflow(&three_steps("fragile", "echo"))
        .await
        .unwrap();
    let job_id = submit(&doomed, "fragile", json!({"n": 1})).await;
    assert_eq!(
        doomed.run_once().await.unwrap(),
        Outcome::StoreFailed(job_id)
    );

    let left = row(&pool, job_id).await;
    assert_eq!(left.status, RunStatus::Running, "nothing settled the job");
    assert_eq!(left.checkpoints.0.as_array().unwrap().len(), 1);

    let calls = Calls::default();
    let rescuer = engine(&pool, echo_targets(&calls), clock.clone(), "rescuer");
    clock.advance(Duration::from_secs(61));
    assert_eq!(rescuer.sweep().await.unwrap(), 1);
    assert_eq!(row(&pool, job_id).await.status, RunStatus::Queued);
    clock.advance(Duration::from_secs(60)); // past the lapse's backoff
    assert_eq!(
        rescuer.run_once().await.unwrap(),
        Outcome::Completed(job_id)
    );
    assert_eq!(calls.of(job_id), ["two", "three"]);
}

/// Renewals and fenced writes have connections of their own: with every
/// connection of the shared pool taken (the console, the API, a slow read),
/// a claimed job still renews its lease, checkpoints and completes, each
/// within a second.
#[sqlx::test(migrator = "MIGRATOR")]
async fn renewals_and_fenced_writes_never_wait_behind_the_shared_pool(pool: PgPool) {
    let shared = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let calls = Calls::default();
    let engine = engine(&shared, echo_targets(&calls), manual_clock(), "w");
    engine
        .register_workflow(&three_steps("crowded", "echo"))
        .await
        .unwrap();
    let job_id = submit(&engine, "crowded", json!({"n": 1})).await;
    let claimed = engine.claim().await.unwrap().expect("claimable");
    let taken = (
        shared.acquire().await.unwrap(),
        shared.acquire().await.unwrap(),
    );
    let within = Duration::from_secs(1);
    tokio::time::timeout(within, claimed.renew())
        .await
        .expect("the renewal waited for the shared pool")
        .unwrap();
    let checkpoint = Checkpoint {
        name: "one".into(),
        skipped: false,
        response: json!({}),
        item: None,
        page: None,
        signal: None,
        child: None,
        list: None,
        timed_out: false,
        call: None,
        poll: None,
    };
    tokio::time::timeout(within, claimed.checkpoint(&checkpoint))
        .await
        .expect("the checkpoint waited for the shared pool")
        .unwrap();
    tokio::time::timeout(within, claimed.complete(&json!({}), "done"))
        .await
        .expect("the completion waited for the shared pool")
        .unwrap();
    drop(taken);
    assert_eq!(row(&pool, job_id).await.status, RunStatus::Completed);
}
