//! A `start` step with `for_each`: one child per item, ids derived from
//! the parent, the step and the index; at most `parallelism` running at
//! once; the step's response the children's results in item order; a
//! child that fails fails the step; the family bound holds.

use std::collections::BTreeSet;

use flotilla_store::RunStatus;
use flotilla_worker::engine::{Engine, Outcome, child_id};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{Calls, echo_targets, manual_clock, row, settings, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// `ship-line` (the child): one echo step; a line of `"broken"` fails.
fn ship_line() -> Value {
    json!({
        "name": "ship-line", "input_schema": {},
        "steps": [{"name": "ship", "target": "echo", "method": "ship", "rules": ["sku = input.sku"],
                   "validate": ["response.request.sku != 'broken'"]}],
        "output": ["shipped = steps.ship.request.sku"]
    })
}

/// `order` (the parent): a child per line, two at a time, then a summary.
fn order() -> Value {
    json!({
        "name": "order", "input_schema": {}, "parallelism": 2,
        "steps": [
            {"name": "lines", "for_each": "input.lines",
             "start": {"workflow": "ship-line", "input": ["sku = item", "position = index"]}},
            {"name": "sum", "target": "echo", "method": "sum", "rules": ["count = size(steps.lines)"]}
        ],
        "output": ["shipped = steps.lines.map(l, l.shipped)"]
    })
}

async fn fleet(pool: &PgPool, max_family_jobs: i32) -> Engine {
    let mut settings = settings("w");
    settings.max_family_jobs = max_family_jobs;
    let engine = Engine::new(
        pool.clone(),
        echo_targets(&Calls::default()),
        manual_clock(),
        settings,
    );
    for document in [ship_line(), order()] {
        engine.register_workflow(&document).await.unwrap();
    }
    engine
}

async fn children_of(pool: &PgPool, parent: Uuid) -> BTreeSet<(String, Uuid)> {
    sqlx::query_as::<_, (String, Uuid)>(
        "SELECT parent_step, job_id FROM workflow_run WHERE parent_job_id = $1",
    )
    .bind(parent)
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

/// Runs segments until nothing is left to run.
async fn settle(engine: &Engine) {
    for _ in 0..100 {
        if engine.run_once().await.unwrap() == Outcome::Idle {
            return;
        }
    }
    panic!("the jobs never settled");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_child_per_item_runs_two_at_a_time_and_the_results_come_in_item_order(pool: PgPool) {
    let engine = fleet(&pool, 1_000).await;
    let lines = ["a", "b", "c", "d", "e"];
    let parent = submit(&engine, "order", json!({"lines": lines})).await;

    // The first segment starts two children, the parallelism, and parks.
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(parent));
    let key = |i: usize| format!("lines[{i}]");
    let first: BTreeSet<_> = (0..2)
        .map(|i| (key(i), child_id(parent, &key(i))))
        .collect();
    assert_eq!(children_of(&pool, parent).await, first);

    // Never more than two unfinished at once, whatever runs next.
    for _ in 0..100 {
        if engine.run_once().await.unwrap() == Outcome::Idle {
            break;
        }
        let unfinished: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM workflow_run WHERE parent_job_id = $1
               AND status NOT IN ('COMPLETED', 'FAILED', 'DEAD', 'CANCELLED')",
        )
        .bind(parent)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(unfinished <= 2, "{unfinished} children running at once");
    }
    let done = row(&pool, parent).await;
    assert_eq!(done.status, RunStatus::Completed, "{:?}", done.error);
    assert_eq!(done.result.as_ref().unwrap().0, json!({"shipped": lines}));
    let all: BTreeSet<_> = (0..5)
        .map(|i| (key(i), child_id(parent, &key(i))))
        .collect();
    assert_eq!(
        children_of(&pool, parent).await,
        all,
        "one child per item, no more"
    );
    assert_eq!(
        done.reader_level,
        flotilla_store::runs::STEP_FORMS_READER_LEVEL
    );
    let started = done
        .checkpoints
        .0
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| !c["child"].is_null())
        .count();
    assert_eq!(started, 5, "one child-started checkpoint per item");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_failed_child_fails_the_step_and_the_family_bound_holds(pool: PgPool) {
    let engine = fleet(&pool, 1_000).await;
    let parent = submit(&engine, "order", json!({"lines": ["a", "broken", "c"]})).await;
    settle(&engine).await;
    let failed = row(&pool, parent).await;
    assert_eq!(failed.status, RunStatus::Failed);
    let error = failed.error.unwrap_or_default();
    assert!(
        error.contains("child job") && error.contains("FAILED"),
        "{error}"
    );

    // A family of at most three jobs: the parent and two children.
    let bounded = fleet(&pool, 3).await;
    let parent = submit(&bounded, "order", json!({"lines": ["a", "b", "c", "d"]})).await;
    settle(&bounded).await;
    let stopped = row(&pool, parent).await;
    assert_eq!(stopped.status, RunStatus::Failed);
    let error = stopped.error.unwrap_or_default();
    assert!(error.contains("FLOTILLA_MAX_FAMILY_JOBS"), "{error}");
    assert_eq!(
        children_of(&pool, parent).await.len(),
        2,
        "the family grew past its bound"
    );
}

#[test]
fn a_step_named_as_an_items_child_is_refused() {
    let mut document = order();
    document["steps"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "lines[3]", "target": "echo", "method": "x"}));
    let refused = flotilla_worker::workflow::CompiledWorkflow::compile(
        &document,
        &["echo".to_owned()].into(),
    )
    .unwrap_err();
    assert!(
        refused
            .problems
            .iter()
            .any(|p| p.step.as_deref() == Some("lines[3]") && p.field == "name"),
        "{refused}"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn cancelling_the_parent_cancels_every_items_child(pool: PgPool) {
    use flotilla_worker::engine::Cancelled;
    let engine = fleet(&pool, 1_000).await;
    let parent = submit(&engine, "order", json!({"lines": ["a", "b", "c"]})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(parent));
    let Cancelled::Done(_) = engine.cancel(parent, "not needed").await.unwrap() else {
        panic!("a waiting parent is cancelled in place")
    };
    for (_, child) in children_of(&pool, parent).await {
        assert_eq!(row(&pool, child).await.status, RunStatus::Cancelled);
    }
    settle(&engine).await;
    assert_eq!(
        children_of(&pool, parent).await.len(),
        2,
        "no child started after the cancel"
    );
}

/// A child that ends while its parent still runs another branch, before
/// the parent parks on it: the park finds its outcome and the parent goes
/// on, rather than waiting for a wake-up that already happened.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_child_that_ends_before_its_parent_parks_does_not_strand_it(pool: PgPool) {
    use flotilla_worker::targets::{FnTarget, StepFailure, TargetCall};
    use std::sync::Arc;
    // Another worker, which runs the child while the parent's other
    // branch is under way.
    let other = fleet(&pool, 1_000).await;
    let mut targets = echo_targets(&Calls::default());
    targets.register(
        "elsewhere",
        Arc::new(FnTarget(move |_: TargetCall| {
            let other = other.clone();
            async move {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
                while !matches!(other.run_once().await, Ok(Outcome::Completed(_))) {
                    assert!(std::time::Instant::now() < deadline, "the child never ran");
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Ok::<_, StepFailure>(json!({"ran": "the child"}))
            }
        })),
        8,
    );
    let mut settings = settings("parent-worker");
    settings.max_family_jobs = 1_000;
    let engine = Engine::new(pool.clone(), targets, manual_clock(), settings);
    engine
        .register_workflow(&json!({
            "name": "branches", "input_schema": {}, "parallelism": 2,
            "steps": [
                {"name": "lines", "needs": [], "for_each": "input.lines",
                 "start": {"workflow": "ship-line", "input": ["sku = item"]}},
                {"name": "meanwhile", "needs": [], "target": "elsewhere", "method": "wait"}
            ]
        }))
        .await
        .unwrap();
    let parent = submit(&engine, "branches", json!({"lines": ["a"]})).await;
    // Its one segment starts the child, waits on the other branch while
    // the other worker completes the child, then parks: woken at once.
    let first = engine.run_once().await.unwrap();
    assert!(matches!(first, Outcome::Parked(_)), "{first:?}");
    let parked = row(&pool, parent).await;
    assert_eq!(
        parked.status,
        RunStatus::Queued,
        "the park found the child's end"
    );
    settle(&engine).await;
    assert_eq!(row(&pool, parent).await.status, RunStatus::Completed);
}
