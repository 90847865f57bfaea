//! Priority: a request's head start in the queue, a minute per point. Two
//! workers claiming together start every high-priority job before the
//! backlog that was there first; a job that has waited longer than the
//! head start still goes first (nothing starves).

use std::time::Duration;

use flotilla_worker::engine::{Outcome, RefusalMode, Submission};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{Calls, echo_targets, engine, manual_clock, row, stored, three_steps};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

fn with_priority(job_id: Uuid, priority: i16) -> Submission {
    Submission {
        priority,
        ..stored(job_id, "ranked", json!({"n": 1}))
    }
}

/// Forty jobs of priority 0 wait; ten of priority 5 come after them. Two
/// workers claim side by side, one job per claim: the ten are the first
/// jobs started (give or take the one the other worker took at the same
/// instant).
#[sqlx::test(migrator = "MIGRATOR")]
async fn high_priority_jobs_go_before_an_earlier_backlog_across_two_workers(pool: PgPool) {
    let calls = Calls::default();
    let clock = manual_clock();
    let workers: Vec<_> = ["w1", "w2"]
        .iter()
        .map(|id| engine(&pool, echo_targets(&calls), clock.clone(), id))
        .collect();
    workers[0]
        .register_workflow(&three_steps("ranked", "echo"))
        .await
        .unwrap();
    for _ in 0..40 {
        let job_id = Uuid::new_v4();
        workers[0]
            .submit(
                stored(job_id, "ranked", json!({"n": 1})),
                RefusalMode::Refuse,
            )
            .await
            .unwrap();
        clock.advance(Duration::from_millis(10));
    }
    let mut urgent = Vec::new();
    for _ in 0..10 {
        let job_id = Uuid::new_v4();
        workers[1]
            .submit(with_priority(job_id, 5), RefusalMode::Refuse)
            .await
            .unwrap();
        urgent.push(job_id);
    }
    assert_eq!(row(&pool, urgent[0]).await.priority, 5);

    let runs = workers.iter().map(|worker| {
        let worker = worker.clone();
        tokio::spawn(async move { while worker.run_once().await.unwrap() != Outcome::Idle {} })
    });
    for run in runs.collect::<Vec<_>>() {
        tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .expect("both workers drain the queue")
            .unwrap();
    }
    // The order jobs were started in: each one's first call.
    let mut started: Vec<Uuid> = Vec::new();
    for (job, _) in calls.all() {
        if !started.contains(&job) {
            started.push(job);
        }
    }
    assert_eq!(started.len(), 50);
    let first: Vec<&Uuid> = started.iter().take(11).collect();
    let urgent_first = urgent.iter().filter(|job| first.contains(job)).count();
    assert_eq!(
        urgent_first, 10,
        "all ten urgent jobs among the first eleven started: {started:?}"
    );
}

/// The head start is bounded: a priority 0 job that has waited six
/// minutes goes before a priority 5 job that just came, one that has
/// waited four does not.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_that_waited_longer_than_the_head_start_still_goes_first(pool: PgPool) {
    let calls = Calls::default();
    let clock = manual_clock();
    let worker = engine(&pool, echo_targets(&calls), clock.clone(), "w");
    worker
        .register_workflow(&three_steps("ranked", "echo"))
        .await
        .unwrap();
    for (waited, expected_first) in [(6, "patient"), (4, "urgent")] {
        let patient = Uuid::new_v4();
        worker
            .submit(
                stored(patient, "ranked", json!({"n": 1})),
                RefusalMode::Refuse,
            )
            .await
            .unwrap();
        clock.advance(Duration::from_secs(60 * waited));
        let urgent = Uuid::new_v4();
        worker
            .submit(with_priority(urgent, 5), RefusalMode::Refuse)
            .await
            .unwrap();
        let Outcome::Completed(first) = worker.run_once().await.unwrap() else {
            panic!("the first claim completes a job");
        };
        let first = if first == patient {
            "patient"
        } else {
            "urgent"
        };
        assert_eq!(first, expected_first, "after {waited} minutes of waiting");
        while worker.run_once().await.unwrap() != Outcome::Idle {}
    }
}
