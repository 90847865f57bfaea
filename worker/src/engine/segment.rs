//! One segment: claim a job, replay its checkpoints, run its remaining steps
//! until it completes, parks, fails, or must be retried. How a step is
//! called is [`super::step`]; how a segment ends is [`super::settle`].

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use flotilla_runtime::supervise::panic_message;
use futures_util::FutureExt as _;

use flotilla_store::runs::Checkpoint;
use serde_json::{Map, Value as Json};
use uuid::Uuid;

use super::Engine;
use super::claimed::{ClaimedRun, SegmentStop};
use super::claims::ClaimError;
use super::settle::{finish, settle};
use super::step::Invocation;
use crate::target::{RetryClass, StepFailure};
use crate::workflow::CompiledWorkflow;
use crate::workflow::compile::schema_violations;
use crate::workflow::expr::Scope;

/// What one call of [`Engine::run_once`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing was claimable.
    Idle,
    Completed(Uuid),
    Parked(Uuid),
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
        let mut steps = match replayed {
            Ok(Ok(steps)) => steps,
            Ok(Err(error)) => return settle(self, claimed, StepFailure::Defect(error)).await,
            Err(exhausted) => {
                return settle(self, claimed, StepFailure::Defect(exhausted.to_string())).await;
            }
        };
        let input = claimed.row().input.0.clone();
        let deadline = Duration::from_millis(compiled.definition.deadline_ms);

        for index in steps.len()..compiled.steps.len() {
            let step = &compiled.steps[index];
            let name = step.definition.name.clone();
            if lease_lost.is_cancelled() {
                return Ok(Outcome::LeaseLost(job_id));
            }
            if step.definition.is_external() {
                claimed.park(&name).await?;
                return Ok(Outcome::Parked(job_id));
            }
            let Some(left) = deadline
                .checked_sub(started.elapsed())
                .filter(|d| !d.is_zero())
            else {
                let error = format!(
                    "segment exceeded its deadline of {} ms before step {name}",
                    deadline.as_millis()
                );
                let failure = StepFailure::retryable(RetryClass::Deadline, error);
                return settle(self, claimed, failure).await;
            };
            let scope = Scope::default()
                .with("input", &input)
                .with("steps", &Json::Object(steps.clone()));
            let response = match self
                .invoke(
                    &claimed,
                    (&compiled, index),
                    &scope,
                    (left, deadline),
                    lease_lost,
                )
                .await
            {
                Ok(response) => response,
                Err(Invocation::LeaseLost) => return Ok(Outcome::LeaseLost(job_id)),
                Err(Invocation::Failed(failure)) => return settle(self, claimed, failure).await,
            };
            let checkpoint = Checkpoint {
                name: name.clone(),
                skipped: false,
                response: response.clone(),
            };
            steps.insert(name, response);
            if index + 1 == compiled.steps.len() {
                // The last step's checkpoint goes with the completion.
                return finish(self, claimed, &compiled, &input, steps, Some(checkpoint)).await;
            }
            claimed.checkpoint(&checkpoint).await?;
        }
        finish(self, claimed, &compiled, &input, steps, None).await
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

/// Checks the stored checkpoints strictly against the definition: entry i
/// names step i and its response fits that step's output schema.
fn replay(compiled: &CompiledWorkflow, checkpoints: &Json) -> Result<Map<String, Json>, String> {
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
    for (i, (entry, step)) in entries.iter().zip(&compiled.steps).enumerate() {
        let checkpoint: Checkpoint = serde_json::from_value(entry.clone())
            .map_err(|e| format!("checkpoint {i} is malformed: {e}"))?;
        let expected = &step.definition.name;
        if checkpoint.name != *expected {
            return Err(format!(
                "checkpoint {i} names step {:?}, but step {i} is {expected:?}",
                checkpoint.name
            ));
        }
        if let (false, Some(schema)) = (checkpoint.skipped, &step.output_schema) {
            schema_violations(schema, &checkpoint.response).map_err(|violations| {
                format!(
                    "checkpoint {i} ({expected}) no longer fits the step's output schema: {}",
                    violations.join("; ")
                )
            })?;
        }
        steps.insert(checkpoint.name, checkpoint.response);
    }
    Ok(steps)
}
