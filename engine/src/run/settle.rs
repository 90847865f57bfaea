//! How a segment ends: the result and verdict after the last step, or a
//! failure settled by its class.

use std::sync::Arc;

use flotilla_store::runs::Checkpoint;
use serde_json::{Map, Value as Json};
use tokio_util::sync::CancellationToken;

use crate::Engine;
use crate::Outcome;
use crate::run::Headed;
use crate::run::compensate::compensate;
use crate::run::retrying::{Retrying, retrying};
use crate::{ClaimedRun, SegmentStop};
use flotilla_targets::StepFailure;
use flotilla_workflow::CompiledWorkflow;
use flotilla_workflow::assemble;
use flotilla_workflow::expr::Scope;

/// After the last step: the output mapping gives the result, the verdict
/// expression (or `completed N steps`) the verdict; both are evaluated off
/// the runtime, within the expression budget (an exhausted one is the
/// job's verdict). `last`, the last step's checkpoint when this segment ran
/// that step, is written with the completion in one write; when the job
/// fails here instead, it is written first, on its own, as any other
/// step's checkpoint.
pub(crate) async fn finish(
    engine: &Engine,
    claimed: ClaimedRun,
    (compiled, input): (&Arc<CompiledWorkflow>, &Json),
    steps: Map<String, Json>,
    last: Option<Checkpoint>,
    lease_lost: &CancellationToken,
) -> Result<Outcome, SegmentStop> {
    let job_id = claimed.job_id();
    // Kept for a compensation, should the result not be made.
    let answered = (!compiled.on_failure.is_empty()).then(|| steps.clone());
    let evaluated = {
        let (compiled, input) = (compiled.clone(), input.clone());
        engine
            .off_runtime(move || result_and_verdict(&compiled, &input, steps))
            .await
    };
    let done = match evaluated {
        Ok(Ok((result, verdict))) => fits_an_event(engine, &result, verdict)
            .map(|verdict| (result, verdict))
            .map_err(StepFailure::Defect),
        Ok(Err(e)) => Err(StepFailure::Defect(e)),
        Err(exhausted) => Err(StepFailure::Verdict {
            message: format!("the output mapping or verdict: {exhausted}"),
            violations: vec![exhausted.to_string()],
        }),
    };
    match (done, last) {
        (Ok((result, verdict)), Some(last)) => {
            claimed
                .checkpoint_and_complete(&last, &result, &verdict)
                .await?;
            Ok(Outcome::Completed(job_id))
        }
        (Ok((result, verdict)), None) => {
            claimed.complete(&result, &verdict).await?;
            Ok(Outcome::Completed(job_id))
        }
        (Err(failure), last) => {
            if let Some(last) = last {
                claimed.checkpoint(&last).await?;
            }
            // The output mapping's failures are never retryable.
            match (Headed::of(&failure, None, None), answered) {
                (Some(headed), Some(steps)) => {
                    let started = (headed, Map::new(), false);
                    compensate(
                        engine,
                        claimed,
                        compiled,
                        (input, &steps),
                        started,
                        lease_lost,
                    )
                    .await
                }
                _ => settle(engine, claimed, failure).await,
            }
        }
    }
}

/// The result (the output mapping, or the last step's response) and the
/// verdict (the verdict expression, or `completed N steps`).
fn result_and_verdict(
    compiled: &CompiledWorkflow,
    input: &Json,
    steps: Map<String, Json>,
) -> Result<(Json, String), String> {
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
        last.unwrap_or(Json::Null)
    } else {
        assemble(&compiled.output, &scope).map_err(|e| format!("output mapping: {e}"))?
    };
    let verdict = match &compiled.verdict {
        None => format!("completed {count} steps"),
        Some(expression) => match expression.evaluate(&scope.with("result", &result)) {
            Ok(Json::String(text)) if !text.trim().is_empty() => text,
            Ok(other) => {
                return Err(format!(
                    "verdict expression gave {other}, not a non-empty string"
                ));
            }
            Err(e) => return Err(format!("verdict expression {e}")),
        },
    };
    Ok((result, verdict))
}

/// Room an event needs besides its result and verdict: ids, names, type,
/// times, and the record's key and headers.
const EVENT_OVERHEAD_BYTES: usize = 2048;

/// The verdict back when the COMPLETED event carrying `result` fits the
/// relay's record limit; otherwise why not (the job fails instead of
/// leaving an event that could never be published).
fn fits_an_event(engine: &Engine, result: &Json, verdict: String) -> Result<String, String> {
    let limit = engine.settings().max_event_bytes;
    let size = serde_json::to_vec(result).map_or(usize::MAX, |text| text.len()) + verdict.len();
    if size.saturating_add(EVENT_OVERHEAD_BYTES) > limit {
        return Err(format!(
            "the result and verdict are {size} bytes: the COMPLETED event would exceed the event limit of {limit} bytes"
        ));
    }
    Ok(verdict)
}

/// Settles a failed segment by class: retryable → QUEUED with backoff, or
/// DEAD on the last attempt; verdict and defect → FAILED. A failure no
/// step owns.
pub(crate) async fn settle(
    engine: &Engine,
    claimed: ClaimedRun,
    failure: StepFailure,
) -> Result<Outcome, SegmentStop> {
    let retrying = retrying(engine, claimed.row(), None, None, &failure);
    settle_as(engine, claimed, failure, (None, retrying)).await
}

/// Settles `failure` of `step`, `retrying` deciding a retryable one.
pub(crate) async fn settle_as(
    engine: &Engine,
    claimed: ClaimedRun,
    failure: StepFailure,
    (step, retrying): (Option<String>, Option<Retrying>),
) -> Result<Outcome, SegmentStop> {
    let job_id = claimed.job_id();
    let attempt = claimed.row().attempt;
    match (failure, retrying) {
        (
            StepFailure::Retryable { error, class, .. },
            Some(Retrying::Again { delay, failed, of }),
        ) => {
            let step_label = step.as_deref().unwrap_or("-");
            tracing::info!(%job_id, attempt, step = step_label, failed, of, class = class.label(), %error, ?delay, "retryable failure; requeued");
            let error = format!("{error} (attempt {failed} of {of} failed)");
            // A failure no step owns is counted under the job's own key.
            let counted = step.as_deref().unwrap_or(crate::run::retrying::JOB_KEY);
            claimed
                .requeue(&error, engine.now() + delay, class, Some(counted))
                .await?;
            Ok(Outcome::Requeued(job_id))
        }
        (StepFailure::Retryable { error, class, .. }, exhausted) => {
            let error = match exhausted {
                Some(Retrying::Exhausted(why)) => format!("{error} ({why})"),
                _ => error,
            };
            let class = class.label();
            tracing::warn!(%job_id, attempt, class, %error, "attempts exhausted; job is DEAD");
            claimed.dead(&error).await?;
            Ok(Outcome::Dead(job_id))
        }
        (
            StepFailure::Verdict {
                message,
                violations,
            },
            _,
        ) => {
            tracing::info!(%job_id, %message, "job failed on a verdict");
            claimed.fail(&message, Some(&violations.join("; "))).await?;
            Ok(Outcome::Failed(job_id))
        }
        (StepFailure::Defect(error), _) => {
            tracing::error!(%job_id, %error, "job failed on a defect");
            claimed.fail(&error, None).await?;
            Ok(Outcome::Failed(job_id))
        }
    }
}
