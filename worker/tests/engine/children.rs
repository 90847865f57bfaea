//! Child workflows: a `start` step submits a child whose id is derived from
//! the parent and the step, in the parent's fenced write; the parent waits
//! with no lease held; the child's end reaches the parent in the child's
//! own transaction; a failed child fails the step, a retried parent retries
//! the child; cancelling a parent cancels its children unless the step
//! says not to; a parent whose worker dies while it starts a child never
//! starts a second one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use flotilla_contracts::WorkflowRunEventType as E;
use flotilla_store::RunStatus;
use flotilla_worker::engine::child_id;
use flotilla_worker::engine::{Cancelled, Engine, Outcome};
use flotilla_worker::targets::{FnTarget, StepFailure, TargetCall, Targets};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::support::{Calls, echo_targets, events, manual_clock, row, settings, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// `check` (the child): one echo step, refusing a name `"mallory"`.
fn check() -> Value {
    json!({
        "name": "check", "input_schema": {},
        "steps": [{"name": "look", "target": "echo", "method": "look", "rules": ["who = input.who"],
                   "validate": ["response.request.who != 'mallory'"]}],
        "output": ["checked = steps.look.request.who"]
    })
}

/// `onboard` (the parent): starts `check` for the input's name, then
/// greets with the child's answer.
fn onboard() -> Value {
    json!({
        "name": "onboard", "input_schema": {},
        "steps": [
            {"name": "verify", "start": {"workflow": "check", "input": ["who = input.name"]},
             "output_schema": {"type": "object", "required": ["checked"]}},
            {"name": "greet", "target": "echo", "method": "greet", "rules": ["who = steps.verify.checked"]}
        ],
        "output": ["greeted = steps.greet.request.who"]
    })
}

async fn fleet_with(pool: &PgPool, targets: Targets) -> Engine {
    let engine = Engine::new(pool.clone(), targets, manual_clock(), settings("w"));
    for document in [check(), onboard()] {
        engine.register_workflow(&document).await.unwrap();
    }
    engine
}

async fn children_of(pool: &PgPool, parent: Uuid) -> Vec<(Uuid, String, RunStatus)> {
    sqlx::query_as("SELECT job_id, parent_step, status FROM workflow_run WHERE parent_job_id = $1")
        .bind(parent)
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_completed_child_completes_its_parents_step_with_its_result(pool: PgPool) {
    let calls = Calls::default();
    let engine = fleet_with(&pool, echo_targets(&calls)).await;
    let parent = submit(&engine, "onboard", json!({"name": "ada"})).await;

    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(parent));
    let child = child_id(parent, "verify");
    assert_eq!(
        children_of(&pool, parent).await,
        [(child, "verify".to_owned(), RunStatus::Queued)]
    );
    let parked = row(&pool, parent).await;
    assert_eq!(
        (parked.status, parked.lease_owner.as_deref()),
        (RunStatus::Waiting, None),
        "the parent waits with no lease"
    );
    assert_eq!(row(&pool, child).await.depth, 1);

    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(child));
    assert_eq!(
        row(&pool, parent).await.status,
        RunStatus::Queued,
        "the child's end queued its parent in the same transaction"
    );
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(parent));
    let done = row(&pool, parent).await;
    assert_eq!(done.result.unwrap().0, json!({"greeted": "ada"}));
    let verdicts: Vec<String> = events(&pool, parent)
        .await
        .iter()
        .filter(|e| e.event_type() == E::StepCheckpoint)
        .filter_map(|e| e.verdict().map(str::to_owned))
        .collect();
    assert_eq!(verdicts, [format!("child {child} started")]);
    assert_eq!(calls.of(child), ["look"]);
    assert_eq!(calls.of(parent), ["greet"], "a start step calls no target");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_failed_child_fails_the_step_and_retrying_the_parent_retries_the_same_child(
    pool: PgPool,
) {
    let engine = fleet_with(&pool, echo_targets(&Calls::default())).await;
    let parent = submit(&engine, "onboard", json!({"name": "mallory"})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(parent));
    let child = child_id(parent, "verify");
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(child));
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(parent));
    let failed = row(&pool, parent).await;
    let error = failed.error.unwrap_or_default();
    assert!(
        error.contains(&child.to_string()) && error.contains("FAILED"),
        "the child's reason: {error}"
    );

    engine.retry(parent).await.unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(parent));
    assert_eq!(
        children_of(&pool, parent).await,
        [(child, "verify".to_owned(), RunStatus::Queued)],
        "the same child, retried; never a second"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn cancelling_a_parent_cancels_its_children_unless_the_step_opts_out(pool: PgPool) {
    let engine = fleet_with(&pool, echo_targets(&Calls::default())).await;
    engine
        .register_workflow(&json!({
            "name": "both", "input_schema": {}, "parallelism": 2,
            "steps": [
                {"name": "linked", "needs": [], "start": {"workflow": "check", "input": ["who = 'a'"]}},
                {"name": "loose", "needs": [], "start": {"workflow": "check", "input": ["who = 'b'"]},
                 "cancel_children": false}
            ]
        }))
        .await
        .unwrap();
    let parent = submit(&engine, "both", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(parent));
    assert_eq!(children_of(&pool, parent).await.len(), 2);

    let Cancelled::Done(_) = engine.cancel(parent, "changed my mind").await.unwrap() else {
        panic!("a waiting parent is cancelled in place")
    };
    let linked = row(&pool, child_id(parent, "linked")).await;
    assert_eq!(linked.status, RunStatus::Cancelled);
    assert!(
        linked
            .error
            .unwrap_or_default()
            .contains(&parent.to_string()),
        "says whose cancel it was"
    );
    assert_eq!(
        row(&pool, child_id(parent, "loose")).await.status,
        RunStatus::Queued,
        "cancel_children: false keeps it"
    );
}

/// `echo`, and `hang`, which blocks its first call until the test ends.
fn echo_and_a_first_call_that_hangs(started: Arc<Notify>) -> Targets {
    let mut targets = echo_targets(&Calls::default());
    let hung = Arc::new(AtomicBool::new(false));
    targets.register(
        "hang",
        Arc::new(FnTarget(move |_call: TargetCall| {
            let (started, first) = (started.clone(), !hung.swap(true, Ordering::SeqCst));
            async move {
                if first {
                    started.notify_one();
                    std::future::pending::<()>().await;
                }
                Ok::<_, StepFailure>(json!({"ok": true}))
            }
        })),
        8,
    );
    targets
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_parent_whose_worker_dies_after_starting_a_child_never_starts_a_second(pool: PgPool) {
    let started = Arc::new(Notify::new());
    let clock = manual_clock();
    let engine = Engine::new(
        pool.clone(),
        echo_and_a_first_call_that_hangs(started.clone()),
        clock.clone(),
        settings("w"),
    );
    engine.register_workflow(&check()).await.unwrap();
    engine
        .register_workflow(&json!({
            "name": "racy", "input_schema": {},
            "steps": [
                {"name": "verify", "needs": [], "start": {"workflow": "check", "input": ["who = 'x'"]}},
                {"name": "slow", "needs": [], "target": "hang", "method": "m"}
            ]
        }))
        .await
        .unwrap();
    let parent = submit(&engine, "racy", json!({})).await;
    let segment = tokio::spawn({
        let engine = engine.clone();
        async move { engine.run_once().await }
    });
    tokio::time::timeout(Duration::from_secs(10), started.notified())
        .await
        .expect("the slow call never started");
    // The child's start commits while the slow call hangs; then the worker dies.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while children_of(&pool, parent).await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the child never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    segment.abort();
    let _ = segment.await;

    clock.advance(Duration::from_secs(120));
    assert_eq!(engine.sweep().await.unwrap(), 1, "its lease lapsed");
    clock.advance(Duration::from_secs(60));
    let mut outcomes = Vec::new();
    loop {
        let outcome = engine.run_once().await.unwrap();
        if outcome == Outcome::Idle {
            break;
        }
        outcomes.push(outcome);
        assert!(outcomes.len() < 10, "{outcomes:?}");
    }
    let child = child_id(parent, "verify");
    assert!(
        outcomes.contains(&Outcome::Completed(parent)),
        "{outcomes:?}"
    );
    assert_eq!(
        children_of(&pool, parent).await,
        [(child, "verify".to_owned(), RunStatus::Completed)],
        "the resumed parent took the child it started; never a second"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_start_step_calls_nothing_and_its_definition_says_so(pool: PgPool) {
    let engine = fleet_with(&pool, echo_targets(&Calls::default())).await;
    let refused = engine
        .register_workflow(&json!({
            "name": "bad", "input_schema": {},
            "steps": [{"name": "s", "start": {"workflow": "check"}, "target": "echo", "method": "m",
                       "rules": ["a = 1"]}]
        }))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("target") && refused.contains("start.input"),
        "{refused}"
    );
    let loose = engine
        .register_workflow(&json!({
            "name": "loose", "input_schema": {},
            "steps": [{"name": "s", "target": "echo", "method": "m", "cancel_children": false}]
        }))
        .await
        .unwrap_err()
        .to_string();
    assert!(loose.contains("cancel_children"), "{loose}");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_workflow_that_starts_itself_stops_at_the_depth_bound(pool: PgPool) {
    let engine = fleet_with(&pool, echo_targets(&Calls::default())).await;
    engine
        .register_workflow(&json!({
            "name": "nest", "input_schema": {},
            "steps": [{"name": "again", "start": {"workflow": "nest"}}]
        }))
        .await
        .unwrap();
    let root = submit(&engine, "nest", json!({})).await;
    let mut segments = 0;
    while engine.run_once().await.unwrap() != Outcome::Idle {
        segments += 1;
        assert!(segments < 100, "the family never stopped growing");
    }
    let family: Vec<(i16, RunStatus)> =
        sqlx::query_as("SELECT depth, status FROM workflow_run ORDER BY depth")
            .fetch_all(&pool)
            .await
            .unwrap();
    let depths: Vec<i16> = family.iter().map(|(depth, _)| *depth).collect();
    assert_eq!(
        depths,
        (0..=8).collect::<Vec<i16>>(),
        "nine generations, each once"
    );
    assert!(
        family
            .iter()
            .all(|(_, status)| *status == RunStatus::Failed),
        "{family:?}"
    );
    let deepest = sqlx::query_scalar::<_, String>("SELECT error FROM workflow_run WHERE depth = 8")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(deepest.contains("at most 8 deep"), "{deepest}");
    assert_eq!(row(&pool, root).await.status, RunStatus::Failed);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_child_that_ends_after_its_parent_was_claimed_is_taken_not_started_again(pool: PgPool) {
    let engine = fleet_with(&pool, echo_targets(&Calls::default())).await;
    let parent = submit(&engine, "onboard", json!({"name": "ada"})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(parent));
    // Something woke the parent (a spurious wake-up): it is claimed before
    // its child ends, so its snapshot holds no outcome for the step.
    sqlx::query(
        "UPDATE workflow_run SET status = 'QUEUED', outstanding_step = NULL, run_after = '2000-01-01'
         WHERE job_id = $1",
    )
    .bind(parent)
    .execute(&pool)
    .await
    .unwrap();
    let claimed = engine
        .claim()
        .await
        .unwrap()
        .expect("the parent is claimable");
    assert_eq!(claimed.job_id(), parent);
    let child = child_id(parent, "verify");
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(child));

    assert_eq!(
        engine.run_segment(claimed).await,
        Outcome::Completed(parent),
        "the step took the outcome the child left meanwhile"
    );
    let started = events(&pool, parent)
        .await
        .iter()
        .filter(|e| e.verdict().is_some_and(|v| v.ends_with("started")))
        .count();
    assert_eq!(started, 1, "the child was started once");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_start_step_is_not_answered_through_complete_step(pool: PgPool) {
    let engine = fleet_with(&pool, echo_targets(&Calls::default())).await;
    let parent = submit(&engine, "onboard", json!({"name": "ada"})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(parent));
    let answered = engine
        .complete_step(parent, "verify", json!({"checked": "eve"}))
        .await
        .unwrap();
    assert!(
        matches!(
            answered,
            flotilla_worker::engine::CompleteOutcome::WrongState { .. }
        ),
        "{answered:?}"
    );
    assert_eq!(row(&pool, parent).await.status, RunStatus::Waiting);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_workflow_that_starts_three_of_itself_stops_at_the_family_bound(pool: PgPool) {
    let mut settings = settings("w");
    settings.max_family_jobs = 20;
    let engine = Engine::new(
        pool.clone(),
        echo_targets(&Calls::default()),
        manual_clock(),
        settings,
    );
    engine
        .register_workflow(&json!({
            "name": "bomb", "input_schema": {},
            "steps": [
                {"name": "a", "needs": [], "start": {"workflow": "bomb"}},
                {"name": "b", "needs": [], "start": {"workflow": "bomb"}},
                {"name": "c", "needs": [], "start": {"workflow": "bomb"}}
            ]
        }))
        .await
        .unwrap();
    let root = submit(&engine, "bomb", json!({})).await;
    // Unbounded, three per level to depth 8 would be 9,841 jobs.
    let mut segments = 0;
    while engine.run_once().await.unwrap() != Outcome::Idle {
        segments += 1;
        assert!(segments < 200, "the family never stopped growing");
    }
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM workflow_run")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(jobs, 20, "the family holds exactly its bound");
    let refused: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT error, verdict FROM workflow_run WHERE verdict LIKE 'max_family_jobs%'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(
        !refused.is_empty(),
        "no job was refused a child by the bound"
    );
    for (error, verdict) in &refused {
        assert!(
            error.contains("the family of job") && error.contains("has 20 jobs"),
            "{error}"
        );
        assert_eq!(verdict.as_deref(), Some("max_family_jobs: 20"));
    }
    assert_eq!(row(&pool, root).await.status, RunStatus::Failed);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_definition_may_start_at_most_64_children(pool: PgPool) {
    let engine = fleet_with(&pool, echo_targets(&Calls::default())).await;
    let steps: Vec<Value> = (0..65)
        .map(|i| json!({"name": format!("s{i}"), "start": {"workflow": "check"}}))
        .collect();
    let refused = engine
        .register_workflow(&json!({"name": "wide", "input_schema": {}, "steps": steps}))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("65 start steps, over the limit of 64"),
        "{refused}"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_child_that_went_dead_on_its_own_retries_is_not_retried_by_its_parent(pool: PgPool) {
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut targets = Targets::default();
    let counted = calls.clone();
    targets.register(
        "down",
        Arc::new(FnTarget(move |_call: TargetCall| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                Err::<Value, _>(StepFailure::retryable(
                    flotilla_worker::targets::RetryClass::Other,
                    "503",
                ))
            }
        })),
        8,
    );
    let mut settings = settings("w");
    settings.backoff_base = Duration::ZERO;
    let engine = Engine::new(pool.clone(), targets, manual_clock(), settings);
    for document in [
        json!({"name": "leaf", "input_schema": {}, "max_attempts": 3,
               "steps": [{"name": "call", "target": "down", "method": "m"}]}),
        json!({"name": "middle", "input_schema": {}, "max_attempts": 3,
               "steps": [{"name": "leaf", "start": {"workflow": "leaf"}}]}),
        json!({"name": "top", "input_schema": {}, "max_attempts": 3,
               "steps": [{"name": "middle", "start": {"workflow": "middle"}}]}),
    ] {
        engine.register_workflow(&document).await.unwrap();
    }
    let top = submit(&engine, "top", json!({})).await;
    let mut segments = 0;
    while engine.run_once().await.unwrap() != Outcome::Idle {
        segments += 1;
        assert!(segments < 100, "the family never settled");
    }
    // The leaf's own three attempts, once: not 3 × 3 × 3.
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let ended = row(&pool, top).await;
    assert_eq!(ended.status, RunStatus::Failed);
    let error = ended.error.unwrap_or_default();
    assert!(error.contains("ended DEAD"), "{error}");
}

/// `parent`: starts `waiter` (which waits for a signal that never comes)
/// beside a step that fails as a verdict; `cancel_children` as given.
fn failing_parent(cancel_children: bool) -> Value {
    json!({
        "name": "failing-parent", "input_schema": {},
        "steps": [
            {"name": "kid", "needs": [], "start": {"workflow": "waiter"},
             "cancel_children": cancel_children},
            {"name": "boom", "needs": [], "target": "echo", "method": "m", "validate": ["false"]}
        ]
    })
}

async fn parent_fails_beside_its_child(pool: &PgPool, cancel_children: bool) -> (Uuid, Uuid) {
    let engine = fleet_with(pool, echo_targets(&Calls::default())).await;
    for document in [
        json!({"name": "waiter", "input_schema": {},
               "steps": [{"name": "hear", "wait_for": "never"}]}),
        failing_parent(cancel_children),
    ] {
        engine.register_workflow(&document).await.unwrap();
    }
    let parent = submit(&engine, "failing-parent", json!({})).await;
    let mut segments = 0;
    while engine.run_once().await.unwrap() != Outcome::Idle {
        segments += 1;
        assert!(segments < 20, "the family never settled");
    }
    assert_eq!(row(pool, parent).await.status, RunStatus::Failed);
    (parent, child_id(parent, "kid"))
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_parent_that_fails_cancels_its_unfinished_children(pool: PgPool) {
    let (parent, child) = parent_fails_beside_its_child(&pool, true).await;
    let orphan = row(&pool, child).await;
    assert_eq!(
        orphan.status,
        RunStatus::Cancelled,
        "the child outlived its failed parent"
    );
    let error = orphan.error.unwrap_or_default();
    assert!(
        error.contains(&format!("its parent {parent} ended FAILED")),
        "{error}"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_child_whose_step_opts_out_outlives_its_failed_parent(pool: PgPool) {
    let (_, child) = parent_fails_beside_its_child(&pool, false).await;
    assert_eq!(row(&pool, child).await.status, RunStatus::Waiting);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_retried_parent_whose_child_retention_removed_fails_the_step_instead_of_waiting(
    pool: PgPool,
) {
    let engine = fleet_with(&pool, echo_targets(&Calls::default())).await;
    engine
        .register_workflow(&json!({
            "name": "check-then-fail", "input_schema": {},
            "steps": [
                {"name": "verify", "start": {"workflow": "check", "input": ["who = 'mallory'"]}}
            ]
        }))
        .await
        .unwrap();
    let parent = submit(&engine, "check-then-fail", json!({})).await;
    while engine.run_once().await.unwrap() != Outcome::Idle {}
    assert_eq!(row(&pool, parent).await.status, RunStatus::Failed);
    // The child FAILED, so did its step; retention removes the child,
    // keeping its id as removed.
    let child = child_id(parent, "verify");
    sqlx::query(
        "INSERT INTO workflow_run_removed (job_id, workflow_name, request_digest, status, finished_at, removed_at)
         SELECT job_id, workflow_name, request_digest, status, updated_at, now() FROM workflow_run WHERE job_id = $1",
    )
    .bind(child)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("DELETE FROM workflow_run WHERE job_id = $1")
        .bind(child)
        .execute(&pool)
        .await
        .unwrap();
    engine.retry(parent).await.unwrap();
    let mut segments = 0;
    while engine.run_once().await.unwrap() != Outcome::Idle {
        segments += 1;
        assert!(segments < 20, "the retried parent never settled");
    }
    let retried = row(&pool, parent).await;
    assert_eq!(
        retried.status,
        RunStatus::Failed,
        "the parent waits for a child that is gone"
    );
    let error = retried.error.unwrap_or_default();
    assert!(error.contains("was removed"), "{error}");
}

/// A parent parked on a human step wakes when a child it also waits for
/// finishes (issue 49: a parked job wakes on anything it awaits), takes
/// the child's answer, runs what needed it, and waits for the human again.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_parent_parked_on_another_step_wakes_when_its_child_finishes(pool: PgPool) {
    let calls = Calls::default();
    let engine = fleet_with(&pool, echo_targets(&calls)).await;
    engine
        .register_workflow(&json!({
            "name": "two-waits", "input_schema": {},
            "steps": [
                {"name": "approve", "needs": [], "target": "echo", "method": "m",
                 "completion": "external"},
                {"name": "verify", "needs": [], "start": {"workflow": "check", "input": ["who = 'ada'"]}},
                {"name": "greet", "needs": ["verify"], "target": "echo", "method": "greet"}
            ]
        }))
        .await
        .unwrap();
    let parent = submit(&engine, "two-waits", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(parent));
    assert_eq!(
        row(&pool, parent).await.outstanding_step.as_deref(),
        Some("approve"),
        "the parent waits for the human first"
    );
    let child = child_id(parent, "verify");
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(child));
    assert_eq!(
        row(&pool, parent).await.status,
        RunStatus::Queued,
        "the child's end did not wake its parent"
    );
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(parent));
    assert!(
        calls.of(parent).contains(&"greet".to_owned()),
        "{:?}",
        calls.of(parent)
    );
    assert_eq!(
        row(&pool, parent).await.outstanding_step.as_deref(),
        Some("approve")
    );
}

/// One lock order between a child and its parent (issue 49): a child's
/// terminal write locks the child, then (its trigger) the parent; a
/// parent starting that child again takes the child's lock before its own
/// row's, so the two queue instead of deadlocking. Here another session
/// holds the child and then writes the parent, as a child's end does,
/// while the retried parent's start step runs.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_parent_restarting_its_child_and_the_childs_own_write_do_not_deadlock(pool: PgPool) {
    let engine = fleet_with(&pool, echo_targets(&Calls::default())).await;
    engine
        .register_workflow(&json!({
            "name": "check-mallory", "input_schema": {},
            "steps": [{"name": "verify", "start": {"workflow": "check", "input": ["who = 'mallory'"]}}]
        }))
        .await
        .unwrap();
    let parent = submit(&engine, "check-mallory", json!({})).await;
    while engine.run_once().await.unwrap() != Outcome::Idle {}
    assert_eq!(row(&pool, parent).await.status, RunStatus::Failed);
    let child = child_id(parent, "verify");
    engine.retry(parent).await.unwrap();

    // The "child's write": holds the child row.
    let mut other = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM workflow_run WHERE job_id = $1 FOR UPDATE")
        .bind(child)
        .execute(&mut *other)
        .await
        .unwrap();
    let running = tokio::spawn({
        let engine = engine.clone();
        async move { engine.run_once().await }
    });
    // Wait until the parent's segment waits for a row lock.
    crate::support::eventually(
        Duration::from_secs(10),
        "the parent to wait for a lock",
        || {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>(
                    "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND datname = current_database()",
                )
                .fetch_one(&pool)
                .await
                .unwrap()
                    > 0
            }
        },
    )
    .await;
    // Then it writes the parent, as the child's trigger does.
    let wrote = sqlx::query("UPDATE workflow_run SET updated_at = updated_at WHERE job_id = $1")
        .bind(parent)
        .execute(&mut *other)
        .await;
    assert!(wrote.is_ok(), "the child's side deadlocked: {wrote:?}");
    other.commit().await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the parent's segment never ended")
        .unwrap();
    assert!(
        matches!(outcome, Ok(Outcome::Parked(p)) if p == parent),
        "the parent's side failed: {outcome:?}"
    );
}
