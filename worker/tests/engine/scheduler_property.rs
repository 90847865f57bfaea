//! A property of the scheduler (issue 49, point 4): random graphs of up to
//! 64 steps, with random `needs`, `when`, `for_each` over lists and over
//! maps, timers and steps that fail once, run through the engine on a
//! manual clock. Each graph runs twice: once straight through, once cut
//! at random calls (the lease taken from the worker mid-call, as when a
//! worker is lost) and resumed each time on a fresh engine. Then:
//!
//! - every call of one (step, item) has the same idempotency key and the
//!   same item (the list is the same on every segment);
//! - no step is called before every step it needs has its checkpoint;
//! - the cut run's answers are the straight run's.
//!
//! Cases come from proptest's strategies with a fixed seed (the same 16
//! graphs on every run, so a failure is reproducible; the failing graph
//! is printed). The segment deadline as a cut is covered by
//! `deadlines.rs`, not here: the engine's deadline runs on the real clock.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_store::RunStatus;
use flotilla_store::runs;
use flotilla_worker::engine::{Clock as _, Engine, ManualClock, Outcome};
use flotilla_worker::targets::{FnTarget, RetryClass, StepFailure, TargetCall, Targets};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{manual_clock, settings, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// What one step of a generated graph is.
#[derive(Debug, Clone)]
enum Kind {
    Call,
    /// `for_each` over a literal list of this many items.
    List(usize),
    /// `for_each` over the keys of `input.m` (a map of this many keys).
    Map(usize),
    /// `sleep` this many seconds.
    Sleep(u64),
    /// A call whose first call fails as retryable.
    Flaky,
}

#[derive(Debug, Clone)]
struct Step {
    needs: BTreeSet<usize>,
    kind: Kind,
    /// `when` says no.
    skipped: bool,
}

fn step_at(index: usize) -> impl Strategy<Value = Step> {
    let needs = proptest::collection::btree_set(0..index.max(1), 0..=index.min(3))
        .prop_map(move |needs| needs.into_iter().filter(|&n| n < index).collect());
    let kind = prop_oneof![
        6 => Just(Kind::Call),
        2 => (0usize..4).prop_map(Kind::List),
        2 => (1usize..5).prop_map(Kind::Map),
        1 => (1u64..6).prop_map(Kind::Sleep),
        1 => Just(Kind::Flaky),
    ];
    (needs, kind, proptest::bool::weighted(0.1)).prop_map(|(needs, kind, skipped)| {
        let skipped = skipped && !matches!(kind, Kind::Sleep(_));
        Step {
            needs,
            kind,
            skipped,
        }
    })
}

fn graph() -> impl Strategy<Value = Vec<Step>> {
    (1usize..=64).prop_flat_map(|n| (0..n).map(step_at).collect::<Vec<_>>())
}

/// The definition of `steps` under `name`: every step sees whether its
/// needs answered, so answers depend on the graph but not on timing.
fn definition(name: &str, steps: &[Step]) -> Value {
    let steps: Vec<Value> = steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let needs: Vec<String> = step.needs.iter().map(|n| format!("s{n}")).collect();
            let mut rules: Vec<String> = step
                .needs
                .iter()
                .map(|n| format!("saw_s{n} = has(steps.s{n})"))
                .collect();
            let mut out = json!({"name": format!("s{i}"), "needs": needs});
            match &step.kind {
                Kind::Sleep(seconds) => {
                    out["sleep"] = json!(format!("{seconds}s"));
                    return out;
                }
                Kind::Call => {}
                Kind::Flaky => {}
                Kind::List(items) => {
                    out["for_each"] = json!(format!("{:?}", (0..*items).collect::<Vec<_>>()));
                    rules.push("item = item".into());
                }
                Kind::Map(_) => {
                    out["for_each"] = json!("input.m.map(k, k)");
                    rules.push("item = item".into());
                }
            }
            out["target"] = json!(if matches!(step.kind, Kind::Flaky) {
                "flaky"
            } else {
                "echo"
            });
            out["method"] = json!("m");
            out["rules"] = json!(rules);
            if step.skipped {
                out["when"] = json!("false");
            }
            out
        })
        .collect();
    json!({"name": name, "input_schema": {}, "max_attempts": 100, "parallelism": 4,
           "steps": steps})
}

/// One call a target saw.
#[derive(Debug, Clone)]
struct Seen {
    step: String,
    key: String,
    item: Value,
    /// The steps that had ended (their own checkpoint) when it was called.
    ended: BTreeSet<String>,
}

/// The calls of a run, and the calls at which the lease is taken away.
#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Vec<Seen>>>,
    cut_at: Arc<Mutex<BTreeSet<usize>>>,
    calls: Arc<Mutex<usize>>,
    failed_once: Arc<Mutex<BTreeSet<String>>>,
}

async fn ended_steps(pool: &PgPool, job_id: Uuid) -> BTreeSet<String> {
    let mut conn = pool.acquire().await.unwrap();
    let row = runs::get(&mut conn, job_id).await.unwrap().unwrap();
    row.checkpoints
        .0
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| ["item", "page", "child"].iter().all(|p| e.get(p).is_none()))
        .filter_map(|e| e["name"].as_str().map(str::to_owned))
        .collect()
}

fn targets(pool: &PgPool, recorder: &Recorder) -> Targets {
    let mut targets = Targets::default();
    for (name, flaky) in [("echo", false), ("flaky", true)] {
        let (pool, recorder) = (pool.clone(), recorder.clone());
        targets.register(
            name,
            Arc::new(FnTarget(move |call: TargetCall| {
                let (pool, recorder) = (pool.clone(), recorder.clone());
                async move {
                    let ended = ended_steps(&pool, call.job_id).await;
                    recorder.seen.lock().unwrap().push(Seen {
                        step: call.step_name.clone(),
                        key: call.idempotency_key(),
                        item: call.request["item"].clone(),
                        ended,
                    });
                    let n = {
                        let mut calls = recorder.calls.lock().unwrap();
                        *calls += 1;
                        *calls
                    };
                    if recorder.cut_at.lock().unwrap().remove(&n) {
                        // The worker loses the job mid-call.
                        sqlx::query("UPDATE workflow_run SET lease_token = gen_random_uuid() WHERE job_id = $1")
                            .bind(call.job_id)
                            .execute(&pool)
                            .await
                            .unwrap();
                    }
                    if flaky && recorder.failed_once.lock().unwrap().insert(call.idempotency_key()) {
                        return Err(StepFailure::retryable(RetryClass::Other, "first call fails"));
                    }
                    Ok(json!({"step": call.step_name, "request": call.request, "part": call.part}))
                }
            })),
            8,
        );
    }
    targets
}

/// Runs `job_id` to its end, resuming on a fresh engine after each lost
/// lease and moving the clock to each wake-up; the job's answers by step.
async fn run_to_the_end(
    pool: &PgPool,
    clock: &Arc<ManualClock>,
    recorder: &Recorder,
    job_id: Uuid,
) -> BTreeMap<String, Value> {
    let mut engine = Engine::new(
        pool.clone(),
        targets(pool, recorder),
        clock.clone(),
        settings("w"),
    );
    for _ in 0..2_000 {
        match engine.run_once().await.unwrap() {
            Outcome::Completed(_) => break,
            Outcome::LeaseLost(_) => {
                sqlx::query(
                    "UPDATE workflow_run SET status = 'QUEUED', lease_token = NULL, lease_owner = NULL,
                         lease_until = NULL WHERE job_id = $1",
                )
                .bind(job_id)
                .execute(pool)
                .await
                .unwrap();
                engine = Engine::new(
                    pool.clone(),
                    targets(pool, recorder),
                    clock.clone(),
                    settings("w"),
                );
            }
            Outcome::Sleeping(_) | Outcome::Requeued(_) | Outcome::Idle => {
                let mut conn = pool.acquire().await.unwrap();
                let row = runs::get(&mut conn, job_id).await.unwrap().unwrap();
                assert_eq!(row.status, RunStatus::Queued, "{:?}", row.error);
                let wait = (row.run_after - clock.now()).to_std().unwrap_or_default();
                clock.advance(wait + Duration::from_millis(1));
            }
            other => panic!("the job ended {other:?}"),
        }
    }
    let mut conn = pool.acquire().await.unwrap();
    let row = runs::get(&mut conn, job_id).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Completed, "{:?}", row.error);
    row.checkpoints
        .0
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| ["item", "page", "child"].iter().all(|p| e.get(p).is_none()))
        .map(|e| {
            // A timer's answer is the instant it woke at: the runs' clocks
            // differ by the time the cuts cost.
            let response = match e["response"].get("woke_at") {
                Some(_) => json!("woke"),
                None => e["response"].clone(),
            };
            (e["name"].as_str().unwrap_or_default().to_owned(), response)
        })
        .collect()
}

fn input_for(steps: &[Step]) -> Value {
    let keys = steps
        .iter()
        .filter_map(|s| match s.kind {
            Kind::Map(keys) => Some(keys),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let m: serde_json::Map<String, Value> =
        (0..keys).map(|k| (format!("key{k}"), json!(k))).collect();
    json!({"m": m})
}

/// Checks the calls of one run against the graph.
fn check_calls(steps: &[Step], seen: &[Seen], what: &str) {
    let mut keys: HashMap<(String, Value), BTreeSet<String>> = HashMap::new();
    let mut items: HashMap<String, BTreeSet<String>> = HashMap::new();
    for call in seen {
        let index: usize = call.step[1..].parse().unwrap();
        for need in &steps[index].needs {
            assert!(
                call.ended.contains(&format!("s{need}")),
                "{what}: {} was called before its need s{need} ended",
                call.step
            );
        }
        keys.entry((call.step.clone(), call.item.clone()))
            .or_default()
            .insert(call.key.clone());
        items
            .entry(call.key.clone())
            .or_default()
            .insert(call.item.to_string());
    }
    for ((step, item), keys) in keys {
        assert_eq!(
            keys.len(),
            1,
            "{what}: {step} item {item} called under {keys:?}"
        );
    }
    for (key, items) in items {
        assert_eq!(
            items.len(),
            1,
            "{what}: key {key} called for items {items:?}"
        );
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_graph_cut_at_random_calls_and_resumed_gives_the_straight_runs_answers(pool: PgPool) {
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[49; 32]),
    );
    for case in 0..16 {
        let steps = graph().new_tree(&mut runner).unwrap().current();
        let name = format!("graph-{case}");
        let document = definition(&name, &steps);
        let clock = manual_clock();
        let straight = Recorder::default();
        Engine::new(
            pool.clone(),
            targets(&pool, &straight),
            clock.clone(),
            settings("w"),
        )
        .register_workflow(&document)
        .await
        .unwrap_or_else(|e| panic!("case {case}: {e}\n{document:#}"));
        let input = input_for(&steps);
        let engine = Engine::new(
            pool.clone(),
            Targets::default(),
            clock.clone(),
            settings("w"),
        );
        let first = submit(&engine, &name, input.clone()).await;
        let answers = run_to_the_end(&pool, &clock, &straight, first).await;
        // Cut at one to four of the calls a straight run makes.
        let calls = straight.seen.lock().unwrap().len();
        let cut_at = proptest::collection::btree_set(1..=calls, 1..=calls.min(4))
            .new_tree(&mut runner)
            .unwrap()
            .current();
        let second = submit(&engine, &name, input).await;
        let cut = Recorder::default();
        *cut.cut_at.lock().unwrap() = cut_at.clone();
        let resumed = run_to_the_end(&pool, &clock, &cut, second).await;
        let context = format!("case {case}, cut at calls {cut_at:?}, graph {steps:?}");
        let not_cut = cut.cut_at.lock().unwrap().len();
        println!(
            "case {case}: {} steps, {} calls straight, {} cut ({} of {} cuts made)",
            steps.len(),
            straight.seen.lock().unwrap().len(),
            cut.seen.lock().unwrap().len(),
            cut_at.len() - not_cut,
            cut_at.len()
        );
        check_calls(
            &steps,
            &straight.seen.lock().unwrap(),
            &format!("straight run; {context}"),
        );
        check_calls(
            &steps,
            &cut.seen.lock().unwrap(),
            &format!("cut run; {context}"),
        );
        // The answers name their job in keys only: compare without it.
        let strip = |answers: BTreeMap<String, Value>, job: Uuid| {
            serde_json::to_string(&answers)
                .unwrap()
                .replace(&job.to_string(), "JOB")
        };
        assert_eq!(strip(resumed, second), strip(answers, first), "{context}");
    }
}
