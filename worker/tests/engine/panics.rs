//! A panic, or a result too large for the wire, settles its own job; the
//! claim loop and every other job go on.

use std::sync::Arc;
use std::time::Duration;

use flotilla_store::RunStatus;
use flotilla_worker::engine::{Engine, Outcome};
use flotilla_worker::targets::{FnTarget, StepFailure, TargetCall, Targets};
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::support::{engine, eventually, manual_clock, row, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// `fragile`: panics when the input says so; `big`: answers `size` bytes.
fn targets() -> Targets {
    let mut targets = Targets::default();
    targets.register(
        "fragile",
        Arc::new(FnTarget(|call: TargetCall| async move {
            assert!(
                call.request["explode"] != true,
                "the target blew up on purpose"
            );
            Ok::<_, StepFailure>(json!({"ok": true}))
        })),
        8,
    );
    targets.register(
        "big",
        Arc::new(FnTarget(|call: TargetCall| async move {
            let size = call.request["size"].as_u64().unwrap_or(0) as usize;
            Ok::<_, StepFailure>(json!({"blob": "x".repeat(size)}))
        })),
        8,
    );
    targets
}

async fn register(engine: &Engine, name: &str, target: &str, rules: &[&str]) {
    engine
        .register_workflow(&json!({"name": name, "input_schema": {},
            "steps": [{"name": "call", "target": target, "method": "m", "rules": rules}]}))
        .await
        .unwrap();
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_panic_in_a_step_fails_that_job_with_the_panic_message_and_the_loop_goes_on(
    pool: PgPool,
) {
    let engine = engine(&pool, targets(), manual_clock(), "w");
    register(&engine, "fragile", "fragile", &["explode = input.explode"]).await;
    let doomed = submit(&engine, "fragile", json!({"explode": true})).await;
    let fine = submit(&engine, "fragile", json!({"explode": false})).await;
    let stop = CancellationToken::new();
    let mut settings = engine.settings().clone();
    settings.claim_loops = 1;
    let single = Engine::new(pool.clone(), targets(), manual_clock(), settings);
    let runner = tokio::spawn({
        let (single, stop) = (single.clone(), stop.clone());
        async move { single.run(stop, Duration::from_secs(5)).await }
    });
    eventually(
        Duration::from_secs(20),
        "both jobs settled by the one loop",
        || async {
            row(&pool, doomed).await.status == RunStatus::Failed
                && row(&pool, fine).await.status == RunStatus::Completed
        },
    )
    .await;
    let failed = row(&pool, doomed).await;
    let error = failed.error.unwrap();
    assert!(
        error.contains("panicked") && error.contains("blew up on purpose"),
        "{error}"
    );
    assert_eq!(failed.attempt, 1, "a defect, not a retry");
    assert!(
        single.health().problems().is_empty(),
        "the loop is still running"
    );
    stop.cancel();
    runner.await.unwrap();
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_result_too_large_for_an_event_fails_the_job_at_completion(pool: PgPool) {
    let mut settings = crate::support::settings("w");
    settings.max_event_bytes = 64 * 1024;
    let engine = Engine::new(pool.clone(), targets(), manual_clock(), settings);
    register(&engine, "big", "big", &["size = input.size"]).await;
    let small = submit(&engine, "big", json!({"size": 1000})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(small));
    let large = submit(&engine, "big", json!({"size": 100_000})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(large));
    let error = row(&pool, large).await.error.unwrap();
    assert!(error.contains("event limit of 65536 bytes"), "{error}");
}
