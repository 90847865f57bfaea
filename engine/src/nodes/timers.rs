//! Timer steps (`sleep`, `until`): when one wakes, and the timers a
//! segment leaves asleep.
//!
//! A timer's instant is fixed the first time a segment reaches it and is
//! stored in the row (`timers`, step → instant) when the job goes to sleep,
//! so a restart or a lapsed lease never starts the wait again. Instants are
//! on the engine's clock, the one every lease and `run_after` is compared
//! with.
//!
//! A job that parks (on a person, a signal, a child or a Kafka reply) while
//! a timer on another branch is still asleep keeps the earliest such
//! instant as `wake_at`; the sweeper puts it back in the queue then
//! (`Engine::wake_due_waits`, `services/due_waits.rs`), so what follows the timer runs without
//! waiting for the answer.

use chrono::{DateTime, DurationRound as _, Utc};
use serde_json::Value as Json;

use crate::ClaimedRun;
use crate::Engine;
use flotilla_targets::StepFailure;
use flotilla_workflow::expr::Scope;
use flotilla_workflow::{CompiledWorkflow, Timer};

use super::{Began, Nodes, checkpoint};
use crate::SegmentStop;

/// The timers of a segment that have not woken: step, instant, and
/// whether this segment set it (else the row has it already).
#[derive(Debug, Default)]
pub(crate) struct Sleeping(Vec<(String, DateTime<Utc>, bool)>);

impl Sleeping {
    pub(crate) fn add(&mut self, step: String, at: DateTime<Utc>, new: bool) {
        self.0.push((step, at, new));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The timer that wakes first.
    pub(crate) fn first(&self) -> Option<(&str, DateTime<Utc>)> {
        self.0
            .iter()
            .min_by_key(|(_, at, _)| *at)
            .map(|(step, at, _)| (step.as_str(), *at))
    }

    /// The timers this segment set, as the row stores them.
    pub(crate) fn newly_set(&self) -> Json {
        Json::Object(
            self.0
                .iter()
                .filter(|(_, _, new)| *new)
                .map(|(step, at, _)| (step.clone(), Json::String(instant(*at))))
                .collect(),
        )
    }
}

/// An instant as the row and a timer's checkpoint write it.
pub(crate) fn instant(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// When the timer of step `index` wakes, and whether this call set it: the
/// instant the row stores, or (first reached) `sleep` from now or the
/// instant `until` gives over `scope`.
pub(crate) async fn wakes_at(
    engine: &Engine,
    claimed: &ClaimedRun,
    (compiled, index): (&std::sync::Arc<CompiledWorkflow>, usize),
    scope: &Scope,
) -> Result<(DateTime<Utc>, bool), StepFailure> {
    let step = &compiled.steps[index];
    let name = &step.definition.name;
    let stored = claimed
        .row()
        .timers
        .as_ref()
        .and_then(|timers| timers.0.get(name.as_str()).cloned());
    if let Some(stored) = stored {
        let at = parse_instant(&stored).ok_or_else(|| {
            StepFailure::Defect(format!(
                "step {name}: the stored timer {stored} is no instant"
            ))
        })?;
        return Ok((at, false));
    }
    let at = match &step.timer {
        Some(Timer::Sleep(duration)) => {
            let duration = chrono::Duration::from_std(*duration)
                .map_err(|e| StepFailure::Defect(format!("step {name}: sleep: {e}")))?;
            engine.now() + duration
        }
        Some(Timer::Until(_)) => {
            let given = {
                let (compiled, scope) = (compiled.clone(), scope.clone());
                engine
                    .off_runtime(move || match &compiled.steps[index].timer {
                        Some(Timer::Until(until)) => until.evaluate(&scope),
                        _ => Err("not an until timer".to_owned()),
                    })
                    .await
            };
            let given = match given {
                Ok(Ok(value)) => value,
                Ok(Err(e)) => return Err(StepFailure::Defect(format!("step {name}: until: {e}"))),
                Err(exhausted) => {
                    return Err(crate::nodes::call::over_budget(
                        name,
                        "evaluating until",
                        &exhausted,
                    ));
                }
            };
            parse_instant(&given).ok_or_else(|| StepFailure::Verdict {
                message: format!("step {name}: until gave {given}, not an RFC 3339 instant"),
                violations: vec![format!("{name}: until gave {given}")],
            })?
        }
        None => return Err(StepFailure::Defect(format!("step {name} is no timer"))),
    };
    // Kept to the millisecond, as the row stores it: the job's run_after
    // and its stored instant are then the same instant.
    let at = at
        .duration_trunc(chrono::TimeDelta::milliseconds(1))
        .unwrap_or(at);
    Ok((at, true))
}

fn parse_instant(value: &Json) -> Option<DateTime<Utc>> {
    value
        .as_str()
        .and_then(|text| DateTime::parse_from_rfc3339(text).ok())
        .map(|at| at.with_timezone(&Utc))
}

impl Nodes<'_> {
    /// Starts timer step `index`. A timer calls nothing: woken, it is
    /// checkpointed like an answer; not yet, the job sleeps once nothing
    /// else can run. Its instant is stored at once when this segment set
    /// it: it counts from now, whatever ends the segment.
    ///
    /// # Errors
    /// The lease was lost storing the instant.
    pub(super) async fn begin_timer(
        &self,
        index: usize,
        scope: &Scope,
    ) -> Result<Began, SegmentStop> {
        let name = self.compiled.steps[index].definition.name.clone();
        match wakes_at(self.engine, self.claimed, (self.compiled, index), scope).await {
            Ok((at, _)) if at <= self.engine.now() => {
                let response = serde_json::json!({ "woke_at": instant(at) });
                Ok(Began::Answer(checkpoint(name, None, Some(response))))
            }
            Ok((at, new)) => {
                if new {
                    self.claimed.keep_timer(&name, &instant(at)).await?;
                }
                Ok(Began::Sleeps { at, new })
            }
            Err(failed) => Ok(Began::Failed(failed)),
        }
    }
}
