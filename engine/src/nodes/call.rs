//! Calling one step: build its request from the rules, call the target
//! under one timer, and judge the response against the step's schema and
//! `validate` rules.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use flotilla_runtime::supervise::panic_message;
use futures_util::FutureExt as _;

use serde_json::Value as Json;
use tokio_util::sync::CancellationToken;

use super::{Node, Nodes};
use crate::ClaimedRun;
use crate::Engine;
use crate::support::judge::check_response;
use crate::support::rate_limit::NoPermit;
use flotilla_targets::{RetryClass, StepFailure, TargetCall};
use flotilla_workflow::assemble;
use flotilla_workflow::expr::Scope;
use flotilla_workflow::{CompiledWorkflow, Exhausted};

/// Why a step gave no response.
pub(crate) enum Invocation {
    LeaseLost,
    Failed(StepFailure),
    /// The target's rate limit has no permit before the segment's time
    /// runs out: the job goes back to the queue until `until`, its
    /// attempt given back.
    Throttled {
        until: chrono::DateTime<chrono::Utc>,
        reason: String,
    },
}

/// A call's judged response, and the call as shown (`GET /orders/42`)
/// when its step shapes it.
pub(crate) struct Answer {
    pub(crate) response: Json,
    pub(crate) call: Option<String>,
}

impl Engine {
    pub(crate) async fn invoke(
        &self,
        claimed: &ClaimedRun,
        (compiled, index, part): (&Arc<CompiledWorkflow>, usize, Option<String>),
        scope: &Scope,
        (left, deadline): (Duration, Duration),
        lease_lost: &CancellationToken,
    ) -> Result<Answer, Invocation> {
        let step = compiled.step_at(index);
        let name = &step.definition.name;
        let built = {
            let (compiled, scope) = (compiled.clone(), scope.clone());
            self.off_runtime(move || {
                let step = compiled.step_at(index);
                let request = assemble(&step.rules, &scope)?;
                let shape = step
                    .call_shape
                    .as_ref()
                    .map(|shape| shape.resolve(&scope))
                    .transpose()?;
                Ok::<_, String>((request, shape))
            })
            .await
        };
        let (request, shape) = match built {
            Ok(Ok(built)) => built,
            Ok(Err(e)) => {
                return Err(Invocation::Failed(StepFailure::Defect(format!(
                    "step {name}: building the request: {e}"
                ))));
            }
            Err(exhausted) => {
                return Err(Invocation::Failed(over_budget(
                    name,
                    "building the request",
                    &exhausted,
                )));
            }
        };
        let target = &step.definition.target;
        // One timer bounds the call: the step's timeout, the target's (the
        // operator's bound, which no definition raises) or what is left of
        // the segment's deadline, whichever is shortest, reported as itself.
        let target_limit = self.targets().timeout(target);
        let step_limit = match (
            step.definition.timeout_ms.map(Duration::from_millis),
            target_limit,
        ) {
            (Some(step_limit), Some(target_limit)) => Some(step_limit.min(target_limit)),
            (step_limit, target_limit) => step_limit.or(target_limit),
        };
        // A rate-limited target's permit first, fleet-wide; its wait comes
        // out of the segment's time, keeping back the call's own bound (at
        // most half the time left), so a wait never leaves the call cut
        // short.
        let reserve = step_limit.unwrap_or_default().min(left / 2);
        let left = match self.targets().rate_limit(target) {
            None => left,
            Some(rate) => match self
                .rate_permit(target, rate, left.saturating_sub(reserve), lease_lost)
                .await
            {
                Ok(waited) => left.saturating_sub(waited),
                Err(NoPermit::Later { until, reason }) => {
                    return Err(Invocation::Throttled { until, reason });
                }
                Err(NoPermit::LeaseLost) => return Err(Invocation::LeaseLost),
                // The store failed: a failure of the world, retried as one.
                Err(NoPermit::Store(e)) => {
                    return Err(Invocation::Failed(StepFailure::retryable(
                        RetryClass::Other,
                        format!(
                            "step {name}: taking a permit of target {target}'s rate limit: {e}"
                        ),
                    )));
                }
            },
        };
        let limit = step_limit.map_or(left, |step_limit| step_limit.min(left));
        // The call's own span: the target sees it as the caller (its
        // traceparent), not the submitter.
        let span = tracing::info_span!(
            "step",
            otel.name = format!("step {name}"),
            otel.kind = "client",
            job_id = %claimed.job_id(),
            workflow_name = %claimed.row().workflow_name,
            flotilla.step = %name,
            flotilla.target = %target,
            flotilla.method = %step.definition.method,
            flotilla.attempt = claimed.row().attempt,
            flotilla.outcome = tracing::field::Empty,
        );
        let (traceparent, tracestate) = flotilla_runtime::trace::headers_of(&span).map_or_else(
            || {
                (
                    claimed.row().traceparent.clone(),
                    claimed.row().tracestate.clone(),
                )
            },
            |(traceparent, tracestate)| (Some(traceparent), tracestate),
        );
        // The call as checkpoints and the console show it: its verb and
        // path, never its headers.
        let shown = shape
            .as_ref()
            .map(|shape| shape.shown(self.targets().default_verb(target)));
        let call = TargetCall {
            job_id: claimed.job_id(),
            step_name: name.clone(),
            method: step.definition.method.clone(),
            request,
            timeout: limit,
            traceparent,
            tracestate,
            part,
            retry_statuses: step.retry.retry_statuses.clone(),
            shape,
        };
        let started = std::time::Instant::now();
        // A target that panics fails this job as a defect; the loop goes on.
        let guarded = AssertUnwindSafe(tracing::Instrument::instrument(
            self.targets().call(target, call),
            span.clone(),
        ))
        .catch_unwind()
        .map(|called| {
            called.unwrap_or_else(|panic| {
                Err(StepFailure::Defect(format!(
                    "target {target} panicked: {}",
                    panic_message(panic.as_ref())
                )))
            })
        });
        let response = tokio::select! {
            response = tokio::time::timeout(limit, guarded) => {
                response.unwrap_or_else(|_| Err(StepFailure::retryable(RetryClass::Timeout, match step_limit {
                    Some(step_limit) if step_limit < left => format!(
                        "target {target} did not answer within {} ms (the {} timeout)",
                        step_limit.as_millis(),
                        if target_limit == Some(step_limit) { "target's" } else { "step's" },
                    ),
                    _ => format!(
                        "the segment deadline of {} ms passed while waiting for target {target}",
                        deadline.as_millis()
                    ),
                })))
            }
            () = lease_lost.cancelled() => return Err(Invocation::LeaseLost),
        };
        let outcome = match &response {
            Ok(_) => "ok",
            Err(StepFailure::Retryable { .. }) => "retryable",
            Err(StepFailure::Verdict { .. }) => "verdict",
            Err(StepFailure::Defect(_)) => "defect",
        };
        span.record("flotilla.outcome", outcome);
        crate::support::telemetry::step_finished(
            (&claimed.row().workflow_name, claimed.row().workflow_version),
            name,
            target,
            outcome,
            started.elapsed(),
        );
        let response = response
            .map_err(|failure| Invocation::Failed(failure.within(&format!("step {name}: "))))?;
        let judged = {
            let (compiled, scope, response) = (compiled.clone(), scope.clone(), response.clone());
            self.off_runtime(move || check_response(compiled.step_at(index), &response, &scope))
                .await
        };
        match judged {
            Ok(judged) => judged.map_err(Invocation::Failed)?,
            Err(exhausted) => {
                return Err(Invocation::Failed(over_budget(
                    name,
                    "judging the response",
                    &exhausted,
                )));
            }
        }
        Ok(Answer {
            response,
            call: shown,
        })
    }
}

/// An expression of step `name` spent its whole budget while `doing`: the
/// job's own verdict (its definition asked for more than a worker gives).
pub(crate) fn over_budget(name: &str, doing: &str, exhausted: &Exhausted) -> StepFailure {
    StepFailure::Verdict {
        message: format!("step {name}: {doing}: {exhausted}"),
        violations: vec![format!("{name}: {exhausted}")],
    }
}

impl Nodes<'_> {
    /// A step's call (its `when` first), or one item's.
    pub(super) async fn call(
        &self,
        node: Node,
        scope: Scope,
        (left, deadline): (Duration, Duration),
    ) -> (Node, Result<Option<Answer>, Invocation>) {
        let _running = Running::new();
        if node.is_first() {
            match self.holds(node.step, &scope).await {
                Ok(true) => {}
                Ok(false) => return (node, Ok(None)),
                Err(failed) => return (node, Err(Invocation::Failed(failed))),
            }
        }
        let called = self
            .engine
            .invoke(
                self.claimed,
                (self.compiled, node.step, node.part()),
                &scope,
                (left, deadline),
                self.lease_lost,
            )
            .await;
        (node, called.map(Some))
    }
}

/// A call under way, counted in `flotilla_steps_running` until it ends or
/// is dropped (a lost lease drops every call of the segment).
struct Running;

impl Running {
    fn new() -> Self {
        metrics::gauge!("flotilla_steps_running").increment(1.0);
        Self
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        metrics::gauge!("flotilla_steps_running").decrement(1.0);
    }
}
