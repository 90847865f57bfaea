//! complete-step: the answer to a job parked on an external step.
//!
//! Gated twice: once on a plain read (cheap refusals without a lock), then
//! again under the row lock, where the decision is final. Two concurrent
//! calls for one step therefore give one `Completed` and one `AlreadyDone`.

use std::sync::Arc;

use serde::Serialize;
use uuid::Uuid;

use flotilla_store::runs::idle::{self, IdleSettle};
use flotilla_store::runs::{self, Checkpoint, READER_LEVEL, RunRow};
use flotilla_store::{RunStatus, StoreError};

use crate::Engine;
use crate::support::judge::check_response;
use crate::support::storable::{self, Unstorable};
use flotilla_targets::StepFailure;
use flotilla_workflow::CompiledWorkflow;
use flotilla_workflow::expr::Scope;

/// What complete-step did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CompleteOutcome {
    /// Accepted: the checkpoint is written and the job requeued.
    Completed,
    /// This external step was completed before; nothing changed.
    AlreadyDone,
    /// The job is not parked on this step.
    WrongState {
        status: RunStatus,
        outstanding_step: Option<String>,
    },
    /// The step stopped waiting: its `timeout_ms` passed.
    TimedOut,
    /// The response was refused; the job FAILED with these violations.
    Rejected { violations: Vec<String> },
}

#[derive(Debug, thiserror::Error)]
pub enum CompleteError {
    #[error("job {0} not found")]
    NotFound(Uuid),
    /// The response holds a value the store cannot keep; nothing changed.
    #[error("the response cannot be stored: {0}")]
    Unstorable(#[from] Unstorable),
    /// The job was written by a later release in a layout this worker
    /// cannot read; a worker of that release must answer it.
    #[error(
        "job {job_id} needs a worker that reads run layout {needs} (this one reads up to {reads}); answer it through a worker of the newer release"
    )]
    TooNew {
        job_id: Uuid,
        needs: i16,
        reads: i16,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for CompleteError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

enum Gate {
    Proceed,
    Stop(CompleteOutcome),
}

fn gate(row: &RunRow, step: &str, now: chrono::DateTime<chrono::Utc>) -> Gate {
    // Too late, whether or not the job has woken to end the wait.
    if is_external_step(row, step) && row.wait_timed_out(step, now) {
        return Gate::Stop(CompleteOutcome::TimedOut);
    }
    // Only an external step is answered here: a job parked on a `wait_for`
    // step takes a signal, one parked on a `start` step its child's end.
    // A waiting job takes the answer of any of its external steps that is
    // ready and unanswered, not only the one it is parked on: two people
    // asked at once may answer in either order.
    if row.status == RunStatus::Waiting
        && is_external_step(row, step)
        && (row.outstanding_step.as_deref() == Some(step)
            || crate::ops::graph_view::is_ready_now(row, step))
    {
        Gate::Proceed
    } else if row.has_checkpoint(step) && is_external_step(row, step) {
        Gate::Stop(CompleteOutcome::AlreadyDone)
    } else {
        Gate::Stop(CompleteOutcome::WrongState {
            status: row.status,
            outstanding_step: row.outstanding_step.clone(),
        })
    }
}

/// The row was gated WAITING under its lock, yet did not update.
fn corrupt_lock(job_id: Uuid) -> CompleteError {
    CompleteError::Store(StoreError::Corrupt {
        job_id,
        reason: "the locked WAITING row did not update".into(),
    })
}

fn is_external_step(row: &RunRow, step: &str) -> bool {
    row.definition.0["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| s["name"] == step && s["completion"] == "external")
}

impl Engine {
    /// Completes the external step `step` of `job_id` with `response`.
    ///
    /// # Errors
    /// Unknown job; store errors.
    pub async fn complete_step(
        &self,
        job_id: Uuid,
        step: &str,
        response: serde_json::Value,
    ) -> Result<CompleteOutcome, CompleteError> {
        storable::check_json("response", &response)?;
        let row = {
            flotilla_store::sql::session(self.pool(), async |conn| runs::get(conn, job_id).await)
                .await?
                .ok_or(CompleteError::NotFound(job_id))?
        };
        if row.reader_level > READER_LEVEL {
            return Err(CompleteError::TooNew {
                job_id,
                needs: row.reader_level,
                reads: READER_LEVEL,
            });
        }
        if let Gate::Stop(outcome) = gate(&row, step, self.now()) {
            return Ok(outcome);
        }
        // The answer joins the job's trace, whoever gives it.
        let span = tracing::info_span!(
            "complete-step",
            otel.name = format!("complete {step}"),
            %job_id,
            workflow_name = %row.workflow_name,
            flotilla.step = %step,
        );
        flotilla_runtime::trace::continue_trace(
            &span,
            row.traceparent.as_deref(),
            row.tracestate.as_deref(),
        );
        let judging =
            tracing::Instrument::instrument(self.judging(&row, step), span.clone()).await?;
        let violations = {
            let response = response.clone();
            self.off_runtime(move || judging.judge(&response)).await
        };
        let violations = match violations {
            Ok(violations) => violations,
            Err(exhausted) => Some(vec![format!("{step}: {exhausted}")]),
        };
        tracing::Instrument::instrument(self.answer(job_id, step, response, violations), span).await
    }

    /// Writes the answer of a waiting step: resumes the job, or fails it
    /// when `violations` refused the answer.
    async fn answer(
        &self,
        job_id: Uuid,
        step: &str,
        response: serde_json::Value,
        violations: Option<Vec<String>>,
    ) -> Result<CompleteOutcome, CompleteError> {
        let now = self.now();
        let mut tx = self.pool().begin().await?;
        let row = runs::get_for_update(&mut tx, job_id)
            .await?
            .ok_or(CompleteError::NotFound(job_id))?;
        if let Gate::Stop(outcome) = gate(&row, step, now) {
            // Release the row lock now: a dropped transaction rolls back only
            // when its connection is next used, and claims skip locked rows.
            tx.rollback().await?;
            return Ok(outcome);
        }
        let outcome = match violations {
            None => {
                let checkpoint = Checkpoint {
                    name: step.to_owned(),
                    skipped: false,
                    item: None,
                    page: None,
                    signal: None,
                    child: None,
                    list: None,
                    timed_out: false,
                    call: None,
                    poll: None,
                    response,
                };
                if !idle::resume_waiting(
                    &mut tx,
                    job_id,
                    &checkpoint,
                    self.checkpoint_layout(),
                    now,
                )
                .await?
                {
                    return Err(corrupt_lock(job_id));
                }
                CompleteOutcome::Completed
            }
            Some(violations) => {
                let error = format!(
                    "step {step}: the external response was rejected: {}",
                    violations.join("; ")
                );
                let verdict = violations.join("; ");
                let settle = IdleSettle::Fail {
                    error: &error,
                    verdict: &verdict,
                };
                if !idle::settle_idle(&mut tx, job_id, settle, now).await? {
                    return Err(corrupt_lock(job_id));
                }
                CompleteOutcome::Rejected { violations }
            }
        };
        tx.commit().await?;
        match &outcome {
            CompleteOutcome::Completed => self.wake(),
            CompleteOutcome::Rejected { .. } => {
                self.job_finished(
                    (&row.workflow_name, row.workflow_version),
                    "FAILED",
                    row.created_at,
                );
            }
            _ => {}
        }
        Ok(outcome)
    }

    /// What judging an answer to `step` needs: the compiled workflow and the
    /// scope its rules see.
    async fn judging(&self, row: &RunRow, step: &str) -> Result<Judging, CompleteError> {
        let corrupt = |reason: String| {
            CompleteError::Store(StoreError::Corrupt {
                job_id: row.job_id,
                reason,
            })
        };
        let compiled = self
            .compile_to_run(&row.definition.0)
            .await
            .map_err(|e| corrupt(e.to_string()))?;
        let index = compiled
            .step_index(step)
            .ok_or_else(|| corrupt(format!("parked on unknown step {step}")))?;
        let steps: serde_json::Map<String, serde_json::Value> = row
            .checkpoints
            .0
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c.get("skipped") != Some(&serde_json::Value::Bool(true)))
            .filter_map(|c| {
                Some((
                    c.get("name")?.as_str()?.to_owned(),
                    c.get("response")?.clone(),
                ))
            })
            .collect();
        // The answer is judged on what the step reads: the steps it needs.
        let steps = compiled.steps_in_scope(index, &steps);
        let scope = Scope::default()
            .with("input", &row.input.0)
            .with("steps", &serde_json::Value::Object(steps));
        Ok(Judging {
            compiled,
            index,
            scope,
        })
    }
}

/// An answer's judge: the step's schema and rules, with their scope.
struct Judging {
    compiled: Arc<CompiledWorkflow>,
    index: usize,
    scope: Scope,
}

impl Judging {
    /// `Some(violations)` when the answer is refused.
    fn judge(&self, response: &serde_json::Value) -> Option<Vec<String>> {
        match check_response(&self.compiled.steps[self.index], response, &self.scope) {
            Ok(()) => None,
            Err(StepFailure::Verdict { violations, .. }) => Some(violations),
            Err(StepFailure::Defect(e) | StepFailure::Retryable { error: e, .. }) => Some(vec![e]),
        }
    }
}
