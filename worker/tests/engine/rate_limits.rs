//! A target's rate limit holds across the fleet: no window of its period
//! sees more calls begin than the limit (plus the stated tolerance: one
//! call, and the spread of the delays between a permit and its call's
//! arrival), and a
//! job whose permit frees after its segment's time goes back to the queue
//! until then, its attempt given back.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_store::RunStatus;
use flotilla_worker::engine::{Clock, Outcome, RefusalMode, SystemClock};
use flotilla_worker::targets::{FnTarget, RateLimit, StepFailure, TargetCall, Targets};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{engine, manual_clock, one_step, row, stored};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// A target `limited` that records when each call arrived, limited to `rate`.
fn limited(arrivals: &Arc<Mutex<Vec<Instant>>>, rate: &str) -> Targets {
    let arrivals = arrivals.clone();
    let mut targets = Targets::default();
    targets.register(
        "limited",
        Arc::new(FnTarget(move |_call: TargetCall| {
            arrivals.lock().unwrap().push(Instant::now());
            async { Ok::<_, StepFailure>(json!({})) }
        })),
        16,
    );
    targets.set_rate_limit("limited", rate.parse::<RateLimit>().unwrap());
    targets
}

/// 60 one-step jobs on a target limited to 20/s, drained by two workers:
/// no second holds more than the limit plus one (the algorithm's bound)
/// plus what the spread of delays between a permit and its call's arrival
/// adds (25%, for a loaded machine), and permits 50 ms apart make the
/// drain take three seconds at least.
#[sqlx::test(migrator = "MIGRATOR")]
async fn two_workers_never_call_a_target_past_its_rate_in_any_second(pool: PgPool) {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let workers = [
        engine(
            &pool,
            limited(&arrivals, "20/s"),
            Arc::new(SystemClock),
            "w1",
        ),
        engine(
            &pool,
            limited(&arrivals, "20/s"),
            Arc::new(SystemClock),
            "w2",
        ),
    ];
    workers[0]
        .register_workflow(&one_step("ping", "limited", json!({})))
        .await
        .unwrap();
    let mut jobs = Vec::new();
    for _ in 0..60 {
        let submission = stored(Uuid::new_v4(), "ping", json!({}));
        jobs.push(submission.job_id);
        workers[0]
            .submit(submission, RefusalMode::Refuse)
            .await
            .unwrap();
    }
    let began = Instant::now();
    let drains: Vec<_> = workers
        .iter()
        .map(|worker| {
            let worker = worker.clone();
            tokio::spawn(async move { while worker.run_once().await.unwrap() != Outcome::Idle {} })
        })
        .collect();
    for drain in drains {
        tokio::time::timeout(Duration::from_secs(60), drain)
            .await
            .expect("drained in time")
            .unwrap();
    }
    let took = began.elapsed();
    for job in &jobs {
        assert_eq!(row(&pool, *job).await.status, RunStatus::Completed, "{job}");
    }
    let arrivals = arrivals.lock().unwrap().clone();
    assert_eq!(arrivals.len(), 60, "one call a job");
    let busiest = arrivals
        .iter()
        .map(|start| {
            arrivals
                .iter()
                .filter(|at| **at >= *start && at.duration_since(*start) < Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap();
    // Measured where the calls land, after their own send delays (on a
    // loaded machine, tens of milliseconds apart): 20 + 1, and 4 more.
    assert!(busiest <= 25, "{busiest} calls began within one second");
    assert!(
        busiest >= 18,
        "the limit, not the workers, set the pace: {busiest}"
    );
    assert!(
        busiest >= 15,
        "the limit, not the workers, set the pace: {busiest}"
    );
    assert!(
        took >= Duration::from_millis(2900),
        "60 calls 50 ms apart take three seconds at least: {took:?}"
    );
}

/// A permit that frees only after the segment's time: the job goes back
/// to the queue until then, attempt given back, saying why; it runs when
/// the permit frees. At 7/h permits are 514.285714 s apart (an interval
/// of no whole number of nanoseconds' thousands, kept in microseconds).
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_whose_permit_frees_after_its_segment_is_put_off_until_then(pool: PgPool) {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let clock = manual_clock();
    let worker = engine(&pool, limited(&arrivals, "7/h"), clock.clone(), "w");
    worker
        .register_workflow(&one_step("ping", "limited", json!({})))
        .await
        .unwrap();
    let mut jobs = Vec::new();
    for _ in 0..3 {
        let submission = stored(Uuid::new_v4(), "ping", json!({}));
        jobs.push(submission.job_id);
        worker
            .submit(submission, RefusalMode::Refuse)
            .await
            .unwrap();
        clock.advance(Duration::from_millis(1));
    }
    let first_permit = clock.now();
    let mut outcomes = Vec::new();
    while let outcome @ (Outcome::Completed(_) | Outcome::Held(_)) =
        worker.run_once().await.unwrap()
    {
        outcomes.push(outcome);
    }
    assert_eq!(
        outcomes,
        [
            Outcome::Completed(jobs[0]),
            Outcome::Held(jobs[1]),
            Outcome::Held(jobs[2])
        ]
    );
    let interval = chrono::Duration::microseconds(3_600_000_000 / 7);
    for job in [jobs[1], jobs[2]] {
        let put_off = row(&pool, job).await;
        assert_eq!(put_off.status, RunStatus::Queued);
        assert_eq!(put_off.attempt, 0, "no attempt spent");
        assert_eq!(
            put_off.run_after,
            first_permit + interval,
            "when the next permit frees"
        );
        let error = put_off.error.unwrap();
        assert!(
            error.starts_with("held by the rate limit of target limited (7/h)"),
            "{error}"
        );
    }
    // Each freed permit lets one call begin; the other waits again.
    clock.advance(interval.to_std().unwrap());
    assert_eq!(
        worker.run_once().await.unwrap(),
        Outcome::Completed(jobs[1])
    );
    assert_eq!(worker.run_once().await.unwrap(), Outcome::Held(jobs[2]));
    assert_eq!(
        row(&pool, jobs[2]).await.run_after,
        first_permit + interval * 2
    );
    clock.advance(interval.to_std().unwrap());
    assert_eq!(
        worker.run_once().await.unwrap(),
        Outcome::Completed(jobs[2])
    );
    assert_eq!(arrivals.lock().unwrap().len(), 3);
}
