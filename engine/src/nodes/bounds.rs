//! Waits with a `timeout_ms` (`wait_for`, `start` and external steps), and
//! repeating steps with their `for`: the
//! deadline is fixed the first time a segment reaches the wait and kept in
//! the row's `timers` under the step's name, as a timer's instant is, so a
//! restart never starts the wait again; a parked job wakes at it
//! (`wake_at`). Past it, the step's `on_timeout` ends the wait: the job
//! fails with a verdict naming the step, or the step is skipped, or it
//! takes the given value; either checkpoint says `timed_out`.

use chrono::{DateTime, DurationRound as _, Utc};
use flotilla_targets::StepFailure;
use flotilla_workflow::OnTimeout;

use super::timers::instant;
use super::{Began, Nodes, Wait, checkpoint};
use crate::SegmentStop;

impl Nodes<'_> {
    /// `began` of step `index` under its `timeout_ms`, and the deadline a
    /// park must wake at (with whether this segment set it). A step with
    /// no bound, or one not waiting, is left as it began.
    ///
    /// # Errors
    /// The lease was lost storing the deadline.
    pub(super) async fn bounded(
        &self,
        index: usize,
        began: Began,
    ) -> Result<(Began, Option<(String, DateTime<Utc>, bool)>), SegmentStop> {
        let step = &self.compiled.steps[index].definition;
        let waiting = matches!(
            began,
            Began::Waits(Wait::Signal(_) | Wait::Child(_) | Wait::Answer) | Began::StartChild(..)
        );
        // A repeating step is bounded by its `for`, calling or asleep.
        let repeating = self.compiled.steps[index]
            .repeat
            .as_ref()
            .filter(|_| matches!(began, Began::Call(..) | Began::Sleeps { .. }))
            .map(|repeat| u64::try_from(repeat.for_at_most.as_millis()).unwrap_or(u64::MAX));
        // An external step's `timeout_ms` meant nothing before waits had
        // bounds: it bounds the wait only beside an `on_timeout`, so a
        // definition stored then keeps its meaning.
        let bounded = waiting && (!step.is_external() || step.on_timeout.is_some());
        let Some(timeout) = repeating.or(step.timeout_ms.filter(|_| bounded)) else {
            return Ok((began, None));
        };
        let name = step.name.clone();
        let key = flotilla_store::runs::wait_deadline_key(&name);
        let now = self.engine.now();
        let (at, new) = match self.claimed.row().wait_deadline(&name) {
            Some(at) => (at, false),
            None => {
                let at = now
                    + chrono::Duration::milliseconds(
                        i64::try_from(timeout).unwrap_or(i64::MAX / 2),
                    );
                // To the millisecond, as the row keeps it.
                let at = at
                    .duration_trunc(chrono::TimeDelta::milliseconds(1))
                    .unwrap_or(at);
                self.claimed.keep_timer(&key, &instant(at)).await?;
                (at, true)
            }
        };
        if at > now {
            return Ok((began, Some((key, at, new))));
        }
        // A signal accepted while this segment ran, before the deadline,
        // wins: the park finds it and the next segment takes it.
        if let Began::Waits(Wait::Signal(signal)) = &began {
            let job_id = self.claimed.job_id();
            let pending = flotilla_store::sql::session(self.engine.pool(), async |conn| {
                flotilla_store::runs::signals::has_pending(conn, job_id, signal).await
            })
            .await?;
            if pending {
                return Ok((began, None));
            }
        }
        if step.start.is_some() && step.cancel_children != Some(false) {
            let child = crate::submission::child_id(self.claimed.job_id(), &name);
            let reason = format!("its parent's step {name} timed out");
            if let Err(e) = self.engine.cancel(child, &reason).await {
                // Ended already, or never started: nothing to stop.
                tracing::debug!(%child, error = %e, "a timed-out child was not cancelled");
            }
        }
        let waited = humantime::format_duration(std::time::Duration::from_millis(timeout));
        let ended = |response| {
            let mut ended = checkpoint(name.clone(), None, response);
            ended.timed_out = true;
            Began::Answer(ended)
        };
        Ok((
            match &step.on_timeout {
                None | Some(OnTimeout::Fail) if repeating.is_some() => {
                    Began::Failed(StepFailure::Verdict {
                        message: format!(
                            "step {name}: timed out after {waited} of repeating without its until"
                        ),
                        violations: vec![format!("{name}: timed out after {waited}")],
                    })
                }
                None | Some(OnTimeout::Fail) => Began::Failed(StepFailure::Verdict {
                    message: format!("step {name}: timed out after {waited} of waiting"),
                    violations: vec![format!("{name}: timed out after {waited}")],
                }),
                Some(OnTimeout::Skip) => ended(None),
                Some(OnTimeout::Value(value)) => ended(Some(value.clone())),
            },
            None,
        ))
    }
}
