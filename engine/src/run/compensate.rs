//! Compensation: the `on_failure` steps a job runs once it is headed to
//! end FAILED or DEAD (refund what was charged, release what was held).
//!
//! The failure the job is headed for is written first (the row's
//! `compensation`, no event), so a worker that resumes the job goes on
//! compensating instead of running the failed step again. Each
//! compensation step is called in list order with `failure` (`step`,
//! `error`) and every answered step in scope, and checkpointed as it
//! answers (a STEP_CHECKPOINT event noted `compensation`). A compensation
//! that fails is recorded in the job's error and the rest are skipped,
//! never retried in a loop; then the job ends as it was headed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_store::runs::Checkpoint;
use serde_json::{Map, Value as Json, json};
use tokio_util::sync::CancellationToken;

use crate::Engine;
use crate::Outcome;
use crate::nodes::call::Invocation;
use crate::run::Headed;
use crate::{ClaimedRun, SegmentStop};
use flotilla_workflow::CompiledWorkflow;
use flotilla_workflow::expr::Scope;

/// The compensation a resumed job has under way: where it is headed and
/// the compensation steps answered (name → answer).
pub(crate) fn under_way(stored: &Json) -> Result<(Headed, Map<String, Json>), String> {
    let headed: Headed = serde_json::from_value(stored["failure"].clone())
        .map_err(|e| format!("the stored compensation is malformed: {e}"))?;
    let mut done = Map::new();
    for entry in stored["done"].as_array().into_iter().flatten() {
        let checkpoint: Checkpoint = serde_json::from_value(entry.clone())
            .map_err(|e| format!("a stored compensation checkpoint is malformed: {e}"))?;
        done.insert(checkpoint.name, checkpoint.response);
    }
    Ok((headed, done))
}

/// Runs the compensation steps not in `done` and ends the job as
/// `headed` says; `begun`: the row holds the compensation already.
pub(crate) async fn compensate(
    engine: &Engine,
    claimed: ClaimedRun,
    compiled: &Arc<CompiledWorkflow>,
    (input, steps): (&Json, &Map<String, Json>),
    (headed, done, begun): (Headed, Map<String, Json>, bool),
    lease_lost: &CancellationToken,
) -> Result<Outcome, SegmentStop> {
    let job_id = claimed.job_id();
    if !begun {
        let failure = serde_json::to_value(&headed).unwrap_or(Json::Null);
        claimed.begin_compensation(failure).await?;
    }
    let deadline = Duration::from_millis(compiled.definition.deadline_ms);
    let started = Instant::now();
    let failure = json!({"step": headed.step, "error": headed.error});
    // Converted once: every compensation step sees the same scope.
    let scope = Scope::default()
        .with("input", input)
        .with("steps", &Json::Object(steps.clone()))
        .with("failure", &failure);
    let mut note = None;
    for (n, step) in compiled.on_failure.iter().enumerate() {
        let name = &step.definition.name;
        if done.contains_key(name) {
            continue;
        }
        let Some(left) = deadline
            .checked_sub(started.elapsed())
            .filter(|d| !d.is_zero())
        else {
            note = Some(format!(
                "compensation {name} not run: the deadline of {} ms passed",
                deadline.as_millis()
            ));
            break;
        };
        let index = compiled.steps.len() + n;
        let called = engine
            .invoke(
                &claimed,
                (compiled, index, None),
                &scope,
                (left, deadline),
                lease_lost,
            )
            .await;
        match called {
            Ok(answer) => {
                let checkpoint = Checkpoint {
                    name: name.clone(),
                    skipped: false,
                    response: answer.response,
                    call: answer.call,
                    poll: None,
                    item: None,
                    page: None,
                    signal: None,
                    child: None,
                    list: None,
                    timed_out: false,
                };
                claimed.compensated(&checkpoint).await?;
            }
            Err(Invocation::LeaseLost) => return Ok(Outcome::LeaseLost(job_id)),
            // Begun and written: the next claim goes on compensating.
            Err(Invocation::Throttled { until, reason }) => {
                claimed.hold(&reason, until).await?;
                return Ok(Outcome::Held(job_id));
            }
            Err(Invocation::Failed(failed)) => {
                note = Some(format!("compensation {name} failed: {}", failed.message()));
                break;
            }
        }
    }
    let error = match &note {
        Some(note) => format!("{}; {note}", headed.error),
        None => headed.error.clone(),
    };
    if let Some(note) = &note {
        tracing::warn!(%job_id, %note, "compensation did not finish");
    }
    if headed.dead {
        claimed.dead(&error).await?;
        Ok(Outcome::Dead(job_id))
    } else {
        claimed.fail(&error, headed.verdict.as_deref()).await?;
        Ok(Outcome::Failed(job_id))
    }
}
