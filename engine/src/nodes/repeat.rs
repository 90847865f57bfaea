//! Repeating steps (`repeat: {until, every, for}`): the target is called,
//! and while `until` says no over its answer the step sleeps `every` and
//! calls again, holding no lease in between, like a timer.
//!
//! Each call whose answer is "not yet" leaves a checkpoint of its own
//! (`poll`, holding the count of calls, not the answer), so a resumed
//! segment goes on from the next call; the answer that satisfies `until`
//! is the step's response. The instant of the next call is kept in the
//! row's `timers` under the step's name, as a timer's is. The `for` bound
//! is a wait's deadline (`bounds.rs`): past it, `on_timeout` ends the step.
//! A crash after a "not yet" checkpoint and before its instant is stored
//! makes the next call at once instead of a pause later: one early poll.

use std::collections::HashMap;

use chrono::{DateTime, DurationRound as _, Utc};
use flotilla_targets::StepFailure;
use flotilla_workflow::expr::Scope;
use serde_json::Value as Json;

use super::timers::instant;
use super::{Began, Node, Nodes};
use crate::SegmentStop;

impl Nodes<'_> {
    /// The next call of repeating step `node`: the one after the calls
    /// stored (`earlier`), now, or once the pause the last one left ends.
    pub(super) fn begin_repeat(
        &self,
        node: Node,
        scope: Scope,
        earlier: &mut HashMap<usize, u32>,
    ) -> Began {
        let poll = earlier.remove(&node.step).unwrap_or(0);
        let name = &self.compiled.steps[node.step].definition.name;
        let pause_ends = self
            .claimed
            .row()
            .timers
            .as_ref()
            .and_then(|timers| timers.0.get(name.as_str()))
            .and_then(Json::as_str)
            .and_then(|at| DateTime::parse_from_rfc3339(at).ok())
            .map(|at| at.with_timezone(&Utc));
        match pause_ends {
            Some(at) if poll > 0 && at > self.engine.now() => Began::Sleeps { at, new: false },
            _ => Began::Call(
                Node {
                    poll: Some(poll),
                    ..node
                },
                scope,
            ),
        }
    }

    /// Whether `answer` ends repeating step `index`: its `until` over the
    /// answer and what the step reads.
    ///
    /// # Errors
    /// `until` fails or gives no boolean (a defect of the definition), or
    /// spends its budget (a verdict).
    pub(super) async fn repeat_done(
        &self,
        index: usize,
        scope: Scope,
        answer: &Json,
    ) -> Result<bool, StepFailure> {
        let name = &self.compiled.steps[index].definition.name;
        let judged = {
            let (compiled, scope) = (self.compiled.clone(), scope.with("response", answer));
            self.engine
                .off_runtime(move || match &compiled.steps[index].repeat {
                    Some(repeat) => repeat.until.evaluate_bool(&scope),
                    None => Err("the step does not repeat".to_owned()),
                })
                .await
        };
        match judged {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(e)) => Err(StepFailure::Defect(format!(
                "step {name}: repeat.until: {e}"
            ))),
            Err(exhausted) => Err(super::call::over_budget(
                name,
                "evaluating repeat.until",
                &exhausted,
            )),
        }
    }

    /// Stores when repeating step `index` calls again (`every` from now)
    /// and returns it.
    ///
    /// # Errors
    /// The lease was lost storing the instant.
    pub(super) async fn next_poll(
        &self,
        index: usize,
        name: &str,
    ) -> Result<DateTime<Utc>, SegmentStop> {
        let every = self.compiled.steps[index]
            .repeat
            .as_ref()
            .map_or(std::time::Duration::from_secs(1), |repeat| repeat.every);
        let at = self.engine.now()
            + chrono::Duration::from_std(every).unwrap_or(chrono::TimeDelta::seconds(1));
        // To the millisecond, as the row keeps it.
        let at = at
            .duration_trunc(chrono::TimeDelta::milliseconds(1))
            .unwrap_or(at);
        self.claimed.keep_timer(name, &instant(at)).await?;
        Ok(at)
    }
}
