//! Repeating steps: called again, a pause apart and holding no lease in
//! between, until the answer says done; each "not yet" checkpointed with
//! a key of its own; past `for`, ended as a wait's timeout ends it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_store::RunStatus;
use flotilla_worker::engine::{Clock as _, Engine, ManualClock, Outcome};
use flotilla_worker::targets::{FnTarget, StepFailure, TargetCall, Targets};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::support::{engine, manual_clock, row, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// An export service: not ready for the first `ready_after` calls. Keeps
/// each call's idempotency key.
fn exports(ready_after: usize, keys: &Arc<Mutex<Vec<String>>>) -> Targets {
    let keys = keys.clone();
    let mut targets = Targets::default();
    targets.register(
        "exports",
        Arc::new(FnTarget(move |call: TargetCall| {
            let mut keys = keys.lock().unwrap();
            keys.push(call.idempotency_key());
            let ready = keys.len() > ready_after;
            async move { Ok::<_, StepFailure>(json!({"ready": ready, "url": "s3://x"})) }
        })),
        8,
    );
    targets
}

type Keys = Arc<Mutex<Vec<String>>>;

async fn poller(
    pool: &PgPool,
    ready_after: usize,
    extra: Value,
) -> (Engine, Arc<ManualClock>, Keys) {
    let keys = Keys::default();
    let clock = manual_clock();
    let engine = engine(pool, exports(ready_after, &keys), clock.clone(), "w");
    let mut step = json!({"name": "export", "target": "exports", "method": "status",
        "repeat": {"until": "response.ready", "every": "30s", "for": "2m"}});
    step.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    engine
        .register_workflow(&json!({"name": "export", "input_schema": {}, "steps": [step]}))
        .await
        .unwrap();
    (engine, clock, keys)
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_repeating_step_polls_asleep_between_calls_until_its_answer_says_done(pool: PgPool) {
    let (engine, clock, keys) = poller(&pool, 2, json!({})).await;
    let job_id = submit(&engine, "export", json!({})).await;
    for poll in 0..2 {
        assert_eq!(engine.run_once().await.unwrap(), Outcome::Sleeping(job_id));
        let asleep = row(&pool, job_id).await;
        assert_eq!(asleep.status, RunStatus::Queued);
        assert_eq!(asleep.lease_owner, None, "no lease held between calls");
        assert_eq!(asleep.run_after, clock.now() + Duration::from_secs(30));
        let last = asleep
            .checkpoints
            .0
            .as_array()
            .unwrap()
            .last()
            .cloned()
            .unwrap();
        assert_eq!(last["poll"], poll, "{last}");
        assert_eq!(
            last["response"],
            json!({"calls": poll + 1}),
            "only the count is kept"
        );
        // Not before its pause ends.
        assert_eq!(engine.run_once().await.unwrap(), Outcome::Idle);
        clock.advance(Duration::from_secs(30));
    }
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    let done = row(&pool, job_id).await;
    assert_eq!(
        done.result.as_ref().unwrap().0,
        json!({"ready": true, "url": "s3://x"})
    );
    assert_eq!(
        done.reader_level,
        flotilla_store::runs::STEP_FORMS_READER_LEVEL
    );
    let keys = keys.lock().unwrap().clone();
    assert_eq!(
        keys,
        (0..3)
            .map(|poll| format!("{job_id}:export:poll-{poll}"))
            .collect::<Vec<_>>()
    );
    let graph = flotilla_worker::engine::ops::graph_view::of(&done).unwrap();
    assert_eq!(
        (graph.nodes[0].kind, graph.nodes[0].polls),
        ("repeat", Some(2))
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn past_its_for_a_repeating_step_ends_as_a_waits_timeout_does(pool: PgPool) {
    for (on_timeout, status, result) in [
        (json!({}), RunStatus::Failed, None),
        (
            json!({"on_timeout": {"value": {"ready": "gave up"}}}),
            RunStatus::Completed,
            Some(json!({"ready": "gave up"})),
        ),
    ] {
        let (engine, clock, keys) = poller(&pool, usize::MAX, on_timeout).await;
        let job_id = submit(&engine, "export", json!({})).await;
        let mut rounds = 0;
        let ended = loop {
            match engine.run_once().await.unwrap() {
                Outcome::Sleeping(_) => clock.advance(Duration::from_secs(30)),
                ended => break ended,
            }
            rounds += 1;
            assert!(rounds < 10, "it never stopped repeating");
        };
        let job = row(&pool, job_id).await;
        assert_eq!(job.status, status, "{ended:?} {:?}", job.error);
        assert_eq!(job.result.map(|r| r.0), result);
        if status == RunStatus::Failed {
            let error = job.error.unwrap_or_default();
            assert!(error.contains("timed out after 2m of repeating"), "{error}");
        }
        // A call at 0, 30, 60, 90 and 120 s at most: the bound is 2 minutes.
        let calls = keys.lock().unwrap().len();
        assert!((4..=5).contains(&calls), "{calls} calls");
    }
}
