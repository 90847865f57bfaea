//! Retries after a retryable failure: exponential, capped, spread per job,
//! and a target's `Retry-After` honoured.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use flotilla_contracts::WorkflowRunEventType as E;
use flotilla_store::RunStatus;
use flotilla_worker::engine::{Clock, Engine, Outcome};
use flotilla_worker::targets::http::HttpTarget;
use flotilla_worker::targets::{FnTarget, RetryClass, StepFailure, TargetCall, Targets};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::support::{self, engine, manual_clock, one_step, row, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

#[sqlx::test(migrator = "MIGRATOR")]
async fn retryable_failures_back_off_exponentially_then_die_with_the_last_error(pool: PgPool) {
    let clock = manual_clock();
    let mut targets = Targets::default();
    let attempt = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    targets.register(
        "flaky",
        Arc::new(FnTarget(move |_call: TargetCall| {
            let n = attempt.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            async move {
                Err::<Value, _>(StepFailure::retryable(
                    RetryClass::Status,
                    format!("503 from upstream, try {n}"),
                ))
            }
        })),
        8,
    );
    let engine = engine(&pool, targets, clock.clone(), "w");
    engine
        .register_workflow(&one_step("flaky", "flaky", json!({})))
        .await
        .unwrap();
    let job_id = submit(&engine, "flaky", json!({})).await;

    // Attempt 1 fails: eligible again after 2.5 to 5 s (the upper half of
    // 5 s is spread per job), not before.
    let pause_after = async || {
        let start = clock.now();
        assert_eq!(engine.run_once().await.unwrap(), Outcome::Requeued(job_id));
        let queued = row(&pool, job_id).await;
        assert_eq!(queued.status, RunStatus::Queued);
        (queued.run_after - start).to_std().unwrap()
    };
    let first = pause_after().await;
    assert!(
        (Duration::from_millis(2_500)..=Duration::from_secs(5)).contains(&first),
        "{first:?}"
    );
    clock.advance(first - Duration::from_millis(1));
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Idle);
    clock.advance(Duration::from_millis(1));

    // Attempt 2 fails: 5 to 10 s this time.
    let second = pause_after().await;
    assert!(
        (Duration::from_secs(5)..=Duration::from_secs(10)).contains(&second),
        "{second:?}"
    );
    clock.advance(second);

    // Attempt 3 is the last (max_attempts 3): DEAD with that error verbatim.
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Dead(job_id));
    let dead = row(&pool, job_id).await;
    assert_eq!(dead.status, RunStatus::Dead);
    assert_eq!(dead.attempt, 3);
    assert_eq!(
        dead.error.as_deref(),
        Some("step only: 503 from upstream, try 3 (step only failed 3 of 3 attempts)")
    );
    let events = support::events(&pool, job_id).await;
    assert_eq!(
        events.iter().map(|e| e.event_type()).collect::<Vec<_>>(),
        [E::Accepted, E::Dead]
    );
    assert_eq!(
        events[1].error(),
        Some("step only: 503 from upstream, try 3 (step only failed 3 of 3 attempts)")
    );
    clock.advance(Duration::from_secs(3600));
    assert_eq!(
        engine.run_once().await.unwrap(),
        Outcome::Idle,
        "nothing re-enqueues a DEAD job"
    );
}

/// Twenty jobs failing on one outage come back spread over the upper half
/// of their pause, not at one instant; with the pause capped, a later
/// attempt waits at most the cap.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_herd_failing_together_comes_back_spread_out_and_never_past_the_cap(pool: PgPool) {
    let clock = manual_clock();
    let mut targets = Targets::default();
    targets.register(
        "down",
        Arc::new(FnTarget(|_call: TargetCall| async {
            Err::<Value, _>(StepFailure::retryable(RetryClass::Status, "503"))
        })),
        64,
    );
    let mut settings = support::settings("w");
    settings.backoff_max = Duration::from_secs(6);
    let engine = Engine::new(pool.clone(), targets, clock.clone(), settings);
    let mut document = one_step("herd", "down", json!({}));
    document["max_attempts"] = json!(5);
    engine.register_workflow(&document).await.unwrap();
    let mut jobs = Vec::new();
    for _ in 0..20 {
        jobs.push(submit(&engine, "herd", json!({})).await);
    }
    let start = clock.now();
    for _ in &jobs {
        assert!(matches!(
            engine.run_once().await.unwrap(),
            Outcome::Requeued(_)
        ));
    }
    let mut pauses = Vec::new();
    for job in &jobs {
        pauses.push((row(&pool, *job).await.run_after - start).to_std().unwrap());
    }
    let (shortest, longest) = (pauses.iter().min().unwrap(), pauses.iter().max().unwrap());
    assert!(*shortest >= Duration::from_millis(2_500), "{pauses:?}");
    assert!(*longest <= Duration::from_secs(5), "{pauses:?}");
    let distinct: std::collections::HashSet<_> = pauses.iter().collect();
    assert!(distinct.len() >= 15, "spread over the span: {pauses:?}");
    // Attempt 2's pause would be 5 to 10 s; the cap holds it to 3 to 6 s.
    clock.advance(Duration::from_secs(5));
    let start = clock.now();
    for _ in &jobs {
        assert!(matches!(
            engine.run_once().await.unwrap(),
            Outcome::Requeued(_)
        ));
    }
    for job in &jobs {
        let pause = (row(&pool, *job).await.run_after - start).to_std().unwrap();
        assert!(
            (Duration::from_secs(3)..=Duration::from_secs(6)).contains(&pause),
            "{pause:?}"
        );
    }
}

/// A 503 with `Retry-After` leaves the target alone that long: the next
/// attempt waits at least the asked time, up to the longest pause between
/// attempts (`backoff_max`, 5 minutes by default); without one, the
/// backoff (at most 5 s after a first failure).
#[sqlx::test(migrator = "MIGRATOR")]
async fn retry_after_on_a_503_sets_the_next_attempt_up_to_the_longest_pause(pool: PgPool) {
    let app = axum::Router::new().route(
        "/{wait}",
        post(|Path(wait): Path<String>| async move {
            let mut headers = HeaderMap::new();
            if wait != "none" {
                headers.insert("retry-after", wait.parse().unwrap());
            }
            (
                StatusCode::SERVICE_UNAVAILABLE,
                headers,
                Json(json!({"error": "busy"})),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let mut targets = Targets::default();
    let http = HttpTarget::new(
        &url,
        Duration::from_secs(5),
        flotilla_worker::targets::http::DEFAULT_MAX_RESPONSE_BYTES,
    )
    .unwrap();
    targets.register("busy", Arc::new(http), 8);
    let clock = manual_clock();
    let engine = engine(&pool, targets, clock.clone(), "w");
    let cases = [
        ("120", Duration::from_secs(120)..=Duration::from_secs(120)),
        ("86400", Duration::from_secs(300)..=Duration::from_secs(300)),
        (
            "none",
            Duration::from_millis(2_500)..=Duration::from_secs(5),
        ),
    ];
    for (wait, expected) in cases {
        let name = format!("busy-{wait}");
        let mut workflow = one_step(&name, "busy", json!({}));
        workflow["steps"][0]["method"] = json!(wait);
        engine.register_workflow(&workflow).await.unwrap();
        let job_id = submit(&engine, &name, json!({})).await;
        assert_eq!(engine.run_once().await.unwrap(), Outcome::Requeued(job_id));
        let pause = (row(&pool, job_id).await.run_after - clock.now())
            .to_std()
            .unwrap();
        assert!(expected.contains(&pause), "Retry-After {wait}: {pause:?}");
    }
}
