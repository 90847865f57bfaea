//! What the engine counts and times, in one place (Prometheus names in the
//! style of other job systems; each is listed in docs/operations.md).

use std::time::Duration;

use chrono::{DateTime, Utc};

use flotilla_targets::RetryClass;

/// The label of what an inline definition names: any submitter picks those
/// names, so they are not labels, or `/metrics` could grow without bound.
pub(crate) const INLINE: &str = "inline";

/// The `workflow` (or `step`) label of a job whose stored workflow is
/// `version` (`None`: an inline definition).
pub(crate) fn label(name: &str, version: Option<i32>) -> String {
    if version.is_some() { name } else { INLINE }.to_owned()
}

/// A target call finished with `outcome` (ok, retryable, verdict, defect);
/// `version` of the stored workflow, `None` for an inline one.
pub(crate) fn step_finished(
    (workflow, version): (&str, Option<i32>),
    step: &str,
    target: &str,
    outcome: &'static str,
    took: Duration,
) {
    metrics::histogram!(
        "flotilla_step_duration_seconds",
        "workflow" => label(workflow, version),
        "step" => label(step, version),
        "target" => target.to_owned(),
        "outcome" => outcome,
    )
    .record(took.as_secs_f64());
}

/// A job was accepted (a new row).
pub(crate) fn job_submitted(workflow: &str, version: Option<i32>) {
    metrics::counter!("flotilla_jobs_submitted_total", "workflow" => label(workflow, version))
        .increment(1);
}

/// A job reached a terminal `state` (COMPLETED, FAILED, DEAD, CANCELLED)
/// `created_at` after it was submitted; `workflow` is its label.
pub(crate) fn job_finished(workflow: &str, state: &'static str, created_at: DateTime<Utc>) {
    let name = match state {
        "COMPLETED" => "flotilla_jobs_completed_total",
        "FAILED" => "flotilla_jobs_failed_total",
        "DEAD" => "flotilla_jobs_dead_total",
        _ => "flotilla_jobs_cancelled_total",
    };
    metrics::counter!(name, "workflow" => workflow.to_owned()).increment(1);
    let took = (Utc::now() - created_at).to_std().unwrap_or_default();
    metrics::histogram!(
        "flotilla_job_duration_seconds",
        "workflow" => workflow.to_owned(),
        "state" => state,
    )
    .record(took.as_secs_f64());
}

/// A claim took a job that had been runnable since `runnable_since`.
pub(crate) fn claimed(runnable_since: DateTime<Utc>) {
    metrics::counter!("flotilla_claims_total").increment(1);
    let waited = (Utc::now() - runnable_since).to_std().unwrap_or_default();
    metrics::histogram!("flotilla_queue_to_claim_seconds").record(waited.as_secs_f64());
}

/// A step will be tried again after a transient failure of `class`
/// (timeout, transport, status, deadline, other).
pub(crate) fn retry(class: RetryClass) {
    metrics::counter!("flotilla_step_retries_total", "class" => class.label()).increment(1);
}

/// A lease lapsed and the sweeper requeued the job; `counted` when its
/// owner was gone (a lease lost against the job), not merely unable to renew.
pub(crate) fn lease_lost_requeued(counted: bool) {
    if counted {
        metrics::counter!("flotilla_lease_losses_total").increment(1);
    }
    metrics::counter!("flotilla_sweeper_requeues_total").increment(1);
}

/// A job lost its worker once too often and the sweeper sent it DEAD: a
/// lease lost, and a job finished DEAD.
pub(crate) fn lease_lost_dead() {
    metrics::counter!("flotilla_lease_losses_total").increment(1);
}

/// From a job's claim to the start of its segment: time its lease ran
/// without a heartbeat.
pub(crate) fn claim_to_segment(waited: std::time::Duration) {
    metrics::histogram!("flotilla_claim_to_segment_seconds").record(waited.as_secs_f64());
}
