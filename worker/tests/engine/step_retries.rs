//! Retry policies per step: each step counts its failed attempts apart,
//! a step's `retry` overrides the workflow's field by field, a 500 is
//! retried only where a step or its target says so, and `never_on` ends
//! the job at the first such failure.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::post;
use flotilla_store::RunStatus;
use flotilla_worker::engine::{Clock, Outcome};
use flotilla_worker::targets::http::{DEFAULT_MAX_RESPONSE_BYTES, HttpTarget};
use flotilla_worker::targets::{FnTarget, RetryClass, StepFailure, TargetCall, Targets};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::support::{engine, manual_clock, row, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// The scenario of the issue: two steps that each fail once with a 503,
/// under `max_attempts: 2`. The workflow's `max_attempts` is each step's,
/// so each has a second attempt and the job completes (it went DEAD when
/// the job's attempts were one budget for all its steps).
#[sqlx::test(migrator = "MIGRATOR")]
async fn two_steps_failing_once_each_under_max_attempts_two_complete(pool: PgPool) {
    let clock = manual_clock();
    let calls = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    let mut targets = Targets::default();
    let seen = calls.clone();
    targets.register(
        "once",
        Arc::new(FnTarget(move |call: TargetCall| {
            let mut seen = seen.lock().unwrap();
            let n: &mut usize = seen.entry(call.step_name.clone()).or_default();
            *n += 1;
            let first = *n == 1;
            async move {
                if first {
                    Err(StepFailure::retryable(RetryClass::Status, "503 once"))
                } else {
                    Ok(json!({"ok": true}))
                }
            }
        })),
        8,
    );
    let engine = engine(&pool, targets, clock.clone(), "w");
    let document = json!({
        "name": "two", "input_schema": {}, "max_attempts": 2,
        "steps": [
            {"name": "a", "target": "once", "method": "go"},
            {"name": "b", "target": "once", "method": "go"}
        ]
    });
    engine.register_workflow(&document).await.unwrap();
    let job_id = submit(&engine, "two", json!({})).await;
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        outcomes.push(engine.run_once().await.unwrap());
        clock.advance(Duration::from_secs(60));
    }
    assert_eq!(
        outcomes,
        [
            Outcome::Requeued(job_id),
            Outcome::Requeued(job_id),
            Outcome::Completed(job_id)
        ]
    );
    let done = row(&pool, job_id).await;
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(done.failed_attempts.0, json!({"a": 1, "b": 1}));
}

/// A target answering each method with the status it names (`/500`).
async fn status_target() -> HttpTarget {
    let app = axum::Router::new().route(
        "/{status}",
        post(|Path(status): Path<u16>| async move {
            (
                StatusCode::from_u16(status).unwrap(),
                axum::Json(json!({"status": status})),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    HttpTarget::new(&url, Duration::from_secs(5), DEFAULT_MAX_RESPONSE_BYTES).unwrap()
}

/// The pauses a job takes until it settles, and how it settles.
async fn pauses_until_settled(
    engine: &flotilla_worker::engine::Engine,
    clock: &flotilla_store::ManualClock,
    pool: &PgPool,
    job_id: uuid::Uuid,
) -> (Vec<Duration>, Outcome) {
    let mut pauses = Vec::new();
    loop {
        let start = clock.now();
        let outcome = engine.run_once().await.unwrap();
        if outcome != Outcome::Requeued(job_id) {
            return (pauses, outcome);
        }
        let pause = (row(pool, job_id).await.run_after - start)
            .to_std()
            .unwrap();
        pauses.push(pause);
        clock.advance(pause);
        assert!(pauses.len() < 20, "the job never settled");
    }
}

/// A step's policy wins field by field over the workflow's: its attempts,
/// its intervals growing by its coefficient without jitter, and a 500 it
/// names in `retry_on` retried (where the same 500 in a step without it
/// fails the job at once, as the target's contract says).
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_steps_policy_sets_its_attempts_pauses_and_the_statuses_it_retries(pool: PgPool) {
    let clock = manual_clock();
    let mut targets = Targets::default();
    targets.register("statuses", Arc::new(status_target().await), 8);
    let engine = engine(&pool, targets, clock.clone(), "w");
    let workflow = |name: &str, step_retry: Value| {
        json!({
            "name": name, "input_schema": {}, "max_attempts": 10,
            "retry": {"initial_interval": "1s", "coefficient": 3, "jitter": false},
            "steps": [{"name": "call", "target": "statuses", "method": "500", "retry": step_retry}]
        })
    };
    engine
        .register_workflow(&workflow(
            "retried",
            json!({"attempts": 4, "retry_on": [500]}),
        ))
        .await
        .unwrap();
    engine
        .register_workflow(&workflow("final", json!({"attempts": 4})))
        .await
        .unwrap();

    let job_id = submit(&engine, "retried", json!({})).await;
    let (pauses, outcome) = pauses_until_settled(&engine, &clock, &pool, job_id).await;
    assert_eq!(
        pauses,
        [1, 3, 9].map(Duration::from_secs),
        "1 s, times 3 each time, no jitter"
    );
    assert_eq!(outcome, Outcome::Dead(job_id));
    let dead = row(&pool, job_id).await;
    let error = dead.error.unwrap();
    assert!(error.contains("500"), "{error}");
    assert!(
        error.ends_with("(step call failed 4 of 4 attempts)"),
        "{error}"
    );
    assert_eq!(dead.failed_attempts.0, json!({"call": 3}));

    let job_id = submit(&engine, "final", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
}

/// A target whose operator says its 500s pass (`retry_statuses`) has them
/// retried by every step, under the workflow's policy.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_target_may_have_its_500s_retried(pool: PgPool) {
    let clock = manual_clock();
    let mut targets = Targets::default();
    targets.register(
        "statuses",
        Arc::new(status_target().await.retry_statuses(vec![500])),
        8,
    );
    let engine = engine(&pool, targets, clock.clone(), "w");
    let mut document = crate::support::one_step("passing", "statuses", json!({}));
    document["steps"][0]["method"] = json!("500");
    document["max_attempts"] = json!(2);
    engine.register_workflow(&document).await.unwrap();
    let job_id = submit(&engine, "passing", json!({})).await;
    let (pauses, outcome) = pauses_until_settled(&engine, &clock, &pool, job_id).await;
    assert_eq!((pauses.len(), outcome), (1, Outcome::Dead(job_id)));
}

/// `never_on` names a status or a class: the first such failure ends the
/// job DEAD, saying why, while other transient failures still retry.
#[sqlx::test(migrator = "MIGRATOR")]
async fn never_on_ends_the_job_at_the_first_such_failure(pool: PgPool) {
    let clock = manual_clock();
    let mut targets = Targets::default();
    targets.register("statuses", Arc::new(status_target().await), 8);
    let timeouts = Arc::new(AtomicUsize::new(0));
    let counted = timeouts.clone();
    targets.register(
        "slow",
        Arc::new(FnTarget(move |_call: TargetCall| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Err::<Value, _>(StepFailure::retryable(RetryClass::Timeout, "too slow")) }
        })),
        8,
    );
    let engine = engine(&pool, targets, clock.clone(), "w");
    let never = json!({"never_on": [429, "timeout"]});
    for (name, target, method) in [
        ("busy", "statuses", "429"),
        ("slow", "slow", "go"),
        ("down", "statuses", "503"),
    ] {
        let mut document = crate::support::one_step(name, target, json!({"retry": never}));
        document["steps"][0]["method"] = json!(method);
        engine.register_workflow(&document).await.unwrap();
    }
    for (name, why) in [
        ("busy", "never retries 429"),
        ("slow", "never retries timeout"),
    ] {
        let job_id = submit(&engine, name, json!({})).await;
        assert_eq!(
            engine.run_once().await.unwrap(),
            Outcome::Dead(job_id),
            "{name}"
        );
        let error = row(&pool, job_id).await.error.unwrap();
        assert!(
            error.ends_with(&format!("(step only's retry policy {why})")),
            "{error}"
        );
    }
    assert_eq!(timeouts.load(Ordering::SeqCst), 1, "tried once");
    let job_id = submit(&engine, "down", json!({})).await;
    assert_eq!(
        engine.run_once().await.unwrap(),
        Outcome::Requeued(job_id),
        "a 503 still retries"
    );
}
