//! One segment: claim a job, replay its checkpoints, run its remaining steps
//! until it completes, parks, fails, or must be retried.

use std::time::{Duration, Instant};

use serde_json::{Map, Value as Json};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::Engine;
use super::claimed::{ClaimedRun, SegmentStop};
use crate::store::runs::{self, Checkpoint};
use crate::target::{StepFailure, TargetCall};
use crate::workflow::expr::Scope;
use crate::workflow::validate::{Assignment, schema_violations};
use crate::workflow::{CompiledStep, CompiledWorkflow};

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
    pub async fn run_once(&self) -> Result<Outcome, sqlx::Error> {
        match self.claim().await? {
            None => Ok(Outcome::Idle),
            Some(claimed) => Ok(self.run_segment(claimed).await),
        }
    }

    /// Claims the oldest eligible QUEUED job, if any.
    ///
    /// # Errors
    /// Database errors.
    pub async fn claim(&self) -> Result<Option<ClaimedRun>, sqlx::Error> {
        let now = self.now();
        let lease_until = now + self.settings().lease;
        let mut conn = self.pool().acquire().await?;
        let row = runs::claim(
            &mut conn,
            &self.settings().worker_id,
            Uuid::new_v4(),
            now,
            lease_until,
        )
        .await?;
        Ok(row.and_then(|row| ClaimedRun::new(self.clone(), row)))
    }

    /// Runs a claimed job until it settles or the segment must stop, renewing
    /// the lease every third of its term meanwhile.
    pub async fn run_segment(&self, claimed: ClaimedRun) -> Outcome {
        let job_id = claimed.job_id();
        let lease_lost = CancellationToken::new();
        // Aborted when this future ends or is dropped: a cancelled segment
        // must not keep its lease alive.
        let _heartbeat = AbortOnDrop(tokio::spawn(heartbeat(
            claimed.lease(),
            self.settings().lease / 3,
            lease_lost.clone(),
        )));
        let span = tracing::info_span!("segment", %job_id, attempt = claimed.row().attempt);
        let outcome =
            tracing::Instrument::instrument(self.segment(claimed, &lease_lost), span).await;
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(SegmentStop::LeaseLost(_)) => Outcome::LeaseLost(job_id),
            Err(SegmentStop::Store(e)) => {
                tracing::error!(%job_id, error = %e, "store failed mid-segment; the lease will lapse and the job be retried");
                Outcome::StoreFailed(job_id)
            }
        };
        if lease_lost.is_cancelled() && !matches!(outcome, Outcome::LeaseLost(_)) {
            tracing::warn!(%job_id, ?outcome, "lease was lost during the segment");
        }
        outcome
    }

    async fn segment(
        &self,
        claimed: ClaimedRun,
        lease_lost: &CancellationToken,
    ) -> Result<Outcome, SegmentStop> {
        let job_id = claimed.job_id();
        let started = Instant::now();
        let compiled = match self.compile(&claimed.row().definition.0) {
            Ok(compiled) => compiled,
            Err(invalid) => {
                let error =
                    format!("the job's definition snapshot no longer compiles here: {invalid}");
                return settle(self, claimed, StepFailure::Defect(error)).await;
            }
        };
        let mut steps = match replay(&compiled, &claimed.row().checkpoints.0) {
            Ok(steps) => steps,
            Err(error) => return settle(self, claimed, StepFailure::Defect(error)).await,
        };
        let input = claimed.row().input.0.clone();
        let deadline = Duration::from_millis(compiled.definition.deadline_ms);

        for step in &compiled.steps[steps.len()..] {
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
                return settle(self, claimed, StepFailure::Retryable(error)).await;
            };
            let scope = Scope::default()
                .with("input", &input)
                .with("steps", &Json::Object(steps.clone()));
            let response = match self
                .invoke(&claimed, step, &scope, (left, deadline), lease_lost)
                .await
            {
                Ok(response) => response,
                Err(Invocation::LeaseLost) => return Ok(Outcome::LeaseLost(job_id)),
                Err(Invocation::Failed(failure)) => return settle(self, claimed, failure).await,
            };
            claimed
                .checkpoint(&Checkpoint {
                    name: name.clone(),
                    skipped: false,
                    response: response.clone(),
                })
                .await?;
            steps.insert(name, response);
        }
        finish(self, claimed, &compiled, &input, steps).await
    }

    async fn invoke(
        &self,
        claimed: &ClaimedRun,
        step: &CompiledStep,
        scope: &Scope,
        (left, deadline): (Duration, Duration),
        lease_lost: &CancellationToken,
    ) -> Result<Json, Invocation> {
        let name = &step.definition.name;
        let request = build(&step.rules, scope).map_err(|e| {
            Invocation::Failed(StepFailure::Defect(format!(
                "step {name}: building the request: {e}"
            )))
        })?;
        // One timer bounds the call: the step's timeout or what is left of
        // the segment's deadline, whichever is shorter, reported as itself.
        let step_limit = step.definition.timeout_ms.map(Duration::from_millis);
        let limit = step_limit.map_or(left, |step_limit| step_limit.min(left));
        let call = TargetCall {
            job_id: claimed.job_id(),
            step_name: name.clone(),
            method: step.definition.method.clone(),
            request,
            timeout: limit,
            traceparent: claimed.row().traceparent.clone(),
        };
        let target = &step.definition.target;
        let response = tokio::select! {
            response = tokio::time::timeout(limit, self.targets().call(target, call)) => {
                response.unwrap_or_else(|_| Err(StepFailure::Retryable(match step_limit {
                    Some(step_limit) if step_limit < left => format!(
                        "target {target} did not answer within the step timeout of {} ms",
                        step_limit.as_millis()
                    ),
                    _ => format!(
                        "the segment deadline of {} ms passed while waiting for target {target}",
                        deadline.as_millis()
                    ),
                })))
            }
            () = lease_lost.cancelled() => return Err(Invocation::LeaseLost),
        };
        let response = response.map_err(|failure| match failure {
            StepFailure::Retryable(e) => {
                Invocation::Failed(StepFailure::Retryable(format!("step {name}: {e}")))
            }
            StepFailure::Defect(e) => {
                Invocation::Failed(StepFailure::Defect(format!("step {name}: {e}")))
            }
            verdict @ StepFailure::Verdict { .. } => Invocation::Failed(verdict),
        })?;
        check_response(step, &response, scope).map_err(Invocation::Failed)?;
        Ok(response)
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

enum Invocation {
    LeaseLost,
    Failed(StepFailure),
}

/// Renews the lease every `every` until aborted; cancels `lease_lost` when
/// the lease is gone. A failed renewal for another reason is retried at the
/// next tick: the lease term leaves room for two misses.
async fn heartbeat(lease: super::claimed::Lease, every: Duration, lease_lost: CancellationToken) {
    let mut ticks = tokio::time::interval(every.max(Duration::from_millis(10)));
    ticks.tick().await;
    loop {
        ticks.tick().await;
        match lease.renew().await {
            Ok(()) => {}
            Err(SegmentStop::LeaseLost(_)) => {
                lease_lost.cancel();
                return;
            }
            Err(SegmentStop::Store(e)) => {
                tracing::warn!(error = %e, "lease renewal failed; retrying")
            }
        }
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

/// Builds a JSON object by evaluating each assignment into its field path.
fn build(assignments: &[Assignment], scope: &Scope) -> Result<Json, String> {
    let mut document = Json::Object(Map::new());
    for assignment in assignments {
        let value = assignment.expression.evaluate(scope)?;
        let mut at = &mut document;
        let (last, parents) = assignment.path.split_last().ok_or("empty field path")?;
        for segment in parents {
            let object = at
                .as_object_mut()
                .ok_or_else(|| format!("{segment} is set to a non-object earlier"))?;
            at = object
                .entry(segment.clone())
                .or_insert_with(|| Json::Object(Map::new()));
        }
        at.as_object_mut()
            .ok_or_else(|| {
                format!(
                    "{} is set to a non-object earlier",
                    assignment.path.join(".")
                )
            })?
            .insert(last.clone(), value);
    }
    Ok(document)
}

/// A response must fit the step's output schema (else the target broke its
/// contract: a defect) and pass every `validate` rule (else a verdict).
pub(super) fn check_response(
    step: &CompiledStep,
    response: &Json,
    scope: &Scope,
) -> Result<(), StepFailure> {
    let name = &step.definition.name;
    if let Some(schema) = &step.output_schema {
        schema_violations(schema, response).map_err(|violations| {
            StepFailure::Defect(format!(
                "step {name}: the response does not fit the output schema: {}",
                violations.join("; ")
            ))
        })?;
    }
    let scope = scope.clone().with("response", response);
    let mut violations = Vec::new();
    for rule in &step.validate {
        match rule.evaluate_bool(&scope) {
            Ok(true) => {}
            Ok(false) => violations.push(format!("{name}: {}", rule.source())),
            Err(e) => {
                return Err(StepFailure::Defect(format!(
                    "step {name}: validate rule {e}"
                )));
            }
        }
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(StepFailure::Verdict {
            message: format!("step {name} failed validation: {}", violations.join("; ")),
            violations,
        })
    }
}

/// After the last step: the output mapping gives the result, the verdict
/// expression (or `completed N steps`) the verdict.
async fn finish(
    engine: &Engine,
    claimed: ClaimedRun,
    compiled: &CompiledWorkflow,
    input: &Json,
    steps: Map<String, Json>,
) -> Result<Outcome, SegmentStop> {
    let job_id = claimed.job_id();
    let count = steps.len();
    let last = compiled
        .steps
        .last()
        .and_then(|s| steps.get(&s.definition.name))
        .cloned();
    let scope = Scope::default()
        .with("input", input)
        .with("steps", &Json::Object(steps));
    let result = if compiled.output.is_empty() {
        Ok(last.unwrap_or(Json::Null))
    } else {
        build(&compiled.output, &scope).map_err(|e| format!("output mapping: {e}"))
    };
    let result = match result {
        Ok(result) => result,
        Err(e) => return settle(engine, claimed, StepFailure::Defect(e)).await,
    };
    let verdict = match &compiled.verdict {
        None => Ok(format!("completed {count} steps")),
        Some(expression) => match expression.evaluate(&scope.with("result", &result)) {
            Ok(Json::String(text)) if !text.trim().is_empty() => Ok(text),
            Ok(other) => Err(format!(
                "verdict expression gave {other}, not a non-empty string"
            )),
            Err(e) => Err(format!("verdict expression {e}")),
        },
    };
    match verdict {
        Ok(verdict) => {
            claimed.complete(&result, &verdict).await?;
            Ok(Outcome::Completed(job_id))
        }
        Err(e) => settle(engine, claimed, StepFailure::Defect(e)).await,
    }
}

/// Settles a failed segment by class: retryable → QUEUED with backoff, or
/// DEAD on the last attempt; verdict and defect → FAILED.
async fn settle(
    engine: &Engine,
    claimed: ClaimedRun,
    failure: StepFailure,
) -> Result<Outcome, SegmentStop> {
    let job_id = claimed.job_id();
    let (attempt, max_attempts) = (claimed.row().attempt, claimed.row().max_attempts);
    match failure {
        StepFailure::Retryable(error) if attempt >= max_attempts => {
            tracing::warn!(%job_id, attempt, %error, "attempts exhausted; job is DEAD");
            claimed.dead(&error).await?;
            Ok(Outcome::Dead(job_id))
        }
        StepFailure::Retryable(error) => {
            let delay = backoff(engine.settings().backoff_base, attempt);
            tracing::info!(%job_id, attempt, %error, ?delay, "retryable failure; requeued");
            claimed.requeue(&error, engine.now() + delay).await?;
            Ok(Outcome::Requeued(job_id))
        }
        StepFailure::Verdict {
            message,
            violations,
        } => {
            tracing::info!(%job_id, %message, "job failed on a verdict");
            claimed.fail(&message, Some(&violations.join("; "))).await?;
            Ok(Outcome::Failed(job_id))
        }
        StepFailure::Defect(error) => {
            tracing::error!(%job_id, %error, "job failed on a defect");
            claimed.fail(&error, None).await?;
            Ok(Outcome::Failed(job_id))
        }
    }
}

/// `base × 2^(attempt−1)`, saturating.
#[must_use]
pub fn backoff(base: Duration, attempt: i32) -> Duration {
    let exponent = u32::try_from(attempt.saturating_sub(1).clamp(0, 30)).unwrap_or(0);
    base.saturating_mul(1u32 << exponent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_base() {
        let base = Duration::from_secs(5);
        assert_eq!(backoff(base, 1), Duration::from_secs(5));
        assert_eq!(backoff(base, 2), Duration::from_secs(10));
        assert_eq!(backoff(base, 3), Duration::from_secs(20));
        assert_eq!(backoff(base, 0), Duration::from_secs(5));
    }
}
