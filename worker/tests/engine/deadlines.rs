//! The segment's deadline: met after the segment wrote checkpoints, it is
//! progress, and the job goes on at once with its attempt given back; met
//! with nothing written, it is a retryable failure that spends attempts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_store::RunStatus;
use flotilla_worker::engine::{Clock as _, Engine, ManualClock, Outcome};
use flotilla_worker::targets::{FnTarget, StepFailure, TargetCall, Targets};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{engine, manual_clock, row, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// `each` calls `work` once per item of `input.items`, one at a time,
/// within segments of `deadline_ms`, with 3 attempts.
fn items_workflow(deadline_ms: u64) -> Value {
    json!({
        "name": "items", "input_schema": {}, "parallelism": 1,
        "deadline_ms": deadline_ms, "max_attempts": 3,
        "steps": [{"name": "each", "target": "work", "method": "work",
                   "for_each": "input.items", "rules": ["n = item"]}]
    })
}

/// The items `work` answered, each with the call's part (idempotency
/// key's tail). It takes 50 ms an item, and forever for item 13.
#[derive(Debug, Clone, Default)]
struct Answered(Arc<Mutex<Vec<Item>>>);

/// An item answered, and its call's part.
type Item = (i64, Option<String>);

impl Answered {
    fn targets(&self) -> Targets {
        let answered = self.clone();
        let mut targets = Targets::default();
        targets.register(
            "work",
            Arc::new(FnTarget(move |call: TargetCall| {
                let answered = answered.clone();
                async move {
                    let n = call.request["n"].as_i64().unwrap();
                    // The target's work, cut by the segment's deadline.
                    let takes = if n == 13 { 3_600_000 } else { 50 };
                    tokio::time::sleep(Duration::from_millis(takes)).await;
                    answered.0.lock().unwrap().push((n, call.part.clone()));
                    Ok::<_, StepFailure>(json!({"done": n}))
                }
            })),
            8,
        );
        targets
    }

    fn all(&self) -> Vec<Item> {
        self.0.lock().unwrap().clone()
    }
}

/// An engine on a manual clock, with `answered`'s target, and a job of
/// [`items_workflow`] over `items`.
async fn started(
    pool: &PgPool,
    answered: &Answered,
    deadline_ms: u64,
    items: Value,
) -> (Engine, Arc<ManualClock>, Uuid) {
    let clock = manual_clock();
    let engine = engine(pool, answered.targets(), clock.clone(), "w");
    engine
        .register_workflow(&items_workflow(deadline_ms))
        .await
        .unwrap();
    let job_id = submit(&engine, "items", json!({ "items": items })).await;
    (engine, clock, job_id)
}

/// What one segment came to, and the attempt the row held after it.
type Segment = (Outcome, i32, RunStatus);

/// Runs segments of `job_id` until it finishes (at most `most`), the
/// clock moved past any backoff after each.
async fn run_to_the_end(
    engine: &Engine,
    clock: &ManualClock,
    pool: &PgPool,
    job_id: Uuid,
    most: usize,
) -> Vec<Segment> {
    let mut segments = Vec::new();
    for _ in 0..most {
        let outcome = engine.run_once().await.unwrap();
        let after = row(pool, job_id).await;
        let requeued_at_once = after.run_after <= clock.now();
        segments.push((outcome.clone(), after.attempt, after.status));
        if outcome != Outcome::Requeued(job_id) {
            break;
        }
        if !requeued_at_once {
            clock.advance(Duration::from_secs(3600));
        }
    }
    segments
}

/// 100 items at 50 ms, one at a time, need about 5 s: five segments of
/// 1 s. Each writes checkpoints, so none is a failure: the job completes
/// with every item answered once, and the attempt never climbs.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_for_each_longer_than_its_deadline_goes_on_over_segments_that_make_progress(
    pool: PgPool,
) {
    let answered = Answered::default();
    let items: Vec<i64> = (100..200).collect();
    let (engine, clock, job_id) = started(&pool, &answered, 1_000, json!(items)).await;

    let segments = run_to_the_end(&engine, &clock, &pool, job_id, 40).await;
    let done = row(&pool, job_id).await;
    assert_eq!(
        segments.last().map(|s| s.0.clone()),
        Some(Outcome::Completed(job_id)),
        "{segments:?}, {:?}, {} items answered",
        done.error,
        answered.all().len()
    );
    assert!(segments.len() > 2, "the deadline was met: {segments:?}");
    for (outcome, attempt, status) in &segments[..segments.len() - 1] {
        assert_eq!(*outcome, Outcome::Requeued(job_id));
        assert_eq!(
            (*attempt, *status),
            (0, RunStatus::Queued),
            "back at once, the attempt given back: {segments:?}"
        );
    }
    assert_eq!(done.attempt, 1, "only the last segment's claim is counted");
    let mut per_item: HashMap<i64, Vec<Option<String>>> = HashMap::new();
    for (n, part) in answered.all() {
        per_item.entry(n).or_default().push(part);
    }
    assert_eq!(per_item.len(), 100);
    for (n, parts) in per_item {
        assert_eq!(
            parts,
            [Some(format!("item-{}", n - 100))],
            "item {n} answered once"
        );
    }
}

/// A segment that writes nothing before its deadline is a failure as
/// before, even when an earlier segment made progress: item 13 never
/// answers in time, so after the segment that answered the items before
/// it, each attempt is spent and the job ends DEAD.
#[sqlx::test(migrator = "MIGRATOR")]
async fn segments_that_reach_their_deadline_without_progress_spend_attempts_and_end_dead(
    pool: PgPool,
) {
    let answered = Answered::default();
    let (engine, clock, job_id) = started(&pool, &answered, 300, json!([11, 12, 13, 14])).await;

    let segments = run_to_the_end(&engine, &clock, &pool, job_id, 10).await;
    let requeued = Outcome::Requeued(job_id);
    // Items 11 and 12 take 100 ms of the first segment's 300 (a slow
    // machine may need a second segment for them: progress all the same).
    let (progress, nothing) = segments.split_at(segments.len().saturating_sub(3));
    assert!(
        !progress.is_empty()
            && progress
                .iter()
                .all(|s| *s == (requeued.clone(), 0, RunStatus::Queued)),
        "{segments:?}"
    );
    assert_eq!(
        nothing,
        [
            (requeued.clone(), 1, RunStatus::Queued),
            (requeued, 2, RunStatus::Queued),
            (Outcome::Dead(job_id), 3, RunStatus::Dead),
        ],
        "{segments:?}: {:?}",
        row(&pool, job_id).await.error
    );
    let error = row(&pool, job_id).await.error.unwrap_or_default();
    assert!(error.contains("segment deadline of 300 ms"), "{error}");
    let items: Vec<i64> = answered.all().into_iter().map(|(n, _)| n).collect();
    assert_eq!(items, [11, 12], "item 13 never answered, 14 never called");
}

/// The same for a list of steps: 20 steps of 50 ms, segments of 300 ms.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_list_of_steps_longer_than_its_deadline_completes_without_spending_attempts(
    pool: PgPool,
) {
    let answered = Answered::default();
    let clock = manual_clock();
    let engine = engine(&pool, answered.targets(), clock.clone(), "w");
    let steps: Vec<Value> = (20..40)
        .map(|n| json!({"name": format!("s{n}"), "target": "work", "method": "work", "rules": [format!("n = {n}")]}))
        .collect();
    let workflow = json!({"name": "chain", "input_schema": {}, "deadline_ms": 300,
        "max_attempts": 3, "steps": steps});
    engine.register_workflow(&workflow).await.unwrap();
    let job_id = submit(&engine, "chain", json!({})).await;

    let segments = run_to_the_end(&engine, &clock, &pool, job_id, 40).await;
    let (last, before) = segments.split_last().unwrap();
    assert_eq!(last.0, Outcome::Completed(job_id), "{segments:?}");
    assert!(!before.is_empty(), "the deadline was met: {segments:?}");
    assert!(
        before
            .iter()
            .all(|s| *s == (Outcome::Requeued(job_id), 0, RunStatus::Queued)),
        "{segments:?}"
    );
    let steps: Vec<i64> = answered.all().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        steps,
        (20..40).collect::<Vec<i64>>(),
        "each step answered once"
    );
}
