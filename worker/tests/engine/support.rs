//! Shared pieces of the engine tests: engines over a test database, a
//! recording in-process target, workflows, and row/event readers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{TimeZone, Utc};
use flotilla_contracts::{WorkflowRunEvent, WorkflowRunEventType};
use flotilla_store::{outbox, runs};
use flotilla_worker::engine::{
    Clock, Engine, EngineSettings, ManualClock, RefusalMode, Submission, Switch, WorkflowRef,
};
use flotilla_worker::targets::{FnTarget, StepFailure, TargetCall, Targets};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

pub(crate) fn settings(worker_id: &str) -> EngineSettings {
    let mut settings = EngineSettings::new(worker_id);
    settings.lease = Duration::from_secs(60);
    settings.idle_poll_max = Duration::from_millis(50);
    settings.sweep_interval = Duration::from_millis(200);
    settings
}

pub(crate) fn manual_clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap(),
    ))
}

/// An engine of echo targets (`calls` records them) on which `workflow`
/// (three steps) is stored.
pub(crate) async fn echo_engine(
    pool: &PgPool,
    calls: &Calls,
    clock: Arc<dyn Clock>,
    settings: EngineSettings,
    workflow: &str,
) -> Engine {
    let engine = Engine::new(pool.clone(), echo_targets(calls), clock, settings);
    engine
        .register_workflow(&three_steps(workflow, "echo"))
        .await
        .unwrap();
    engine
}

/// Runs `engine` (its loops and services) until the returned token is
/// cancelled; the handle ends when it has stopped.
pub(crate) fn run_in_background(
    engine: &Engine,
) -> (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn({
        let (engine, stop) = (engine.clone(), stop.clone());
        async move { engine.run(stop, Duration::from_secs(5)).await }
    });
    (stop, running)
}

pub(crate) fn engine(
    pool: &PgPool,
    targets: Targets,
    clock: Arc<dyn Clock>,
    worker_id: &str,
) -> Engine {
    Engine::new(pool.clone(), targets, clock, settings(worker_id))
}

/// Every call a target saw, as (job, step).
#[derive(Debug, Clone, Default)]
pub(crate) struct Calls(Arc<Mutex<Vec<(Uuid, String)>>>);

impl Calls {
    pub(crate) fn record(&self, call: &TargetCall) {
        self.0
            .lock()
            .unwrap()
            .push((call.job_id, call.step_name.clone()));
    }

    /// Every call in the order made: (job, step).
    pub(crate) fn all(&self) -> Vec<(Uuid, String)> {
        self.0.lock().unwrap().clone()
    }

    pub(crate) fn of(&self, job_id: Uuid) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(j, _)| *j == job_id)
            .map(|(_, s)| s.clone())
            .collect()
    }

    pub(crate) fn per_job_step(&self) -> HashMap<(Uuid, String), usize> {
        let mut counts = HashMap::new();
        for key in self.0.lock().unwrap().iter() {
            *counts.entry(key.clone()).or_insert(0) += 1;
        }
        counts
    }
}

/// A target `echo` that records calls and answers `{"step": <name>, "request": <request>}`.
pub(crate) fn echo_targets(calls: &Calls) -> Targets {
    let calls = calls.clone();
    let mut targets = Targets::default();
    targets.register(
        "echo",
        Arc::new(FnTarget(move |call: TargetCall| {
            calls.record(&call);
            async move { Ok::<_, StepFailure>(json!({"step": call.step_name, "request": call.request})) }
        })),
        8,
    );
    targets
}

/// A three-step workflow on `target`, each step passing a counter along.
pub(crate) fn three_steps(name: &str, target: &str) -> Value {
    json!({
        "name": name,
        "input_schema": {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}},
        "steps": [
            {"name": "one", "target": target, "method": "one", "rules": ["n = input.n"]},
            {"name": "two", "target": target, "method": "two", "rules": ["n = steps.one.request.n + 1"]},
            {"name": "three", "target": target, "method": "three", "rules": ["n = steps.two.request.n + 1"]}
        ],
        "output": ["total = steps.three.request.n"],
        "verdict": "'total ' + string(steps.three.request.n)"
    })
}

/// A workflow `name` of one step, `only`, calling `target`'s `go`, with
/// `extra`'s fields added to the step.
pub(crate) fn one_step(name: &str, target: &str, extra: Value) -> Value {
    let mut step = json!({"name": "only", "target": target, "method": "go"});
    step.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    json!({"name": name, "input_schema": {}, "steps": [step]})
}

/// `approval`: prepare (echo) → approve (external, must say approved) →
/// notify (echo, told who approved).
pub(crate) fn approval() -> Value {
    json!({
        "name": "approval",
        "input_schema": {},
        "steps": [
            {"name": "prepare", "target": "echo", "method": "prepare"},
            {"name": "approve", "target": "echo", "method": "approve", "completion": "external",
             "output_schema": {"type": "object", "required": ["approved"]},
             "validate": ["response.approved == true"]},
            {"name": "notify", "target": "echo", "method": "notify", "rules": ["by = steps.approve.by"]}
        ]
    })
}

/// An engine for [`approval`], its checkpoints as rows or in the row's
/// array: one checkpoint written by a lease holder, one by an answer, one
/// after the answer.
pub(crate) async fn approval_engine(pool: &PgPool, calls: &Calls, checkpoint_rows: bool) -> Engine {
    let mut settings = settings("w");
    settings.checkpoint_rows = if checkpoint_rows {
        Switch::True
    } else {
        Switch::False
    };
    // Only the layout under test: definitions stay copied.
    settings.definition_by_reference = Switch::False;
    let engine = Engine::new(pool.clone(), echo_targets(calls), manual_clock(), settings);
    engine.settle_switches(true).await.unwrap();
    engine.register_workflow(&approval()).await.unwrap();
    engine
}

/// A submission of the stored workflow `name`.
pub(crate) fn stored(job_id: Uuid, name: &str, input: Value) -> Submission {
    Submission {
        metadata: None,
        priority: 0,
        job_id,
        workflow: WorkflowRef::Stored(name.into()),
        input,
        traceparent: None,
        tracestate: None,
    }
}

/// A submission carrying its own definition.
pub(crate) fn inline(job_id: Uuid, document: Value, input: Value) -> Submission {
    Submission {
        workflow: WorkflowRef::Inline(document),
        ..stored(job_id, "", input)
    }
}

pub(crate) async fn submit(engine: &Engine, workflow: &str, input: Value) -> Uuid {
    let job_id = Uuid::new_v4();
    engine
        .submit(stored(job_id, workflow, input), RefusalMode::Refuse)
        .await
        .unwrap();
    job_id
}

/// How many runs the database holds.
pub(crate) async fn rows(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM workflow_run")
        .fetch_one(pool)
        .await
        .unwrap()
}

pub(crate) async fn row(pool: &PgPool, job_id: Uuid) -> runs::RunRow {
    let mut conn = pool.acquire().await.unwrap();
    runs::get(&mut conn, job_id).await.unwrap().unwrap()
}

/// The step names of a run's checkpoint array, in order.
pub(crate) fn checkpoint_names(run: &runs::RunRow) -> Vec<String> {
    run.checkpoints
        .0
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["name"].as_str().unwrap_or_default().to_owned())
        .collect()
}

pub(crate) async fn events(pool: &PgPool, job_id: Uuid) -> Vec<WorkflowRunEvent> {
    let mut conn = pool.acquire().await.unwrap();
    outbox::events_of(&mut conn, job_id).await.unwrap()
}

pub(crate) async fn event_types(pool: &PgPool, job_id: Uuid) -> Vec<WorkflowRunEventType> {
    events(pool, job_id)
        .await
        .iter()
        .map(WorkflowRunEvent::event_type)
        .collect()
}

/// Polls `check` every 20 ms until it holds, failing after `timeout`.
pub(crate) async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A connection of its own, outside `pool`, for checks another session makes.
pub(crate) async fn own_connection(pool: &PgPool) -> sqlx::PgConnection {
    sqlx::ConnectOptions::connect(&*pool.connect_options())
        .await
        .unwrap()
}

/// Asserts that no session holds `job_id`'s row locked (as a claim's
/// SKIP LOCKED would find it), from `other`; `what` names the moment.
pub(crate) async fn assert_unlocked(other: &mut sqlx::PgConnection, job_id: Uuid, what: &str) {
    let locked = sqlx::query("SELECT 1 FROM workflow_run WHERE job_id = $1 FOR UPDATE NOWAIT")
        .bind(job_id)
        .execute(other)
        .await;
    assert!(
        locked.is_ok(),
        "{what}: the row is still locked: {locked:?}"
    );
}

/// A job's row held by a session of its own, as an operator's `BEGIN;
/// SELECT … FOR UPDATE` left open holds it.
pub(crate) struct RowHeld(sqlx::PgConnection);

impl RowHeld {
    pub(crate) async fn by_another_session(pool: &PgPool, job_id: Uuid) -> Self {
        let mut operator = own_connection(pool).await;
        sqlx::query("BEGIN").execute(&mut operator).await.unwrap();
        sqlx::query("SELECT 1 FROM workflow_run WHERE job_id = $1 FOR UPDATE")
            .bind(job_id)
            .execute(&mut operator)
            .await
            .unwrap();
        Self(operator)
    }

    /// The error `write` fails with while the row is held, asserting it
    /// did not wait for the lock longer than a few seconds.
    pub(crate) async fn fails_within_the_lock_wait<T: std::fmt::Debug, E>(
        &self,
        write: impl std::future::Future<Output = Result<T, E>>,
    ) -> E {
        let begun = std::time::Instant::now();
        let failed = tokio::time::timeout(Duration::from_secs(30), write)
            .await
            .expect("the write waited for the lock without bound")
            .expect_err("the write went through a held row");
        assert!(
            begun.elapsed() < Duration::from_secs(10),
            "{:?}",
            begun.elapsed()
        );
        failed
    }

    /// Ends the session's transaction: the row is free.
    pub(crate) async fn let_go(mut self) {
        sqlx::query("ROLLBACK").execute(&mut self.0).await.unwrap();
        sqlx::Connection::close(self.0).await.unwrap();
    }
}

/// Makes the store refuse as data (SQLSTATE 22023, as it refuses a value
/// it cannot hold) every `event` (`INSERT`, `DELETE`…) of a run whose row
/// (`NEW` or `OLD`, as `event` has it) matches `condition`.
pub(crate) async fn refuse_as_data(pool: &PgPool, event: &str, condition: &str) {
    let row = if event == "DELETE" { "OLD" } else { "NEW" };
    sqlx::query(&format!(
        "CREATE FUNCTION refuse_as_data() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN IF {condition} THEN
             RAISE EXCEPTION 'refused' USING ERRCODE = 'invalid_parameter_value'; END IF;
         RETURN {row}; END $$"
    ))
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(&format!(
        "CREATE TRIGGER refuse_as_data BEFORE {event} ON workflow_run
         FOR EACH ROW EXECUTE FUNCTION refuse_as_data()"
    ))
    .execute(pool)
    .await
    .unwrap();
}
