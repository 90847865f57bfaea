//! Child workflows, the engine's side (docs/architecture.md, "Child
//! workflows"): a `start` step submits a child whose id is derived from
//! the parent's id and the step, in the same transaction as the parent's
//! fenced "child started" checkpoint; the child's outcome reaches the
//! parent's row in the child's own terminal transaction (the trigger
//! `flotilla_child_finished`); cancelling a parent cancels its children.

use flotilla_store::RunStatus;
use flotilla_store::runs::children::{self, ChildOutcome, MAX_DEPTH};
use flotilla_store::runs::{Checkpoint, RunRow};

use crate::{ClaimedRun, LeaseLost, SegmentStop};
use crate::{Engine, Submission, SubmitError, Submitted, WorkflowRef, child_id};
use flotilla_targets::{RetryClass, StepFailure};
use flotilla_workflow::expr::Scope;
use flotilla_workflow::{StartChild, assemble};
use serde_json::Value as Json;

use super::call::over_budget;
use super::{Began, Nodes, Wait, checkpoint};

/// What a `start` step found of its child.
pub(crate) enum ChildState {
    /// None started yet (or the last one failed and the step runs again).
    NotStarted,
    /// Started, not finished: the parent waits for it.
    Running,
    /// Completed with this result.
    Completed(serde_json::Value),
    /// Did not complete: the step fails with this.
    Failed(StepFailure),
}

/// The state of `step`'s child in the claim's snapshot: its outcome in
/// the parent's row, or whether this run of the parent started it already
/// (`started`).
fn child_state(row: &RunRow, step: &str, started: bool) -> Result<ChildState, String> {
    match children::outcome_of(row, step)? {
        Some(outcome) => outcome_state(step, outcome).map_err(|e| e.to_string()),
        None if started => Ok(ChildState::Running),
        None => Ok(ChildState::NotStarted),
    }
}

/// What a finished child's outcome makes of its step.
fn outcome_state(step: &str, outcome: ChildOutcome) -> Result<ChildState, StepFailure> {
    let ChildOutcome {
        job_id,
        status,
        result,
        error,
        verdict,
    } = outcome;
    let why = error
        .or(verdict)
        .unwrap_or_else(|| "no reason given".to_owned());
    let message = format!("step {step}: child job {job_id} ended {status}: {why}");
    Ok(match status {
        RunStatus::Completed => ChildState::Completed(result.unwrap_or(serde_json::Value::Null)),
        // A child that ran out of attempts spent its own retry budget on
        // the world already: retrying it from the parent would multiply
        // the budgets down the family (3 attempts at each of 8 levels is
        // 6,561 runs of the leaf). It fails the step as a verdict, like a
        // FAILED child; an operator's retry of the parent retries it.
        _ => ChildState::Failed(StepFailure::Verdict {
            violations: vec![message.clone()],
            message,
        }),
    })
}

impl Engine {
    /// What `step`'s child is now. The claim's snapshot of the parent says
    /// when it finished before the claim; a child started but not finished
    /// then is looked up again (its outcome may have reached the parent's
    /// row since): finished with an outcome there, the outcome; finished
    /// without one (a retry of the parent forgot it), started again.
    ///
    /// # Errors
    /// The snapshot does not read (a defect), or the store failed (the
    /// step is retried rather than parked on a child that may be done).
    pub(crate) async fn child_state_now(
        &self,
        parent: &RunRow,
        step: &str,
        started: bool,
    ) -> Result<ChildState, StepFailure> {
        let state = child_state(parent, step, started).map_err(StepFailure::Defect)?;
        if !matches!(state, ChildState::Running) {
            return Ok(state);
        }
        let child = child_id(parent.job_id, step);
        let now = flotilla_store::sql::session(self.pool(), async |conn| {
            children::now_of(conn, (parent.job_id, step), child).await
        })
        .await
        .map_err(|e| {
            StepFailure::retryable(
                RetryClass::Other,
                format!("step {step}: reading child {child}: {e}"),
            )
        })?;
        match now {
            (Some(status), _) if !status.is_finished() => Ok(ChildState::Running),
            (Some(_), Some(outcome)) => outcome_state(step, outcome),
            _ => Ok(ChildState::NotStarted),
        }
    }
}

/// The default bound on the jobs of one family, the root included.
pub const DEFAULT_MAX_FAMILY_JOBS: i32 = 1_000;

/// Whether a job of `depth` may start a child.
pub(crate) fn may_start_at(depth: i16) -> Result<(), StepFailure> {
    if depth + 1 > MAX_DEPTH {
        let message = format!("children nest at most {MAX_DEPTH} deep; this job is at {depth}");
        return Err(StepFailure::Verdict {
            violations: vec![message.clone()],
            message,
        });
    }
    Ok(())
}

/// The key the child of item `item` of `start` step `step` is known by
/// (`ship[3]`): its id (`child_id(parent, key)`), its link and its
/// outcome in the parent's row. The compiler refuses a step named so
/// beside such a step.
pub fn item_key(step: &str, item: usize) -> String {
    format!("{step}[{item}]")
}

/// A child to start: its submission and how it hangs off its parent.
#[derive(Debug, Clone)]
pub(crate) struct NewChild {
    pub(crate) workflow: String,
    pub(crate) input: serde_json::Value,
    pub(crate) cancel_with_parent: bool,
}

impl ClaimedRun {
    /// Starts `step`'s child in one transaction with the parent's fenced
    /// "child started" checkpoint: submitted (idempotent on its derived
    /// id; a refused one is recorded FAILED, and its outcome reaches the
    /// parent at once), retried if it is there from an earlier try that did
    /// not complete, and linked to its parent.
    ///
    /// # Errors
    /// Lease lost, or the store failed (nothing was written, or, when the
    /// commit's outcome is unknown, the next claim sees what was).
    ///
    /// A new child past the family's bound (`max_family_jobs`) is not
    /// started: nothing is written, and the step's verdict is returned.
    pub(crate) async fn start_child(
        &self,
        name: &str,
        item: Option<u32>,
        child: NewChild,
    ) -> Result<Option<StepFailure>, SegmentStop> {
        let parent = self.row();
        // The child is known by its step, or its step and item: its id,
        // its link and its outcome in the parent's row.
        let key = item.map_or_else(|| name.to_owned(), |item| item_key(name, item as usize));
        let step = key.as_str();
        let id = child_id(parent.job_id, step);
        let checkpoint = Checkpoint {
            name: name.to_owned(),
            skipped: false,
            response: serde_json::json!({ "child_job_id": id }),
            item,
            page: None,
            signal: None,
            child: Some(id),
            list: None,
            timed_out: false,
            call: None,
            poll: None,
        };
        let submission = Submission {
            metadata: None,
            job_id: id,
            workflow: WorkflowRef::Stored(child.workflow),
            input: child.input,
            traceparent: parent.traceparent.clone(),
            tracestate: parent.tracestate.clone(),
            // A child is as urgent as the job that started it.
            priority: parent.priority,
        };
        let engine = self.engine();
        let now = engine.now();
        let mut tx = engine.begin_reserved().await?;
        // The child's row first, then the parent's (by its checkpoint): the
        // order a child's own terminal write takes them in.
        children::lock_child(&mut tx, id).await?;
        // Each refusal below ends the transaction before returning: a
        // dropped one keeps the parent's row locked (its checkpoint
        // written) until its connection is next used, and the FAILED write
        // that follows a refusal would wait for it.
        if !self.fenced_checkpoint(&mut tx, &checkpoint, now).await? {
            tx.rollback().await?;
            return Err(LeaseLost.into());
        }
        let submitted = engine.submit_recorded(&mut tx, &submission, now).await;
        // A child already there (from an earlier try of the step): retried
        // when it ended without completing, its result recorded when it
        // completed and its parent's row lost the outcome.
        let existing = match submitted {
            Ok(Submitted::Created(_)) => {
                let most = engine.settings().max_family_jobs;
                if let (root, None) = children::join_family(&mut tx, parent.job_id, most).await? {
                    tx.rollback().await?;
                    let message = format!(
                        "step {step}: the family of job {root} has {most} jobs, its bound (FLOTILLA_MAX_FAMILY_JOBS): no child is started"
                    );
                    return Ok(Some(StepFailure::Verdict {
                        message,
                        violations: vec![format!("max_family_jobs: {most}")],
                    }));
                }
                None
            }
            Ok(Submitted::Existing(row)) => Some(row.status),
            // Gone with its outcome: nothing to retry, record or wait for.
            Ok(Submitted::Removed(removed)) => {
                tx.rollback().await?;
                let message = format!(
                    "step {step}: its child {id} ended {} and was removed by retention: its outcome is gone, so the step cannot be retried",
                    removed.status
                );
                return Ok(Some(StepFailure::Verdict {
                    violations: vec![message.clone()],
                    message,
                }));
            }
            // The child exists with other input (the parent's rules read
            // something that changed): that child is the step's.
            Err(SubmitError::Conflict(_)) => children::status_of(&mut tx, id).await?,
            Err(SubmitError::Store(e)) => {
                tx.rollback().await?;
                return Err(e.into());
            }
            Err(refused) => {
                tx.rollback().await?;
                return Err(SegmentStop::Refused(format!(
                    "step {step}: its child cannot be submitted: {refused}"
                )));
            }
        };
        match existing {
            Some(RunStatus::Failed | RunStatus::Dead | RunStatus::Cancelled) => {
                children::retry_child(&mut tx, id, now).await?;
            }
            Some(RunStatus::Completed) => {
                children::record_outcome(&mut tx, (parent.job_id, step), id).await?;
            }
            _ => {}
        }
        children::link(
            &mut tx,
            id,
            (parent.job_id, step),
            parent.depth + 1,
            child.cancel_with_parent,
        )
        .await?;
        tx.commit().await?;
        self.advance_fence(1);
        engine.wake();
        Ok(None)
    }
}

impl Nodes<'_> {
    /// Starts `start` step `index`: its child's answer when the child
    /// ended, a wait while it runs, or the child to start.
    pub(super) async fn begin_start(
        &self,
        index: usize,
        start: &StartChild,
        scope: &Scope,
        started: bool,
    ) -> Began {
        let step = &self.compiled.steps[index];
        let name = step.definition.name.clone();
        match self.holds(index, scope).await {
            Ok(false) => return Began::Answer(checkpoint(name, None, None)),
            Ok(true) => {}
            Err(failed) => return Began::Failed(failed),
        }
        let state = self
            .engine
            .child_state_now(self.claimed.row(), &name, started)
            .await;
        match state {
            Ok(ChildState::Completed(result)) => match self.judge(index, &result, scope).await {
                Ok(()) => Began::Answer(checkpoint(name, None, Some(result))),
                Err(failed) => Began::Failed(failed),
            },
            Ok(ChildState::Failed(failed)) | Err(failed) => Began::Failed(failed),
            Ok(ChildState::Running) => Began::Waits(Wait::Child(vec![name])),
            Ok(ChildState::NotStarted) => match self.new_child(index, start, scope, None).await {
                Ok((child, begun)) => Began::StartChild(child, begun),
                Err(failed) => Began::Failed(failed),
            },
        }
    }

    /// The child `start` step `index` starts (for `item`, when it starts
    /// one per item), with its "child started" checkpoint.
    ///
    /// # Errors
    /// Its input does not build, or the job is nested too deep.
    pub(super) async fn new_child(
        &self,
        index: usize,
        start: &StartChild,
        scope: &Scope,
        item: Option<usize>,
    ) -> Result<(NewChild, Checkpoint), StepFailure> {
        let step = &self.compiled.steps[index];
        let name = step.definition.name.clone();
        let input = self.child_input(index, scope).await?;
        may_start_at(self.claimed.row().depth)?;
        let child = NewChild {
            workflow: start.workflow.clone(),
            input,
            cancel_with_parent: step.definition.cancel_children != Some(false),
        };
        let key = item.map_or_else(|| name.clone(), |item| item_key(&name, item));
        let id = child_id(self.claimed.job_id(), &key);
        let mut begun = checkpoint(name, item, Some(serde_json::json!({ "child_job_id": id })));
        begun.child = Some(id);
        Ok((child, begun))
    }

    /// The input of step `index`'s child, built by its `start.input`.
    pub(super) async fn child_input(
        &self,
        index: usize,
        scope: &Scope,
    ) -> Result<Json, StepFailure> {
        let built = {
            let (compiled, scope) = (self.compiled.clone(), scope.clone());
            self.engine
                .off_runtime(move || assemble(&compiled.steps[index].rules, &scope))
                .await
        };
        let name = &self.compiled.steps[index].definition.name;
        match built {
            Ok(Ok(input)) => Ok(input),
            Ok(Err(e)) => Err(StepFailure::Defect(format!(
                "step {name}: building the child's input: {e}"
            ))),
            Err(exhausted) => Err(over_budget(name, "building the child's input", &exhausted)),
        }
    }
}
