//! `flotilla-rehearsal`: a definition run through the real engine against
//! recorded answers, on a virtual clock (`flotilla workflows test`).
//!
//! Nothing here decides what a workflow does: the engine claims, replays,
//! calls, checkpoints, retries, sleeps, parks and compensates exactly as a
//! worker does, in a scratch database of its own (`scratch.rs`). What is
//! stood in is the world: every target answers from the fixtures
//! (`answers.rs`), signals and external answers are given the moment the
//! job waits for them, a child whose definition is not given ends as the
//! fixtures say, and the engine's clock is a [`ManualClock`] that jumps to
//! the next instant anything comes due when nothing else can run, so a
//! one-hour timer or a backoff takes no wall time.

mod answers;
pub mod fixtures;
mod path;
mod scratch;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, TimeZone as _, Utc};
use flotilla_engine::ops::signal::{Signal, SignalError};
use flotilla_engine::rows::{RunRow, RunStatus};
use flotilla_engine::{
    Clock as _, CompleteOutcome, Engine, EngineSettings, ManualClock, Outcome, RefusalMode,
    Submission, WorkflowRef, child_id,
};
use flotilla_workflow::WorkflowDefinition;
use serde_json::{Value as Json, json};
use uuid::Uuid;

pub use answers::Call;
pub use fixtures::Fixtures;
pub use path::{Line, Rehearsal};

use answers::{CHILD_TARGET, Recorded};
use path::PathLog;
use scratch::Scratch;

/// Segments, deliveries and clock moves a rehearsal may take: a workflow
/// that needs more is looping.
const MAX_ROUNDS: usize = 10_000;

/// The namespace of rehearsed jobs' ids.
const REHEARSAL_NAMESPACE: Uuid = Uuid::from_u128(0x6b1f_03d2_58c4_4e0a_9d7e_2a61_c5f8_b934);

/// Where the virtual clock starts: a fixed instant, so two rehearsals of
/// the same files print the same path.
fn epoch() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0)
        .single()
        .unwrap_or_else(Utc::now)
}

/// Why a rehearsal could not run (its outcome, whatever it is, is a
/// [`Rehearsal`]).
#[derive(Debug, thiserror::Error)]
pub enum RehearsalError {
    /// The definitions or fixtures are wrong: the author's to fix.
    #[error("{0}")]
    Fixtures(String),
    /// The database could not be reached, created or used.
    #[error("the database: {0}")]
    Database(String),
}

impl RehearsalError {
    fn database(e: impl std::fmt::Display) -> Self {
        Self::Database(e.to_string())
    }
}

/// Runs the workflow the fixtures name (the first of `definitions` when
/// they name none) with the fixtures' input, against their answers, in a
/// scratch database created beside the one `database_url` names.
///
/// # Errors
/// A definition or the fixtures are wrong, or the database failed.
pub async fn rehearse(
    database_url: &str,
    definitions: &[Json],
    fixtures: &Fixtures,
) -> Result<Rehearsal, RehearsalError> {
    let plan = Plan::of(definitions, fixtures)?;
    let scratch = Scratch::create(database_url).await?;
    let clock = Arc::new(ManualClock::new(epoch()));
    let recorded = Recorded::new(
        fixtures.answers.clone(),
        fixtures.children.clone(),
        clock.clone(),
        scratch.pool.clone(),
    );
    let mut settings = EngineSettings::new("rehearsal");
    // One claim at a time: the path is the same on every run.
    settings.claim_loops = 1;
    let engine = Engine::new(
        scratch.pool.clone(),
        recorded.targets(plan.targets.iter().cloned()),
        clock.clone(),
        settings,
    );
    let rehearsal = Rehearsing {
        engine: &engine,
        clock: &clock,
        recorded: &recorded,
        fixtures,
        plan: &plan,
    }
    .run()
    .await;
    engine.close().await;
    scratch.drop_database().await;
    rehearsal
}

/// What the given files make: the workflow to run, the targets to stand
/// in, and the children to stand in.
#[derive(Debug)]
struct Plan {
    definitions: Vec<Json>,
    parsed: Vec<WorkflowDefinition>,
    main: String,
    targets: BTreeSet<String>,
    /// Child workflow name → the stand-in definition registered for it.
    stand_ins: BTreeMap<String, Json>,
}

impl Plan {
    fn of(definitions: &[Json], fixtures: &Fixtures) -> Result<Self, RehearsalError> {
        let parsed = definitions
            .iter()
            .map(|document| {
                serde_json::from_value::<WorkflowDefinition>(document.clone()).map_err(|e| {
                    RehearsalError::Fixtures(format!(
                        "{}: {e} (flotilla workflows validate says more)",
                        document["name"].as_str().unwrap_or("a definition")
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let names: HashSet<&str> = parsed.iter().map(|d| d.name.as_str()).collect();
        let main = match &fixtures.workflow {
            Some(name) if names.contains(name.as_str()) => name.clone(),
            Some(name) => {
                return Err(RehearsalError::Fixtures(format!(
                    "workflow: {name:?} is not among the definitions given"
                )));
            }
            None => parsed
                .first()
                .map(|d| d.name.clone())
                .ok_or_else(|| RehearsalError::Fixtures("no definition given".to_owned()))?,
        };
        let mut targets = BTreeSet::new();
        // Stood-in child workflow → the keys of every result it may end with.
        let mut result_keys: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for definition in &parsed {
            for step in definition.steps.iter().chain(&definition.on_failure) {
                if !step.target.is_empty() {
                    targets.insert(step.target.clone());
                }
                let Some(start) = &step.start else { continue };
                if names.contains(start.workflow.as_str()) {
                    continue;
                }
                let Some(end) = fixtures.children.get(&step.name) else {
                    return Err(RehearsalError::Fixtures(format!(
                        "step {} starts workflow {:?}: give its definition too, or say how its child ends under children.{}",
                        step.name, start.workflow, step.name
                    )));
                };
                result_keys
                    .entry(start.workflow.clone())
                    .or_default()
                    .extend(end.result.iter().flat_map(|r| r.keys().cloned()));
            }
        }
        let stand_ins = result_keys
            .iter()
            .map(|(workflow, keys)| (workflow.clone(), stand_in(workflow, keys)))
            .collect();
        for step in fixtures.children.keys() {
            let starts = parsed
                .iter()
                .flat_map(|d| &d.steps)
                .any(|s| &s.name == step && s.start.is_some());
            if !starts {
                return Err(RehearsalError::Fixtures(format!(
                    "children.{step}: no step of that name starts a child"
                )));
            }
        }
        Ok(Self {
            definitions: definitions.to_vec(),
            parsed,
            main,
            targets,
            stand_ins,
        })
    }

    /// The stood-in children of `job_id`, a run of `workflow`, and of their
    /// children whose definitions were given, down the family.
    fn stand_in_children(
        &self,
        job_id: Uuid,
        workflow: &str,
        depth: u8,
        found: &mut Vec<(Uuid, String)>,
    ) {
        let Some(definition) = self.parsed.iter().find(|d| d.name == workflow) else {
            return;
        };
        if depth > 8 {
            return;
        }
        for step in &definition.steps {
            let Some(start) = &step.start else { continue };
            // One child, or one per item (known by `<step>[<index>]`,
            // as many as the step may give items).
            let keys: Vec<String> = if step.for_each.is_some() {
                (0..step.max_items())
                    .map(|item| flotilla_engine::child_item_key(&step.name, item))
                    .collect()
            } else {
                vec![step.name.clone()]
            };
            for key in keys {
                let child = child_id(job_id, &key);
                if self.stand_ins.contains_key(&start.workflow) {
                    found.push((child, step.name.clone()));
                } else if found.len() < MAX_STAND_INS {
                    self.stand_in_children(child, &start.workflow, depth + 1, found);
                }
            }
        }
    }
}

/// The most stood-in children one rehearsal registers (a family of
/// per-item children down several levels would otherwise be unbounded).
const MAX_STAND_INS: usize = 100_000;

/// A one-step workflow named `workflow` whose step asks the fixtures how
/// the child ends and whose output holds the keys of its result.
fn stand_in(workflow: &str, keys: &BTreeSet<String>) -> Json {
    let output: Vec<String> = keys
        .iter()
        .map(|key| format!("{key} = has(steps.end.{key}) ? steps.end.{key} : null"))
        .collect();
    json!({
        "name": workflow,
        "input_schema": {},
        "max_attempts": 1,
        "steps": [{"name": "end", "target": CHILD_TARGET, "method": "end"}],
        "output": output,
    })
}

struct Rehearsing<'a> {
    engine: &'a Engine,
    clock: &'a Arc<ManualClock>,
    recorded: &'a Arc<Recorded>,
    fixtures: &'a Fixtures,
    plan: &'a Plan,
}

impl Rehearsing<'_> {
    async fn run(&self) -> Result<Rehearsal, RehearsalError> {
        for document in self
            .plan
            .definitions
            .iter()
            .chain(self.plan.stand_ins.values())
        {
            self.engine.register_workflow(document).await.map_err(|e| {
                RehearsalError::Fixtures(format!(
                    "{}: {e}",
                    document["name"].as_str().unwrap_or("a definition")
                ))
            })?;
        }
        // Named by what runs, so the same files take the same path (a
        // retry's jitter follows the job id).
        let job_id = Uuid::new_v5(
            &REHEARSAL_NAMESPACE,
            format!("{}\n{}", self.plan.main, self.fixtures.input).as_bytes(),
        );
        let mut stood_in = Vec::new();
        self.plan
            .stand_in_children(job_id, &self.plan.main, 0, &mut stood_in);
        for (child, step) in &stood_in {
            self.recorded.stand_in(*child, step);
        }
        let submission = Submission {
            metadata: None,
            job_id,
            workflow: WorkflowRef::Stored(self.plan.main.clone()),
            input: self.fixtures.input.clone(),
            traceparent: None,
            tracestate: None,
            priority: 0,
        };
        self.engine
            .submit(submission, RefusalMode::Refuse)
            .await
            .map_err(|e| RehearsalError::Fixtures(format!("input: {e}")))?;
        let mut log = PathLog::new(job_id, epoch());
        let rows = self.rows().await?;
        log.saw(None, &[], &self.events(&rows).await?, &rows);
        let mut delivered = HashSet::new();
        let mut stalled = None;
        let mut idle_rounds = 0;
        for round in 0..=MAX_ROUNDS {
            if round == MAX_ROUNDS {
                stalled = Some(format!(
                    "still running after {MAX_ROUNDS} segments and clock moves: does it loop?"
                ));
                break;
            }
            let outcome = self
                .engine
                .run_once()
                .await
                .map_err(RehearsalError::database)?;
            let rows = self.rows().await?;
            let ran = outcome_job(&outcome);
            log.saw(
                ran,
                &self.recorded.calls(),
                &self.events(&rows).await?,
                &rows,
            );
            if let Outcome::Requeued(id) = outcome
                && let Some(row) = rows.get(&id)
            {
                log.requeued(row);
            }
            if !matches!(outcome, Outcome::Idle) {
                idle_rounds = 0;
                continue;
            }
            let top = &rows[&job_id];
            if top.status.is_finished() {
                break;
            }
            if self.deliver(&rows, &mut delivered, &mut log).await? {
                idle_rounds = 0;
                continue;
            }
            idle_rounds += 1;
            match next_due(&rows) {
                Some(due) if idle_rounds < 3 => {
                    let now = self.clock.now();
                    if due > now {
                        self.clock.advance((due - now).to_std().unwrap_or_default());
                        log.clock_moved(due);
                    }
                    self.engine
                        .wake_due_waits()
                        .await
                        .map_err(RehearsalError::database)?;
                }
                _ => {
                    stalled = Some(waits_for(top));
                    break;
                }
            }
        }
        let rows = self.rows().await?;
        let top = rows[&job_id].clone();
        Ok(log.finish(&top, self.clock.now(), stalled, self.recorded.unanswered()))
    }

    /// Every run of the rehearsal (the job and its children), by id.
    async fn rows(&self) -> Result<HashMap<Uuid, RunRow>, RehearsalError> {
        let ids: Vec<Uuid> = sqlx::query_scalar("SELECT job_id FROM workflow_run")
            .fetch_all(self.engine.pool())
            .await
            .map_err(RehearsalError::database)?;
        let mut rows = HashMap::new();
        for id in ids {
            if let Some(row) = self
                .engine
                .job(id)
                .await
                .map_err(RehearsalError::database)?
            {
                rows.insert(id, row);
            }
        }
        Ok(rows)
    }

    async fn events(
        &self,
        rows: &HashMap<Uuid, RunRow>,
    ) -> Result<Vec<flotilla_contracts::WorkflowRunEvent>, RehearsalError> {
        let mut events = Vec::new();
        let mut connection = self
            .engine
            .pool()
            .acquire()
            .await
            .map_err(RehearsalError::database)?;
        for id in rows.keys() {
            events.extend(
                flotilla_store::outbox::events_of(&mut connection, *id)
                    .await
                    .map_err(RehearsalError::database)?,
            );
        }
        Ok(events)
    }

    /// Gives every waiting run the signals and external answers the
    /// fixtures hold for the steps it waits at. Whether anything was given.
    async fn deliver(
        &self,
        rows: &HashMap<Uuid, RunRow>,
        delivered: &mut HashSet<(Uuid, String)>,
        log: &mut PathLog,
    ) -> Result<bool, RehearsalError> {
        let mut gave = false;
        for row in rows.values().filter(|r| r.status == RunStatus::Waiting) {
            let Some(definition) = self
                .plan
                .parsed
                .iter()
                .find(|d| d.name == row.workflow_name)
            else {
                continue;
            };
            for step in &definition.steps {
                if let Some(name) = &step.wait_for
                    && let Some(payload) = self.fixtures.signals.get(name)
                    && !delivered.contains(&(row.job_id, format!("signal {name}")))
                {
                    let signal = Signal {
                        job_id: row.job_id,
                        name: name.clone(),
                        payload: payload.clone(),
                        source: json!("flotilla workflows test"),
                        idempotency_key: format!("rehearsal-{name}"),
                    };
                    match self.engine.send_signal(signal).await {
                        Ok(_) => {
                            delivered.insert((row.job_id, format!("signal {name}")));
                            log.gave(
                                row.job_id,
                                format!("signal {name} {payload}"),
                                self.clock.now(),
                            );
                            gave = true;
                        }
                        // Not awaited yet: given when it is.
                        Err(SignalError::NotAwaited { .. }) => {}
                        Err(SignalError::Store(e)) => return Err(RehearsalError::database(e)),
                        Err(refused) => {
                            return Err(RehearsalError::Fixtures(format!(
                                "signals.{name}: refused: {refused}"
                            )));
                        }
                    }
                }
                if step.completion == Some(flotilla_workflow::Completion::External)
                    && row.outstanding_step.as_deref() == Some(step.name.as_str())
                    && let Some(answer) = self.fixtures.completions.get(&step.name)
                    && !delivered.contains(&(row.job_id, format!("completion {}", step.name)))
                {
                    let completed = self
                        .engine
                        .complete_step(row.job_id, &step.name, answer.clone())
                        .await
                        .map_err(|e| {
                            RehearsalError::Fixtures(format!("completions.{}: {e}", step.name))
                        })?;
                    if !matches!(completed, CompleteOutcome::WrongState { .. }) {
                        delivered.insert((row.job_id, format!("completion {}", step.name)));
                        log.gave(
                            row.job_id,
                            format!("the answer of {} {answer}", step.name),
                            self.clock.now(),
                        );
                        gave = true;
                    }
                }
            }
        }
        Ok(gave)
    }
}

/// The earliest instant a run of the family comes due: a queued run's
/// `run_after` (a backoff, a timer), a waiting one's timer or Kafka deadline.
fn next_due(rows: &HashMap<Uuid, RunRow>) -> Option<DateTime<Utc>> {
    rows.values()
        .filter_map(|row| match row.status {
            RunStatus::Queued => Some(row.run_after),
            RunStatus::Waiting => match (row.wake_at, row.reply_deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            _ => None,
        })
        .min()
}

/// The job a segment ran, if one did.
fn outcome_job(outcome: &Outcome) -> Option<Uuid> {
    match *outcome {
        Outcome::Idle => None,
        Outcome::Completed(id)
        | Outcome::Parked(id)
        | Outcome::Sleeping(id)
        | Outcome::Cancelled(id)
        | Outcome::Failed(id)
        | Outcome::Dead(id)
        | Outcome::Requeued(id)
        | Outcome::Released(id)
        | Outcome::Held(id)
        | Outcome::LeaseLost(id)
        | Outcome::StoreFailed(id) => Some(id),
    }
}

/// What a job that cannot go on waits for, in words.
fn waits_for(row: &RunRow) -> String {
    match (&row.status, &row.outstanding_step) {
        (RunStatus::Waiting, Some(step)) => format!(
            "the job waits at step {step} and the fixtures give nothing it takes (signals, completions, children)"
        ),
        (status, _) => format!("the job is {status} and nothing comes due"),
    }
}
