//! One segment: claim a job, replay its checkpoints, run its remaining steps
//! until it completes, parks, fails, or must be retried. How a step is
//! called is [`super::step`]; how a segment ends is [`super::settle`].

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use flotilla_runtime::supervise::panic_message;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt as _, StreamExt as _};
use tokio_util::sync::CancellationToken;

use flotilla_store::runs::Checkpoint;
use serde_json::{Map, Value as Json};
use uuid::Uuid;

use super::Engine;
use super::claimed::{ClaimedRun, SegmentStop};
use super::claims::ClaimError;
use super::schedule::Schedule;
use super::settle::{finish, settle};
use super::step::Invocation;
use crate::target::{RetryClass, StepFailure};
use crate::workflow::compile::schema_violations;
use crate::workflow::expr::Scope;
use crate::workflow::{CompiledWorkflow, Timer};

/// What one call of [`Engine::run_once`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing was claimable.
    Idle,
    Completed(Uuid),
    Parked(Uuid),
    /// QUEUED until a timer of the job wakes.
    Sleeping(Uuid),
    /// FAILED: a verdict or a defect.
    Failed(Uuid),
    /// DEAD: attempts exhausted.
    Dead(Uuid),
    /// QUEUED again after a retryable failure.
    Requeued(Uuid),
    /// Handed back: this worker lacks a target the job needs.
    Released(Uuid),
    /// Another worker took the job; this segment wrote nothing more.
    LeaseLost(Uuid),
    /// The store failed mid-segment; the job waits for its lease to lapse.
    StoreFailed(Uuid),
}

impl Engine {
    /// Claims the oldest eligible job and runs one segment of it.
    ///
    /// # Errors
    /// The claim itself failed (the database is unreachable).
    pub async fn run_once(&self) -> Result<Outcome, ClaimError> {
        match self.claim().await? {
            None => Ok(Outcome::Idle),
            Some(claimed) => Ok(self.run_segment(claimed).await),
        }
    }

    /// Claims the oldest eligible QUEUED job, if any, in a statement shared
    /// with this process's other loops looking for work (`claims.rs`).
    ///
    /// # Errors
    /// The claim statement failed.
    pub async fn claim(&self) -> Result<Option<ClaimedRun>, ClaimError> {
        let row = self.inner.claims.claim_one().await?;
        if let Some(row) = &row {
            super::telemetry::claimed(row.run_after.max(row.created_at));
        }
        Ok(row.and_then(|row| ClaimedRun::new(self.clone(), row)))
    }

    /// Runs a claimed job until it settles or the segment must stop, renewing
    /// the lease every quarter of its term meanwhile.
    pub async fn run_segment(&self, claimed: ClaimedRun) -> Outcome {
        let job_id = claimed.job_id();
        let _in_flight = self.inner.in_flight.enter(job_id, claimed.token());
        let heartbeat = claimed.heartbeat();
        let fence = claimed.fence();
        let row = claimed.row();
        // One span per segment (claim to settle or park), a child of the
        // run's trace, so retries, parks and resumes on other workers all
        // join the trace the request came with.
        let span = tracing::info_span!(
            "segment",
            otel.name = format!("run {}", row.workflow_name),
            otel.kind = "internal",
            %job_id,
            workflow_name = %row.workflow_name,
            trace_id = flotilla_runtime::trace::trace_id(row.traceparent.as_deref()),
            attempt = row.attempt,
            worker_id = %self.settings().worker_id,
        );
        flotilla_runtime::trace::continue_trace(
            &span,
            row.traceparent.as_deref(),
            row.tracestate.as_deref(),
        );
        // Lines about the job after the segment are logged in its span
        // too, so they carry its job id, workflow and trace id.
        let segment =
            tracing::Instrument::instrument(self.segment(claimed, heartbeat.lost()), span.clone());
        let outcome = match AssertUnwindSafe(segment).catch_unwind().await {
            Ok(outcome) => outcome,
            Err(panic) => {
                // A bug met by this job's data: settle it as a defect, keep the loop.
                let error = format!("the segment panicked: {}", panic_message(panic.as_ref()));
                span.in_scope(|| tracing::error!(%error, "segment panicked"));
                tracing::Instrument::instrument(fence.fail_defect(&error), span.clone())
                    .await
                    .map(|()| Outcome::Failed(job_id))
            }
        };
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(SegmentStop::LeaseLost(_)) => Outcome::LeaseLost(job_id),
            Err(SegmentStop::Refused(_)) => Outcome::Failed(job_id),
            Err(SegmentStop::Store(e)) => {
                // A failure of the database, not of the job or this worker:
                // the job goes back as it is durable, its attempt unspent.
                let reason = format!("handed back: the store failed mid-segment: {e}");
                let handed =
                    tracing::Instrument::instrument(fence.hand_back(&reason), span.clone()).await;
                span.in_scope(|| match handed {
                    Ok(()) => tracing::warn!(error = %e, "store failed mid-segment; job handed back"),
                    Err(back) => tracing::error!(error = %e, hand_back = %back,
                        "store failed mid-segment and the job could not be handed back; its lease will lapse"),
                });
                Outcome::StoreFailed(job_id)
            }
        };
        if heartbeat.lost().is_cancelled() && !matches!(outcome, Outcome::LeaseLost(_)) {
            span.in_scope(|| tracing::warn!(?outcome, "lease was lost during the segment"));
        }
        outcome
    }

    async fn segment(
        &self,
        claimed: ClaimedRun,
        lease_lost: &tokio_util::sync::CancellationToken,
    ) -> Result<Outcome, SegmentStop> {
        let job_id = claimed.job_id();
        let started = Instant::now();
        self.renew_if_stale(&claimed).await?;
        let missing = self.missing_targets(&claimed.row().definition.0);
        if !missing.is_empty() {
            return self.release_for_others(claimed, &missing).await;
        }
        let compiled = match self.compile(&claimed.row().definition.0).await {
            Ok(compiled) => compiled,
            Err(invalid) => {
                let error =
                    format!("the job's definition snapshot no longer compiles here: {invalid}");
                return settle(self, claimed, StepFailure::Defect(error)).await;
            }
        };
        // Checking the checkpoints against their schemas runs off the
        // runtime, as every schema validation does.
        let replayed = {
            let (compiled, checkpoints) = (compiled.clone(), claimed.row().checkpoints.0.clone());
            self.off_runtime(move || replay(&compiled, &checkpoints))
                .await
        };
        let (steps, ended) = match replayed {
            Ok(Ok(replayed)) => replayed,
            Ok(Err(error)) => return settle(self, claimed, StepFailure::Defect(error)).await,
            Err(exhausted) => {
                return settle(self, claimed, StepFailure::Defect(exhausted.to_string())).await;
            }
        };
        let schedule = Schedule::new(&compiled.graph, ended);
        let nodes = Nodes {
            engine: self,
            claimed: &claimed,
            compiled: &compiled,
            input: claimed.row().input.0.clone(),
            started,
            lease_lost,
        };
        let stop = nodes.run(schedule, steps).await?;
        let input = nodes.input;
        match stop {
            Stop::LeaseLost => Ok(Outcome::LeaseLost(job_id)),
            Stop::Failed(failure) => settle(self, claimed, failure).await,
            Stop::Park(step) => {
                claimed.park(&step).await?;
                Ok(Outcome::Parked(job_id))
            }
            Stop::Sleep(sleeping) => {
                let (step, wakes_at) = sleeping.first();
                let (step, set) = (step.to_owned(), sleeping.newly_set());
                claimed.sleep(&step, set, wakes_at).await?;
                Ok(Outcome::Sleeping(job_id))
            }
            Stop::Finished { steps, last } => {
                finish(self, claimed, &compiled, &input, steps, last).await
            }
        }
    }
}

/// How the steps of a segment stopped.
enum Stop {
    LeaseLost,
    /// A step failed (the first to); the others ran to their checkpoints.
    Failed(StepFailure),
    /// Nothing else could run and this external step waits for its answer.
    Park(String),
    /// Nothing else could run and these timers have not woken.
    Sleep(Sleeping),
    /// Every step ended; `last` is the checkpoint not yet written, which
    /// goes with the completion.
    Finished {
        steps: Map<String, Json>,
        last: Option<Checkpoint>,
    },
}

/// The timers of a segment that have not woken: step, instant, and
/// whether this segment set it (else it was stored already).
#[derive(Default)]
struct Sleeping(Vec<(String, DateTime<Utc>, bool)>);

impl Sleeping {
    /// The timer that wakes first.
    fn first(&self) -> (&str, DateTime<Utc>) {
        self.0
            .iter()
            .min_by_key(|(_, at, _)| *at)
            .map(|(step, at, _)| (step.as_str(), *at))
            .expect("a sleep has a timer")
    }

    /// The timers this segment set, as the row stores them.
    fn newly_set(&self) -> Json {
        Json::Object(
            self.0
                .iter()
                .filter(|(_, _, new)| *new)
                .map(|(step, at, _)| (step.clone(), Json::String(instant(*at))))
                .collect(),
        )
    }
}

/// An instant as the row and the timer's checkpoint write it.
fn instant(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// A checkpoint's fenced write.
type Write<'a> = BoxFuture<'a, Result<(), SegmentStop>>;

/// A step's call, or its `when` saying no (`None`).
type Called<'a> = BoxFuture<'a, (usize, Result<Option<Json>, Invocation>)>;

/// The steps of one segment: ready steps are called side by side (up to
/// the definition's `parallelism`), and their checkpoints are written one
/// at a time, in the order their answers came, each before any step that
/// needs it starts (`schedule.rs`).
struct Nodes<'a> {
    engine: &'a Engine,
    claimed: &'a ClaimedRun,
    compiled: &'a Arc<CompiledWorkflow>,
    input: Json,
    started: Instant,
    lease_lost: &'a CancellationToken,
}

impl<'a> Nodes<'a> {
    async fn run(
        &self,
        mut schedule: Schedule<'_>,
        mut steps: Map<String, Json>,
    ) -> Result<Stop, SegmentStop> {
        let parallelism = self.compiled.definition.parallelism();
        let deadline = Duration::from_millis(self.compiled.definition.deadline_ms);
        let mut calls: FuturesUnordered<Called<'_>> = FuturesUnordered::new();
        let mut answered: VecDeque<(usize, Checkpoint)> = VecDeque::new();
        let mut writing: Option<(usize, Checkpoint, Write<'a>)> = None;
        let mut failure: Option<StepFailure> = None;
        let mut park_on: Option<String> = None;
        let mut sleeping = Sleeping::default();
        loop {
            if self.lease_lost.is_cancelled() {
                return Ok(Stop::LeaseLost);
            }
            while failure.is_none() && calls.len() < parallelism {
                let Some(index) = schedule.start_next() else {
                    break;
                };
                let step = &self.compiled.steps[index];
                if step.definition.is_external() {
                    // Parked on once nothing else can run; another
                    // external step ready meanwhile waits for a later
                    // segment.
                    park_on.get_or_insert_with(|| step.definition.name.clone());
                    continue;
                }
                let Some(left) = deadline
                    .checked_sub(self.started.elapsed())
                    .filter(|d| !d.is_zero())
                else {
                    let error = format!(
                        "segment exceeded its deadline of {} ms before step {}",
                        deadline.as_millis(),
                        step.definition.name
                    );
                    failure = Some(StepFailure::retryable(RetryClass::Deadline, error));
                    break;
                };
                let scope = Scope::default().with("input", &self.input).with(
                    "steps",
                    &Json::Object(self.compiled.steps_in_scope(index, &steps)),
                );
                if let Some(timer) = &step.timer {
                    // A timer calls nothing: woken, it is checkpointed
                    // like an answer; not yet, the job sleeps once
                    // nothing else can run.
                    let name = step.definition.name.clone();
                    match self.wakes_at(index, timer, &scope).await {
                        Ok((at, _)) if at <= self.engine.now() => {
                            let response = serde_json::json!({ "woke_at": instant(at) });
                            let checkpoint = Checkpoint {
                                name,
                                skipped: false,
                                response,
                            };
                            answered.push_back((index, checkpoint));
                        }
                        Ok((at, new)) => sleeping.0.push((name, at, new)),
                        Err(failed) => failure = Some(failed),
                    }
                    continue;
                }
                calls.push(Box::pin(self.call(index, scope, (left, deadline))));
            }
            if calls.is_empty() && writing.is_none() {
                let unwritten = answered.len();
                if unwritten == 0 {
                    return Ok(if let Some(failure) = failure {
                        Stop::Failed(failure)
                    } else if let Some(step) = park_on {
                        Stop::Park(step)
                    } else if !sleeping.0.is_empty() {
                        Stop::Sleep(sleeping)
                    } else if schedule.all_ended() {
                        Stop::Finished { steps, last: None }
                    } else {
                        Stop::Failed(StepFailure::Defect(
                            "no step of the workflow can start (a step's needs never end)".into(),
                        ))
                    });
                }
                if unwritten == 1
                    && failure.is_none()
                    && park_on.is_none()
                    && schedule.is_last(answered[0].0)
                {
                    // The last checkpoint goes with the completion.
                    let (_, last) = answered.pop_front().expect("one answer waits");
                    if !last.skipped {
                        steps.insert(last.name.clone(), last.response.clone());
                    }
                    return Ok(Stop::Finished {
                        steps,
                        last: Some(last),
                    });
                }
            }
            if writing.is_none()
                && let Some((index, checkpoint)) = answered.pop_front()
            {
                let claimed = self.claimed;
                let write = checkpoint.clone();
                writing = Some((
                    index,
                    checkpoint,
                    Box::pin(async move { claimed.checkpoint(&write).await }),
                ));
            }
            tokio::select! {
                Some((index, called)) = calls.next(), if !calls.is_empty() => match called {
                    Ok(response) => {
                        let checkpoint = Checkpoint {
                            name: self.compiled.steps[index].definition.name.clone(),
                            skipped: response.is_none(),
                            response: response.unwrap_or(Json::Null),
                        };
                        answered.push_back((index, checkpoint));
                    }
                    Err(Invocation::LeaseLost) => return Ok(Stop::LeaseLost),
                    // The steps still running go on to their checkpoints;
                    // nothing new starts.
                    Err(Invocation::Failed(failed)) => {
                        failure.get_or_insert(failed);
                    }
                },
                written = async { (&mut writing.as_mut().expect("polled only while writing").2).await },
                    if writing.is_some() =>
                {
                    let (index, checkpoint, _) = writing.take().expect("a write was under way");
                    written?;
                    if !checkpoint.skipped {
                        steps.insert(checkpoint.name, checkpoint.response);
                    }
                    schedule.end(index);
                }
            }
        }
    }

    /// When the timer of step `index` wakes, and whether this segment set
    /// it: the instant the row stores, or (first reached) `sleep` from now
    /// or the instant `until` gives.
    async fn wakes_at(
        &self,
        index: usize,
        timer: &Timer,
        scope: &Scope,
    ) -> Result<(DateTime<Utc>, bool), StepFailure> {
        let name = &self.compiled.steps[index].definition.name;
        let stored = self
            .claimed
            .row()
            .timers
            .as_ref()
            .and_then(|timers| timers.0.get(name.as_str()).cloned());
        if let Some(stored) = stored {
            let at = stored
                .as_str()
                .and_then(|text| DateTime::parse_from_rfc3339(text).ok())
                .ok_or_else(|| {
                    StepFailure::Defect(format!(
                        "step {name}: the stored timer {stored} is no instant"
                    ))
                })?;
            return Ok((at.with_timezone(&Utc), false));
        }
        let at = match timer {
            Timer::Sleep(duration) => {
                let duration = chrono::Duration::from_std(*duration)
                    .map_err(|e| StepFailure::Defect(format!("step {name}: sleep: {e}")))?;
                self.engine.now() + duration
            }
            Timer::Until(_) => {
                let given = {
                    let (compiled, scope) = (self.compiled.clone(), scope.clone());
                    self.engine
                        .off_runtime(move || match &compiled.steps[index].timer {
                            Some(Timer::Until(until)) => until.evaluate(&scope),
                            _ => Err("not an until timer".to_owned()),
                        })
                        .await
                };
                let given = match given {
                    Ok(Ok(value)) => value,
                    Ok(Err(e)) => {
                        return Err(StepFailure::Defect(format!("step {name}: until: {e}")));
                    }
                    Err(exhausted) => {
                        return Err(super::step::over_budget(
                            name,
                            "evaluating until",
                            &exhausted,
                        ));
                    }
                };
                given
                    .as_str()
                    .and_then(|text| DateTime::parse_from_rfc3339(text).ok())
                    .map(|at| at.with_timezone(&Utc))
                    .ok_or_else(|| StepFailure::Verdict {
                        message: format!(
                            "step {name}: until gave {given}, not an RFC 3339 instant"
                        ),
                        violations: vec![format!("{name}: until gave {given}")],
                    })?
            }
        };
        Ok((at, true))
    }

    /// Step `index`: its `when`, then its target.
    async fn call(
        &self,
        index: usize,
        scope: Scope,
        (left, deadline): (Duration, Duration),
    ) -> (usize, Result<Option<Json>, Invocation>) {
        let engine = self.engine;
        let step = &self.compiled.steps[index];
        if step.when.is_some() {
            let holds = {
                let (compiled, scope) = (self.compiled.clone(), scope.clone());
                engine
                    .off_runtime(move || {
                        compiled.steps[index]
                            .when
                            .as_ref()
                            .map_or(Ok(true), |when| when.evaluate_bool(&scope))
                    })
                    .await
            };
            let name = &step.definition.name;
            match holds {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => return (index, Ok(None)),
                Ok(Err(e)) => {
                    let failure = StepFailure::Defect(format!("step {name}: when: {e}"));
                    return (index, Err(Invocation::Failed(failure)));
                }
                Err(exhausted) => {
                    let failure = super::step::over_budget(name, "evaluating when", &exhausted);
                    return (index, Err(Invocation::Failed(failure)));
                }
            }
        }
        let called = engine
            .invoke(
                self.claimed,
                (self.compiled, index),
                &scope,
                (left, deadline),
                self.lease_lost,
            )
            .await;
        (index, called.map(Some))
    }
}

impl Engine {
    /// Renews the lease, fenced, before the first step when the claim is
    /// older than a quarter of the lease (when the heartbeat would have
    /// renewed it): a claim that waited, in a busy runtime or behind a slow
    /// batch, may have lapsed and be another worker's by now, and then the
    /// segment stops before calling anything. A fresh claim is its own
    /// renewal, so the common case costs nothing.
    async fn renew_if_stale(&self, claimed: &ClaimedRun) -> Result<(), SegmentStop> {
        let since_claim = (self.now() - claimed.row().updated_at)
            .to_std()
            .unwrap_or_default();
        super::telemetry::claim_to_segment(since_claim);
        if since_claim > self.settings().lease / 4 {
            claimed.renew().await?;
        }
        Ok(())
    }
}

/// Checks the stored checkpoints strictly against the definition: each
/// names a step of it, once, after the checkpoints of every step it needs,
/// and a response fits its step's output schema. Gives the responses by
/// name (a skipped step has none) and the steps that ended.
fn replay(
    compiled: &CompiledWorkflow,
    checkpoints: &Json,
) -> Result<(Map<String, Json>, Vec<usize>), String> {
    let entries = checkpoints
        .as_array()
        .ok_or("the checkpoints are not a JSON array")?;
    if entries.len() > compiled.steps.len() {
        return Err(format!(
            "{} checkpoints stored for a workflow of {} steps",
            entries.len(),
            compiled.steps.len()
        ));
    }
    let mut steps = Map::new();
    let mut ended = vec![false; compiled.steps.len()];
    let mut order = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let checkpoint: Checkpoint = serde_json::from_value(entry.clone())
            .map_err(|e| format!("checkpoint {i} is malformed: {e}"))?;
        let name = &checkpoint.name;
        let index = compiled.step_index(name).ok_or_else(|| {
            format!("checkpoint {i} names step {name:?}, which the workflow does not have")
        })?;
        if ended[index] {
            return Err(format!("checkpoint {i} repeats step {name:?}"));
        }
        if let Some(&need) = compiled
            .graph
            .needs(index)
            .iter()
            .find(|&&need| !ended[need])
        {
            return Err(format!(
                "checkpoint {i} ({name}) comes before one of step {:?}, which it needs",
                compiled.steps[need].definition.name
            ));
        }
        let step = &compiled.steps[index];
        if let (false, Some(schema)) = (checkpoint.skipped, &step.output_schema) {
            schema_violations(schema, &checkpoint.response).map_err(|violations| {
                format!(
                    "checkpoint {i} ({name}) no longer fits the step's output schema: {}",
                    violations.join("; ")
                )
            })?;
        }
        ended[index] = true;
        order.push(index);
        if !checkpoint.skipped {
            steps.insert(checkpoint.name, checkpoint.response);
        }
    }
    Ok((steps, order))
}
