//! Debounce: requests of one key within a window make one job, the last
//! one's; the earlier jobs, never started, end CANCELLED naming it.

use std::time::Duration;

use flotilla_store::RunStatus;
use flotilla_worker::engine::{Outcome, RefusalMode, SubmitError};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{Calls, echo_targets, engine, manual_clock, row, stored};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

fn debounced() -> serde_json::Value {
    json!({
        "name": "reindex", "input_schema": {},
        "debounce": {"key": "input.customer", "window_ms": 1000},
        "steps": [{"name": "run", "target": "echo", "method": "go", "rules": ["n = input.n"]}]
    })
}

/// Ten submissions of one key in a second, one at a time and as one
/// batch: one job runs, after the window, with the last input; the nine
/// others are CANCELLED without a call. Another key is not touched. Two
/// workers drain the queue.
#[sqlx::test(migrator = "MIGRATOR")]
async fn ten_submissions_in_a_second_start_one_run_with_the_last_input(pool: PgPool) {
    let calls = Calls::default();
    let clock = manual_clock();
    let workers = [
        engine(&pool, echo_targets(&calls), clock.clone(), "w1"),
        engine(&pool, echo_targets(&calls), clock.clone(), "w2"),
    ];
    workers[0].register_workflow(&debounced()).await.unwrap();
    let request = |n: i64, customer: &str| {
        stored(
            Uuid::new_v4(),
            "reindex",
            json!({"customer": customer, "n": n}),
        )
    };
    let mut one_by_one = Vec::new();
    for n in 0..10 {
        let submission = request(n, "ada");
        one_by_one.push(submission.job_id);
        workers[(n % 2) as usize]
            .submit(submission, RefusalMode::Refuse)
            .await
            .unwrap();
        clock.advance(Duration::from_millis(90));
    }
    let batch: Vec<_> = (0..10).map(|n| request(n, "grace")).collect();
    let batch_ids: Vec<Uuid> = batch.iter().map(|s| s.job_id).collect();
    workers[1].submit_batch(batch).await.unwrap();
    let other = request(0, "linus");
    let other_id = other.job_id;
    workers[0].submit(other, RefusalMode::Refuse).await.unwrap();

    // Each earlier job names the later request that superseded it: the
    // next one when they came one at a time, the batch's last in a batch.
    for (ids, by) in [(&one_by_one, None), (&batch_ids, Some(batch_ids[9]))] {
        let (last, earlier) = ids.split_last().unwrap();
        for (n, job) in earlier.iter().enumerate() {
            let cancelled = row(&pool, *job).await;
            assert_eq!(cancelled.status, RunStatus::Cancelled, "{job}");
            let error = cancelled.error.unwrap();
            let survivor = by.unwrap_or(ids[n + 1]);
            assert!(
                error.contains(&format!("superseded by job {survivor}")),
                "{error}"
            );
        }
        assert_eq!(row(&pool, *last).await.status, RunStatus::Queued);
    }
    assert_eq!(row(&pool, other_id).await.status, RunStatus::Queued);

    // Nothing starts inside the window.
    assert_eq!(workers[0].run_once().await.unwrap(), Outcome::Idle);
    clock.advance(Duration::from_millis(1000));
    let drains = workers.iter().map(|worker| {
        let worker = worker.clone();
        tokio::spawn(async move { while worker.run_once().await.unwrap() != Outcome::Idle {} })
    });
    for drain in drains.collect::<Vec<_>>() {
        tokio::time::timeout(Duration::from_secs(30), drain)
            .await
            .unwrap()
            .unwrap();
    }
    let started: Vec<Uuid> = calls.all().into_iter().map(|(job, _)| job).collect();
    assert_eq!(started.len(), 3, "one run per key: {started:?}");
    for job in [one_by_one[9], batch_ids[9], other_id] {
        assert!(started.contains(&job), "{job}");
        assert_eq!(row(&pool, job).await.status, RunStatus::Completed);
    }
    assert_eq!(
        row(&pool, one_by_one[9]).await.result.unwrap().0["request"]["n"],
        9
    );
}

/// A key that is not a string or a number refuses the input.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_key_that_is_no_string_or_number_refuses_the_input(pool: PgPool) {
    let engine = engine(&pool, echo_targets(&Calls::default()), manual_clock(), "w");
    engine.register_workflow(&debounced()).await.unwrap();
    let refused = engine
        .submit(
            stored(Uuid::new_v4(), "reindex", json!({"customer": {"id": 1}})),
            RefusalMode::Refuse,
        )
        .await;
    assert!(
        matches!(&refused, Err(SubmitError::InvalidInput { violations, .. }) if violations[0].starts_with("debounce.key")),
        "{refused:?}"
    );
}
