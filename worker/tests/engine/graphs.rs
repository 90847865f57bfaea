//! Workflows as graphs: steps that name their `needs` run side by side,
//! a join waits for every branch, `when` skips a step, and a resumed or
//! retried job calls exactly the steps without a checkpoint.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_contracts::WorkflowRunEventType;
use flotilla_store::RunStatus;
use flotilla_worker::engine::{Clock as _, Outcome};
use flotilla_worker::targets::{FnTarget, RetryClass, StepFailure, TargetCall, Targets};
use serde_json::{Value, json};
use sqlx::PgPool;

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

use crate::support::{
    Calls, checkpoint_names, echo_targets, engine, events, manual_clock, row, submit,
};

/// One call a target saw: its step, and when it started and ended.
#[derive(Debug, Clone)]
struct Timed {
    step: String,
    request: Value,
    started: Instant,
    ended: Instant,
}

/// A target `slow` that answers after `request.ms` milliseconds (default
/// 0), recording each call's times and the most calls at once.
#[derive(Default, Clone)]
struct Clocked {
    calls: Arc<Mutex<Vec<Timed>>>,
    now: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl Clocked {
    fn targets(&self, cap: usize) -> Targets {
        let me = self.clone();
        let mut targets = Targets::default();
        targets.register(
            "slow",
            Arc::new(FnTarget(move |call: TargetCall| {
                let me = me.clone();
                async move {
                    let at_once = me.now.fetch_add(1, Ordering::SeqCst) + 1;
                    me.most.fetch_max(at_once, Ordering::SeqCst);
                    let started = Instant::now();
                    let ms = call.request["ms"].as_u64().unwrap_or(0);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    me.now.fetch_sub(1, Ordering::SeqCst);
                    me.calls.lock().unwrap().push(Timed {
                        step: call.step_name.clone(),
                        request: call.request.clone(),
                        started,
                        ended: Instant::now(),
                    });
                    Ok::<_, StepFailure>(json!({"step": call.step_name, "request": call.request}))
                }
            })),
            cap,
        );
        targets
    }

    fn of(&self, step_prefix: &str) -> Vec<Timed> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.step.starts_with(step_prefix))
            .cloned()
            .collect()
    }
}

fn step(name: &str, needs: &[&str]) -> Value {
    json!({"name": name, "target": "slow", "method": "go", "needs": needs})
}

/// `start` → ten branches `b0`..`b9` (each `ms` long) → `join`.
fn fan_out(ms: u64, parallelism: Option<u32>) -> Value {
    let branches: Vec<String> = (0..10).map(|i| format!("b{i}")).collect();
    let names: Vec<&str> = branches.iter().map(String::as_str).collect();
    let mut steps = vec![step("start", &[])];
    for (i, name) in names.iter().enumerate() {
        let mut branch = step(name, &["start"]);
        branch["rules"] = json!([format!("ms = {ms}"), format!("i = {i}")]);
        steps.push(branch);
    }
    let mut join = step("join", &names);
    join["rules"] = json!([format!(
        "sum = {}",
        names
            .iter()
            .map(|b| format!("steps.{b}.request.i"))
            .collect::<Vec<_>>()
            .join(" + ")
    )]);
    steps.push(join);
    let mut workflow = json!({"name": "fan", "input_schema": {}, "steps": steps});
    if let Some(parallelism) = parallelism {
        workflow["parallelism"] = json!(parallelism);
    }
    workflow
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn ten_branches_run_at_once_and_the_join_starts_after_all_ten(pool: PgPool) {
    let clocked = Clocked::default();
    let engine = engine(&pool, clocked.targets(16), manual_clock(), "w");
    engine
        .register_workflow(&fan_out(300, Some(10)))
        .await
        .unwrap();
    let job_id = submit(&engine, "fan", json!({})).await;

    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));

    let branches = clocked.of("b");
    assert_eq!(branches.len(), 10);
    let last_start = branches.iter().map(|c| c.started).max().unwrap();
    let first_end = branches.iter().map(|c| c.ended).min().unwrap();
    assert!(
        last_start < first_end,
        "every branch started before any ended (they ran at once)"
    );
    let last_end = branches.iter().map(|c| c.ended).max().unwrap();
    let join = clocked.of("join");
    assert_eq!(join.len(), 1);
    assert!(
        join[0].started >= last_end,
        "the join waited for every branch"
    );
    assert_eq!(join[0].request["sum"], json!(45), "the join read all ten");
    assert_eq!(clocked.most.load(Ordering::SeqCst), 10);

    // One checkpoint per step, each its own event, in commit order, gap-free.
    let done = row(&pool, job_id).await;
    assert_eq!(done.status, RunStatus::Completed);
    let names = checkpoint_names(&done);
    assert_eq!(names.len(), 12);
    assert_eq!((names[0].as_str(), names[11].as_str()), ("start", "join"));
    let events = events(&pool, job_id).await;
    let sequences: Vec<i64> = events.iter().map(|e| e.sequence()).collect();
    assert_eq!(sequences, (1..=14).collect::<Vec<i64>>());
    let checkpointed: Vec<String> = events
        .iter()
        .filter(|e| e.event_type() == WorkflowRunEventType::StepCheckpoint)
        .map(|e| e.step_name().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        checkpointed, names,
        "events in the order of the checkpoints"
    );
    assert_eq!(
        events.last().unwrap().event_type(),
        WorkflowRunEventType::Completed
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn parallelism_bounds_the_steps_of_one_job_called_at_once(pool: PgPool) {
    let clocked = Clocked::default();
    let engine = engine(&pool, clocked.targets(16), manual_clock(), "w");
    engine
        .register_workflow(&fan_out(50, Some(3)))
        .await
        .unwrap();
    let job_id = submit(&engine, "fan", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(clocked.of("b").len(), 10);
    assert_eq!(clocked.most.load(Ordering::SeqCst), 3);
}

/// The job's STEP_CHECKPOINT events: (step, note).
async fn checkpoint_notes(
    pool: &PgPool,
    job_id: uuid::Uuid,
) -> Vec<(Option<String>, Option<String>)> {
    events(pool, job_id)
        .await
        .iter()
        .filter(|e| e.event_type() == WorkflowRunEventType::StepCheckpoint)
        .map(|e| {
            (
                e.step_name().map(str::to_owned),
                e.verdict().map(str::to_owned),
            )
        })
        .collect()
}

/// `check` → `fraud` (only over 100) → `ship`, which reads whether the
/// fraud check ran.
fn conditional() -> Value {
    json!({
        "name": "conditional", "input_schema": {},
        "steps": [
            {"name": "check", "target": "echo", "method": "check"},
            {"name": "fraud", "target": "echo", "method": "fraud", "when": "input.amount > 100"},
            {"name": "ship", "target": "echo", "method": "ship",
             "rules": ["screened = has(steps.fraud)"]}
        ]
    })
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_false_when_skips_the_step_with_its_checkpoint_and_its_dependant_still_runs(
    pool: PgPool,
) {
    let calls = Calls::default();
    let engine = engine(&pool, echo_targets(&calls), manual_clock(), "w");
    engine.register_workflow(&conditional()).await.unwrap();

    let small = submit(&engine, "conditional", json!({"amount": 50})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(small));
    assert_eq!(
        calls.of(small),
        ["check", "ship"],
        "fraud's target never called"
    );
    let done = row(&pool, small).await;
    assert_eq!(
        done.checkpoints.0[1],
        json!({"name": "fraud", "skipped": true, "response": null})
    );
    assert_eq!(
        done.checkpoints.0[2]["response"]["request"],
        json!({"screened": false}),
        "a skipped step is not in its dependants' steps"
    );
    let steps = checkpoint_notes(&pool, small).await;
    assert_eq!(
        steps,
        [
            (Some("check".into()), None),
            (
                Some("fraud".into()),
                Some(flotilla_contracts::SKIPPED.into())
            ),
            (Some("ship".into()), None)
        ],
        "the skip has its event, saying so"
    );

    let large = submit(&engine, "conditional", json!({"amount": 500})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(large));
    assert_eq!(calls.of(large), ["check", "fraud", "ship"]);
    assert_eq!(
        row(&pool, large).await.checkpoints.0[2]["response"]["request"],
        json!({"screened": true})
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_when_that_cannot_be_evaluated_fails_the_job_naming_the_step(pool: PgPool) {
    let calls = Calls::default();
    let engine = engine(&pool, echo_targets(&calls), manual_clock(), "w");
    let mut workflow = conditional();
    workflow["steps"][1]["when"] = json!("input.amount");
    engine.register_workflow(&workflow).await.unwrap();
    let job_id = submit(&engine, "conditional", json!({"amount": 5})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
    let failed = row(&pool, job_id).await;
    let error = failed.error.unwrap_or_default();
    assert!(error.contains("step fraud: when:"), "{error}");
    assert!(error.contains("not a boolean"), "{error}");
    assert_eq!(calls.of(job_id), ["check"]);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_resumed_graph_calls_only_the_steps_without_a_checkpoint(pool: PgPool) {
    let calls = Calls::default();
    let engine = engine(&pool, echo_targets(&calls), manual_clock(), "w");
    let workflow = json!({
        "name": "diamond", "input_schema": {},
        "steps": [
            {"name": "left", "target": "echo", "method": "m", "needs": []},
            {"name": "right", "target": "echo", "method": "m", "needs": []},
            {"name": "join", "target": "echo", "method": "m", "needs": ["left", "right"],
             "rules": ["from = steps.right.step"]}
        ]
    });
    engine.register_workflow(&workflow).await.unwrap();
    let job_id = submit(&engine, "diamond", json!({})).await;
    // As a crash would leave it: the second root answered and was
    // checkpointed first.
    sqlx::query("UPDATE workflow_run SET checkpoints = $2 WHERE job_id = $1")
        .bind(job_id)
        .bind(json!([{"name": "right", "skipped": false, "response": {"step": "right"}}]))
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(calls.of(job_id), ["left", "join"]);
    assert_eq!(
        row(&pool, job_id).await.checkpoints.0[2]["response"]["request"],
        json!({"from": "right"})
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_failing_branch_lets_the_running_one_reach_its_checkpoint_and_the_retry_calls_only_the_rest(
    pool: PgPool,
) {
    let clock = manual_clock();
    let clocked = Clocked::default();
    let mut targets = clocked.targets(8);
    let tries = Arc::new(AtomicUsize::new(0));
    let counted = tries.clone();
    targets.register(
        "flaky",
        Arc::new(FnTarget(move |_call: TargetCall| {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    Err(StepFailure::retryable(RetryClass::Status, "503 once"))
                } else {
                    Ok(json!({"ok": true}))
                }
            }
        })),
        8,
    );
    let engine = engine(&pool, targets, clock.clone(), "w");
    let workflow = json!({
        "name": "branches", "input_schema": {},
        "steps": [
            {"name": "steady", "target": "slow", "method": "m", "needs": [], "rules": ["ms = 200"]},
            {"name": "flaky", "target": "flaky", "method": "m", "needs": []},
            {"name": "after", "target": "slow", "method": "m", "needs": ["steady", "flaky"]}
        ]
    });
    engine.register_workflow(&workflow).await.unwrap();
    let job_id = submit(&engine, "branches", json!({})).await;

    assert_eq!(engine.run_once().await.unwrap(), Outcome::Requeued(job_id));
    let first = row(&pool, job_id).await;
    assert_eq!(
        first.checkpoints.0.as_array().unwrap().len(),
        1,
        "the branch still running when the other failed was checkpointed"
    );
    assert_eq!(first.checkpoints.0[0]["name"], json!("steady"));

    clock.advance(Duration::from_secs(10));
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(clocked.of("steady").len(), 1, "steady kept its checkpoint");
    assert_eq!(clocked.of("after").len(), 1);
    assert_eq!(tries.load(Ordering::SeqCst), 2);
}

/// A release before graphs claims runs up to level 1 and would fail a
/// graph's definition as broken: graph runs are written at the graph
/// level, so such a worker leaves them for one that reads them, while a
/// list of steps stays readable by every release.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_graph_run_is_written_for_workers_that_read_graphs_and_a_list_for_every_worker(
    pool: PgPool,
) {
    let calls = Calls::default();
    let engine = engine(&pool, echo_targets(&calls), manual_clock(), "w");
    engine.register_workflow(&conditional()).await.unwrap();
    engine
        .register_workflow(&crate::support::three_steps("list", "echo"))
        .await
        .unwrap();
    let graph = submit(&engine, "conditional", json!({"amount": 1})).await;
    let list = submit(&engine, "list", json!({"n": 1})).await;
    assert_eq!(
        row(&pool, graph).await.reader_level,
        flotilla_store::runs::GRAPH_READER_LEVEL
    );
    const { assert!(flotilla_store::runs::GRAPH_READER_LEVEL > 1) };
    assert_eq!(row(&pool, list).await.reader_level, 0);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn an_operator_retry_of_a_failed_graph_calls_the_failed_step_and_its_dependants_only(
    pool: PgPool,
) {
    let clocked = Clocked::default();
    let mut targets = clocked.targets(8);
    let tries = Arc::new(AtomicUsize::new(0));
    let counted = tries.clone();
    targets.register(
        "strict",
        Arc::new(FnTarget(move |_call: TargetCall| {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    Err(StepFailure::Verdict {
                        message: "refused once".into(),
                        violations: vec!["refused once".into()],
                    })
                } else {
                    Ok(json!({"ok": true}))
                }
            }
        })),
        8,
    );
    let engine = engine(&pool, targets, manual_clock(), "w");
    let workflow = json!({
        "name": "retried", "input_schema": {},
        "steps": [
            {"name": "other", "target": "slow", "method": "m", "needs": []},
            {"name": "other_next", "target": "slow", "method": "m", "needs": ["other"]},
            {"name": "judged", "target": "strict", "method": "m", "needs": []},
            {"name": "judged_next", "target": "slow", "method": "m", "needs": ["judged"]}
        ]
    });
    engine.register_workflow(&workflow).await.unwrap();
    let job_id = submit(&engine, "retried", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
    let failed = row(&pool, job_id).await;
    let kept = checkpoint_names(&failed);
    assert!(kept.contains(&"other".to_owned()), "{kept:?}");
    assert!(!kept.contains(&"judged".to_owned()), "{kept:?}");

    engine.retry(job_id).await.unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    for (step, calls) in [("other", 1), ("other_next", 1), ("judged_next", 1)] {
        let seen = clocked.of(step).iter().filter(|c| c.step == step).count();
        assert_eq!(seen, calls, "{step} called {seen} times");
    }
    assert_eq!(tries.load(Ordering::SeqCst), 2, "the failed step ran again");
}

/// `before` → `nap` (a timer) → `after`.
fn napping(timer: Value) -> Value {
    let mut nap = json!({"name": "nap"});
    nap.as_object_mut()
        .unwrap()
        .extend(timer.as_object().unwrap().clone());
    json!({
        "name": "napping", "input_schema": {},
        "steps": [
            {"name": "before", "target": "echo", "method": "m"},
            nap,
            {"name": "after", "target": "echo", "method": "m"}
        ]
    })
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_sleep_parks_the_job_without_a_lease_and_wakes_it_once_on_time_on_any_worker(
    pool: PgPool,
) {
    let clock = manual_clock();
    let calls = Calls::default();
    let first = engine(&pool, echo_targets(&calls), clock.clone(), "first");
    first
        .register_workflow(&napping(json!({"sleep": "2s"})))
        .await
        .unwrap();
    let job_id = submit(&first, "napping", json!({})).await;
    let reached = clock.now();

    assert_eq!(first.run_once().await.unwrap(), Outcome::Sleeping(job_id));
    let asleep = row(&pool, job_id).await;
    let wakes = reached + Duration::from_secs(2);
    assert_eq!(asleep.status, RunStatus::Queued);
    assert_eq!(asleep.run_after, wakes);
    assert_eq!(asleep.lease_owner, None, "no lease held while it sleeps");
    assert_eq!(
        asleep.timers.as_ref().unwrap().0,
        json!({"nap": "2026-01-01T00:00:02.000Z"})
    );
    let waiting = events(&pool, job_id).await.pop().unwrap();
    assert_eq!(waiting.event_type(), WorkflowRunEventType::Waiting);
    assert_eq!(waiting.step_name(), Some("nap"));
    assert_eq!(
        waiting.verdict(),
        Some("sleeping until 2026-01-01T00:00:02.000Z")
    );

    clock.advance(Duration::from_millis(1_999));
    assert_eq!(first.run_once().await.unwrap(), Outcome::Idle);
    drop(first);
    // Another worker (the first is gone) wakes it at the instant stored.
    clock.advance(Duration::from_millis(1));
    let second = engine(&pool, echo_targets(&calls), clock.clone(), "second");
    assert_eq!(second.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(calls.of(job_id), ["before", "after"], "each called once");
    let done = row(&pool, job_id).await;
    assert_eq!(checkpoint_names(&done), ["before", "nap", "after"]);
    assert_eq!(
        done.checkpoints.0[1]["response"],
        json!({"woke_at": "2026-01-01T00:00:02.000Z"})
    );
    assert_eq!(done.attempt, 1, "sleeping spent no attempt");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn until_waits_for_the_instant_it_gives_and_not_at_all_for_one_past(pool: PgPool) {
    let clock = manual_clock();
    let calls = Calls::default();
    let engine = engine(&pool, echo_targets(&calls), clock.clone(), "w");
    engine
        .register_workflow(&napping(json!({"until": "input.at"})))
        .await
        .unwrap();

    let past = submit(&engine, "napping", json!({"at": "2025-12-31T23:00:00Z"})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(past));

    // 01:30 at +01:00 is half past midnight UTC, half an hour ahead.
    let future = submit(
        &engine,
        "napping",
        json!({"at": "2026-01-01T01:30:00+01:00"}),
    )
    .await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Sleeping(future));
    assert_eq!(
        row(&pool, future).await.run_after,
        clock.now() + Duration::from_secs(1800)
    );
    clock.advance(Duration::from_secs(1800));
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(future));

    let nonsense = submit(&engine, "napping", json!({"at": "soon"})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(nonsense));
    let error = row(&pool, nonsense).await.error.unwrap_or_default();
    assert!(error.contains("until gave \"soon\""), "{error}");
}

/// `score` calls its target once per number of `input.items`, then `sum`
/// reads the answers.
fn scoring(max_items: Option<u32>) -> Value {
    let mut score = json!({"name": "score", "target": "echo", "method": "score",
        "for_each": "input.items", "rules": ["doubled = item * 2", "at = index"]});
    if let Some(max) = max_items {
        score["max_items"] = json!(max);
    }
    json!({
        "name": "scoring", "input_schema": {}, "parallelism": 16,
        "steps": [
            score,
            {"name": "sum", "target": "echo", "method": "sum",
             "rules": ["count = size(steps.score)", "last = steps.score[size(steps.score) - 1].request.doubled"]}
        ]
    })
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn for_each_calls_once_per_item_and_gives_the_answers_in_item_order(pool: PgPool) {
    let calls = Calls::default();
    let engine = engine(&pool, echo_targets(&calls), manual_clock(), "w");
    engine.register_workflow(&scoring(None)).await.unwrap();
    let items: Vec<u32> = (0..200).collect();
    let job_id = submit(&engine, "scoring", json!({"items": items})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));

    assert_eq!(
        calls.of(job_id).iter().filter(|s| *s == "score").count(),
        200
    );
    let done = row(&pool, job_id).await;
    let names = checkpoint_names(&done);
    assert_eq!(names.len(), 202, "200 items, the step, the sum");
    let list = &done.checkpoints.0[200]["response"];
    let doubled: Vec<u64> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|answer| answer["request"]["doubled"].as_u64().unwrap())
        .collect();
    assert_eq!(doubled, (0..200).map(|n| n * 2).collect::<Vec<u64>>());
    assert_eq!(
        done.checkpoints.0[201]["response"]["request"],
        json!({"count": 200, "last": 398})
    );
    let item_events = events(&pool, job_id)
        .await
        .iter()
        .filter(|e| e.verdict().is_some_and(|v| v.starts_with("item ")))
        .count();
    assert_eq!(item_events, 200, "each item's answer is its own event");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_for_each_cut_short_resumes_calling_only_the_items_without_an_answer(pool: PgPool) {
    let calls = Calls::default();
    let engine = engine(&pool, echo_targets(&calls), manual_clock(), "w");
    engine.register_workflow(&scoring(None)).await.unwrap();
    let items: Vec<u32> = (0..200).collect();
    let job_id = submit(&engine, "scoring", json!({"items": items})).await;
    // As a killed worker leaves it: 120 items answered, in no order.
    let answered: Vec<Value> = (0..120u32)
        .rev()
        .map(|i| {
            json!({"name": "score", "skipped": false, "item": i,
            "response": {"step": "score", "request": {"doubled": i * 2, "at": i}}})
        })
        .collect();
    sqlx::query("UPDATE workflow_run SET checkpoints = $2 WHERE job_id = $1")
        .bind(job_id)
        .bind(json!(answered))
        .execute(&pool)
        .await
        .unwrap();
    let outcome = engine.run_once().await.unwrap();
    let error = row(&pool, job_id).await.error;
    assert_eq!(outcome, Outcome::Completed(job_id), "{error:?}");
    assert_eq!(
        calls.of(job_id).iter().filter(|s| *s == "score").count(),
        80,
        "only the 80 items without an answer were called"
    );
    assert_eq!(
        row(&pool, job_id).await.checkpoints.0[200]["response"][119]["request"]["doubled"],
        json!(238)
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_for_each_past_its_max_items_or_over_no_list_fails_the_job_naming_the_step(pool: PgPool) {
    let calls = Calls::default();
    let engine = engine(&pool, echo_targets(&calls), manual_clock(), "w");
    engine.register_workflow(&scoring(Some(3))).await.unwrap();
    let many = submit(&engine, "scoring", json!({"items": [1, 2, 3, 4]})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(many));
    let failed = row(&pool, many).await;
    assert_eq!(
        failed.error.as_deref(),
        Some("step score: for_each gave 4 items, over its max_items of 3")
    );
    assert!(failed.verdict.is_some(), "a verdict, not a defect");

    let not_a_list = submit(&engine, "scoring", json!({"items": "abc"})).await;
    assert_eq!(
        engine.run_once().await.unwrap(),
        Outcome::Failed(not_a_list)
    );
    let error = row(&pool, not_a_list).await.error.unwrap_or_default();
    assert!(
        error.contains("for_each gave a string, not a list"),
        "{error}"
    );
    assert!(calls.of(many).is_empty() && calls.of(not_a_list).is_empty());
}

/// A target `pager` with three pages: it answers cursor null, 1, 2 with
/// `more: true` and the next cursor, and cursor 3 with the last page.
/// Records the cursors it was called with. With a `thief`, called for
/// the second page it first gives the job's lease to another worker.
fn pager(seen: Arc<Mutex<Vec<Value>>>, thief: Option<PgPool>) -> Targets {
    let mut targets = Targets::default();
    targets.register(
        "pager",
        Arc::new(FnTarget(move |call: TargetCall| {
            let cursor = call.request["cursor"].clone();
            seen.lock().unwrap().push(cursor.clone());
            let thief = thief.clone().filter(|_| cursor == json!(1));
            async move {
                if let Some(thief) = thief {
                    sqlx::query(
                        "UPDATE workflow_run SET lease_token = gen_random_uuid(), lease_owner = 'thief'",
                    )
                    .execute(&thief)
                    .await
                    .unwrap();
                }
                let at = cursor.as_u64().unwrap_or(0);
                Ok::<_, StepFailure>(if at < 3 {
                    json!({"more": true, "cursor": at + 1, "rows": 100})
                } else {
                    json!({"more": false, "rows": 40, "total": 340})
                })
            }
        })),
        8,
    );
    targets
}

fn export() -> Value {
    json!({
        "name": "export", "input_schema": {},
        "steps": [
            {"name": "pages", "target": "pager", "method": "page", "paged": true,
             "rules": ["cursor = cursor"]}
        ]
    })
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_paged_step_is_called_with_each_cursor_until_its_answer_says_no_more(pool: PgPool) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let engine = engine(&pool, pager(seen.clone(), None), manual_clock(), "w");
    engine.register_workflow(&export()).await.unwrap();
    let job_id = submit(&engine, "export", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(
        *seen.lock().unwrap(),
        [json!(null), json!(1), json!(2), json!(3)]
    );
    let done = row(&pool, job_id).await;
    assert_eq!(
        done.checkpoints.0,
        json!([
            {"name": "pages", "skipped": false, "page": 0, "response": {"cursor": 1}},
            {"name": "pages", "skipped": false, "page": 1, "response": {"cursor": 2}},
            {"name": "pages", "skipped": false, "page": 2, "response": {"cursor": 3}},
            {"name": "pages", "skipped": false, "response": {"more": false, "rows": 40, "total": 340}}
        ]),
        "each cursor kept as it came, the step's answer the last page's"
    );
    let verdicts: Vec<Option<String>> = events(&pool, job_id)
        .await
        .iter()
        .filter(|e| e.event_type() == WorkflowRunEventType::StepCheckpoint)
        .map(|e| e.verdict().map(str::to_owned))
        .collect();
    assert_eq!(
        verdicts,
        [
            Some("page 0".into()),
            Some("page 1".into()),
            Some("page 2".into()),
            None
        ]
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_worker_that_lost_its_lease_cannot_move_the_cursor_and_the_next_attempt_resumes_from_the_last_stored(
    pool: PgPool,
) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let first = engine(
        &pool,
        pager(seen.clone(), Some(pool.clone())),
        manual_clock(),
        "w",
    );
    first.register_workflow(&export()).await.unwrap();
    let job_id = submit(&first, "export", json!({})).await;
    assert_eq!(first.run_once().await.unwrap(), Outcome::LeaseLost(job_id));
    let held = row(&pool, job_id).await;
    assert_eq!(
        held.checkpoints.0,
        json!([{"name": "pages", "skipped": false, "page": 0, "response": {"cursor": 1}}]),
        "the cursor of the page fetched after the lease was gone was not written"
    );

    // The thief's lease lapses and the job is claimable again.
    sqlx::query("UPDATE workflow_run SET status = 'QUEUED', lease_token = NULL, lease_owner = NULL, lease_until = NULL")
        .execute(&pool)
        .await
        .unwrap();
    seen.lock().unwrap().clear();
    let honest = engine(&pool, pager(seen.clone(), None), manual_clock(), "w2");
    assert_eq!(honest.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(
        *seen.lock().unwrap(),
        [json!(1), json!(2), json!(3)],
        "resumed from the last cursor stored"
    );
}

/// `charge` → `ship` (refused by the `strict` target on its first
/// `refusals` calls), and on failure `refund` then `notify`, both told the
/// failure.
fn compensated(max_attempts: i32, ship_fails: &str) -> Value {
    json!({
        "name": "compensated", "input_schema": {}, "max_attempts": max_attempts,
        "steps": [
            {"name": "charge", "target": "echo", "method": "charge"},
            {"name": "ship", "target": ship_fails, "method": "ship"}
        ],
        "on_failure": [
            {"name": "refund", "target": "echo", "method": "refund",
             "rules": ["charged = has(steps.charge)", "failed = failure.step", "why = failure.error"]},
            {"name": "notify", "target": "echo", "method": "notify"}
        ]
    })
}

/// Targets `echo` (recording calls in `calls`), `refuses` (a verdict
/// every time), `busy` (retryable every time) and `broken_refund`.
fn compensation_targets(calls: &Calls) -> Targets {
    let mut targets = echo_targets(calls);
    targets.register(
        "refuses",
        Arc::new(FnTarget(|_call: TargetCall| async {
            Err::<Value, _>(StepFailure::Verdict {
                message: "no courier for that address".into(),
                violations: vec!["address".into()],
            })
        })),
        8,
    );
    targets.register(
        "busy",
        Arc::new(FnTarget(|_call: TargetCall| async {
            Err::<Value, _>(StepFailure::retryable(
                RetryClass::Status,
                "503 from the courier",
            ))
        })),
        8,
    );
    targets
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_headed_to_fail_runs_its_compensation_in_order_with_the_failure_then_fails(
    pool: PgPool,
) {
    let calls = Calls::default();
    let engine = engine(&pool, compensation_targets(&calls), manual_clock(), "w");
    engine
        .register_workflow(&compensated(3, "refuses"))
        .await
        .unwrap();
    let job_id = submit(&engine, "compensated", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
    assert_eq!(calls.of(job_id), ["charge", "refund", "notify"]);
    let failed = row(&pool, job_id).await;
    assert_eq!(failed.error.as_deref(), Some("no courier for that address"));
    assert_eq!(failed.verdict.as_deref(), Some("address"));
    let compensation = failed.compensation.unwrap().0;
    assert_eq!(
        compensation["done"][0]["response"]["request"],
        json!({"charged": true, "failed": "ship", "why": "no courier for that address"}),
        "the compensation saw what ran and what failed"
    );
    let noted = checkpoint_notes(&pool, job_id).await;
    assert_eq!(
        noted,
        [
            (Some("charge".into()), None),
            (Some("refund".into()), Some("compensation".into())),
            (Some("notify".into()), Some("compensation".into()))
        ]
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn compensation_waits_for_the_last_attempt_and_a_dead_job_is_compensated_too(pool: PgPool) {
    let clock = manual_clock();
    let calls = Calls::default();
    let engine = engine(&pool, compensation_targets(&calls), clock.clone(), "w");
    engine
        .register_workflow(&compensated(2, "busy"))
        .await
        .unwrap();
    let job_id = submit(&engine, "compensated", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Requeued(job_id));
    assert_eq!(
        calls.of(job_id),
        ["charge"],
        "no compensation while attempts are left"
    );
    clock.advance(Duration::from_secs(60));
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Dead(job_id));
    assert_eq!(calls.of(job_id), ["charge", "refund", "notify"]);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_failing_compensation_is_recorded_and_the_rest_skipped_never_looped(pool: PgPool) {
    let calls = Calls::default();
    let engine = engine(&pool, compensation_targets(&calls), manual_clock(), "w");
    let mut workflow = compensated(3, "refuses");
    workflow["on_failure"][0]["target"] = json!("refuses");
    engine.register_workflow(&workflow).await.unwrap();
    let job_id = submit(&engine, "compensated", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
    assert_eq!(
        calls.of(job_id),
        ["charge"],
        "notify was not run after refund failed"
    );
    assert_eq!(
        row(&pool, job_id).await.error.as_deref(),
        Some(
            "no courier for that address; compensation refund failed: no courier for that address"
        )
    );
    assert_eq!(
        engine.run_once().await.unwrap(),
        Outcome::Idle,
        "nothing loops"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_resumed_compensation_runs_only_what_is_left_and_never_the_failed_step_again(
    pool: PgPool,
) {
    let calls = Calls::default();
    let engine = engine(&pool, compensation_targets(&calls), manual_clock(), "w");
    engine
        .register_workflow(&compensated(3, "echo"))
        .await
        .unwrap();
    let job_id = submit(&engine, "compensated", json!({})).await;
    // As a worker killed after the refund leaves it.
    sqlx::query("UPDATE workflow_run SET checkpoints = $2, compensation = $3 WHERE job_id = $1")
        .bind(job_id)
        .bind(json!([{"name": "charge", "skipped": false, "response": {"ok": true}}]))
        .bind(json!({
            "failure": {"step": "ship", "error": "no courier", "verdict": "address", "dead": false},
            "done": [{"name": "refund", "skipped": false, "response": {"refunded": true}}]
        }))
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
    assert_eq!(
        calls.of(job_id),
        ["notify"],
        "ship is not run again, refund not twice"
    );
    assert_eq!(
        row(&pool, job_id).await.error.as_deref(),
        Some("no courier")
    );

    // An operator's retry clears the compensation: the failed step runs again.
    engine.retry(job_id).await.unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(calls.of(job_id), ["notify", "ship"]);
    assert!(row(&pool, job_id).await.compensation.is_none());
}

/// A graft made while a worker runs the job does not cost the answers in
/// hand: the segment's checkpoints are still written (the graft's event is
/// not the holder's), but its end (here the completion) is refused at the
/// new revision, the job is handed back at once (its lease still held),
/// and the next claim runs the grafted step with the answers kept.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_graft_under_a_running_segment_keeps_its_answers_and_stops_it_before_its_end(
    pool: PgPool,
) {
    let calls = Calls::default();
    let mut targets = echo_targets(&calls);
    let grafter = pool.clone();
    let grafting_calls = Arc::new(AtomicUsize::new(0));
    let counted = grafting_calls.clone();
    targets.register(
        "grafting",
        Arc::new(FnTarget(move |call: TargetCall| {
            let pool = grafter.clone();
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                let mut tx = pool.begin().await.unwrap();
                let definition: Value = sqlx::query_scalar(
                    "SELECT coalesce(definition, (SELECT definition FROM workflow_definition LIMIT 1)) FROM workflow_run WHERE job_id = $1",
                )
                .bind(call.job_id)
                .fetch_one(&mut *tx)
                .await
                .unwrap();
                let mut definition = definition;
                definition["steps"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "late", "target": "echo", "method": "late", "needs": []}));
                let grafted = flotilla_store::runs::graft(
                    &mut tx,
                    call.job_id,
                    (0, flotilla_store::runs::GRAPH_READER_LEVEL),
                    &definition,
                    (vec!["late".into()], false),
                    chrono::Utc::now(),
                )
                .await
                .unwrap();
                tx.commit().await.unwrap();
                // Grafted on the first call only (the revision moved on).
                Ok::<_, StepFailure>(json!({"grafted": grafted}))
            }
        })),
        8,
    );
    let engine = engine(&pool, targets, manual_clock(), "w");
    let workflow = json!({
        "name": "regrown", "input_schema": {},
        "steps": [
            {"name": "first", "target": "grafting", "method": "m", "needs": []},
            {"name": "second", "target": "echo", "method": "second"}
        ]
    });
    engine.register_workflow(&workflow).await.unwrap();
    let job_id = submit(&engine, "regrown", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Requeued(job_id));
    let stopped = row(&pool, job_id).await;
    assert_eq!(
        checkpoint_names(&stopped),
        ["first", "second"],
        "the answers in hand were kept; only the end was refused"
    );
    assert_eq!(stopped.revision, 1);
    // Handed back at once, its attempt unspent, no lapse to wait for.
    assert_eq!(stopped.status, RunStatus::Queued);
    assert_eq!(
        (stopped.attempt, stopped.lease_losses, stopped.lease_owner),
        (0, 0, None)
    );

    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    let done = row(&pool, job_id).await;
    let mut names = checkpoint_names(&done);
    names.sort();
    assert_eq!(names, ["first", "late", "second"], "the grafted step ran");
    assert_eq!(calls.of(job_id).iter().filter(|s| *s == "late").count(), 1);
    assert_eq!(
        grafting_calls.load(Ordering::SeqCst),
        1,
        "the step answered under the graft was called again"
    );
    assert_eq!(
        calls.of(job_id).iter().filter(|s| *s == "second").count(),
        1
    );
}

/// A timer reached in the segment that parks on an external step keeps
/// its instant while the job waits for the answer: the wait is not started
/// again when the job resumes.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_timer_reached_beside_a_park_keeps_its_instant_through_the_wait(pool: PgPool) {
    let clock = manual_clock();
    let calls = Calls::default();
    let engine = engine(&pool, echo_targets(&calls), clock.clone(), "w");
    let workflow = json!({
        "name": "waits", "input_schema": {},
        "steps": [
            {"name": "approve", "target": "echo", "method": "approve", "needs": [], "completion": "external"},
            {"name": "nap", "needs": [], "sleep": "1h"},
            {"name": "after", "target": "echo", "method": "after", "needs": ["approve", "nap"]}
        ]
    });
    engine.register_workflow(&workflow).await.unwrap();
    let job_id = submit(&engine, "waits", json!({})).await;
    let reached = clock.now();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    assert_eq!(
        row(&pool, job_id).await.timers.unwrap().0,
        json!({"nap": "2026-01-01T01:00:00.000Z"})
    );
    clock.advance(Duration::from_secs(1800));
    engine
        .complete_step(job_id, "approve", json!({"ok": true}))
        .await
        .unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Sleeping(job_id));
    assert_eq!(
        row(&pool, job_id).await.run_after,
        reached + Duration::from_secs(3600),
        "the hour counts from when the timer was reached, not from the answer"
    );
    clock.advance(Duration::from_secs(1800));
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(calls.of(job_id), ["after"]);
}

/// A job parked on a person's step while a sleep on another branch is
/// pending wakes when the timer comes due: the branch behind the timer
/// runs without waiting for the person, and the job parks again.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_timer_that_comes_due_while_the_job_waits_on_another_step_wakes_it(pool: PgPool) {
    let clock = manual_clock();
    let calls = Calls::default();
    let engine = engine(&pool, echo_targets(&calls), clock.clone(), "w");
    let workflow = json!({
        "name": "reminds", "input_schema": {},
        "steps": [
            {"name": "approve", "target": "echo", "method": "approve", "needs": [], "completion": "external"},
            {"name": "nap", "needs": [], "sleep": "1h"},
            {"name": "remind", "target": "echo", "method": "remind", "needs": ["nap"]},
            {"name": "after", "target": "echo", "method": "after", "needs": ["approve", "remind"]}
        ]
    });
    engine.register_workflow(&workflow).await.unwrap();
    let job_id = submit(&engine, "reminds", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    let parked = row(&pool, job_id).await;
    assert_eq!(parked.status, RunStatus::Waiting);
    assert_eq!(
        parked.wake_at,
        Some(clock.now() + Duration::from_secs(3600))
    );

    clock.advance(Duration::from_secs(3599));
    assert_eq!(engine.wake_due_waits().await.unwrap(), 0, "not yet due");
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Idle);
    clock.advance(Duration::from_secs(1));
    assert_eq!(engine.wake_due_waits().await.unwrap(), 1);
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    assert_eq!(
        calls.of(job_id),
        ["remind"],
        "the reminder ran before the answer"
    );
    let parked = row(&pool, job_id).await;
    assert_eq!(parked.outstanding_step.as_deref(), Some("approve"));
    assert_eq!(parked.wake_at, None, "no timer left to wake it");
    assert_eq!(parked.attempt, 1, "waking spent no attempt");

    engine
        .complete_step(job_id, "approve", json!({"ok": true}))
        .await
        .unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(calls.of(job_id), ["remind", "after"]);
}

/// A worker of an earlier release parks without writing `wake_at`: every
/// claim clears it, so the instant of an earlier park is never left on a
/// WAITING row for the sweeper to wake it at again and again.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_claim_clears_the_wake_instant_an_earlier_park_left(pool: PgPool) {
    let clock = manual_clock();
    let engine = engine(&pool, echo_targets(&Calls::default()), clock.clone(), "w");
    engine
        .register_workflow(&json!({
            "name": "asks", "input_schema": {},
            "steps": [{"name": "approve", "target": "echo", "method": "a", "completion": "external"}]
        }))
        .await
        .unwrap();
    let job_id = submit(&engine, "asks", json!({})).await;
    sqlx::query("UPDATE workflow_run SET wake_at = $2 WHERE job_id = $1")
        .bind(job_id)
        .bind(clock.now() - Duration::from_secs(60))
        .execute(&pool)
        .await
        .unwrap();
    let claimed = engine.claim().await.unwrap().expect("claimable");
    assert_eq!(
        row(&pool, job_id).await.wake_at,
        None,
        "cleared by the claim"
    );
    drop(claimed);
    // The park of an earlier release: WAITING, `wake_at` untouched.
    sqlx::query("UPDATE workflow_run SET status = 'WAITING', outstanding_step = 'approve', lease_owner = NULL, lease_token = NULL, lease_until = NULL WHERE job_id = $1")
        .bind(job_id)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(
        engine.wake_due_waits().await.unwrap(),
        0,
        "nothing to wake it"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn an_output_mapping_that_fails_after_the_last_step_is_compensated_too(pool: PgPool) {
    let calls = Calls::default();
    let engine = engine(&pool, compensation_targets(&calls), manual_clock(), "w");
    let mut workflow = compensated(3, "echo");
    workflow["output"] = json!(["total = steps.ship.missing.deeper"]);
    engine.register_workflow(&workflow).await.unwrap();
    let job_id = submit(&engine, "compensated", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
    assert_eq!(calls.of(job_id), ["charge", "ship", "refund", "notify"]);
    let failed = row(&pool, job_id).await;
    let refund = &failed.compensation.unwrap().0["done"][0]["response"]["request"];
    assert_eq!(
        refund["failed"],
        Value::Null,
        "no step failed: the result did"
    );
    assert!(
        refund["why"]
            .as_str()
            .unwrap_or_default()
            .contains("missing"),
        "{refund}"
    );
}

/// A row another writer broke (a stored timer that is no instant) fails
/// its own job as a defect naming the step; a job beside it completes.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_stored_timer_that_is_no_instant_fails_its_job_alone(pool: PgPool) {
    let calls = Calls::default();
    let engine = engine(&pool, echo_targets(&calls), manual_clock(), "w");
    engine
        .register_workflow(&napping(json!({"sleep": "1s"})))
        .await
        .unwrap();
    let broken = submit(&engine, "napping", json!({})).await;
    sqlx::query("UPDATE workflow_run SET timers = '{\"nap\": \"soon\"}'::jsonb WHERE job_id = $1")
        .bind(broken)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(broken));
    let error = row(&pool, broken).await.error.unwrap_or_default();
    assert!(error.contains("step nap: the stored timer"), "{error}");

    let fine = submit(&engine, "napping", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Sleeping(fine));
}

/// A `sleep` counts from the moment it is first reached, whatever ends
/// that segment (review M3): here a sibling's retryable failure requeues
/// the job with a backoff, and the next segment must keep the instant.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_sleep_reached_in_a_segment_that_then_fails_keeps_its_first_instant(pool: PgPool) {
    let clock = manual_clock();
    let calls = Calls::default();
    let mut targets = echo_targets(&calls);
    let tries = Arc::new(AtomicUsize::new(0));
    let counted = tries.clone();
    targets.register(
        "flaky",
        Arc::new(FnTarget(move |_call: TargetCall| {
            let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                if first {
                    Err(StepFailure::retryable(RetryClass::Other, "503"))
                } else {
                    Ok(json!({}))
                }
            }
        })),
        8,
    );
    let engine = engine(&pool, targets, clock.clone(), "w");
    engine
        .register_workflow(&json!({
            "name": "nap-beside", "input_schema": {},
            "steps": [
                {"name": "prepare", "target": "echo", "method": "m"},
                {"name": "nap", "needs": ["prepare"], "sleep": "30m"},
                {"name": "flaky", "needs": ["prepare"], "target": "flaky", "method": "m"}
            ]
        }))
        .await
        .unwrap();
    let job_id = submit(&engine, "nap-beside", json!({})).await;
    let reached = clock.now();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Requeued(job_id));
    clock.advance(Duration::from_secs(300));
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Sleeping(job_id));
    let asleep = row(&pool, job_id).await;
    assert_eq!(
        asleep.run_after,
        reached + Duration::from_secs(1800),
        "the sleep started again after the backoff"
    );
}
