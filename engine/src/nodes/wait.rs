//! `wait_for` steps: the oldest unconsumed signal of the step's name is its
//! answer, judged like a call's; without one the job parks until a signal
//! comes (the signal's own transaction queues it again).

use std::collections::VecDeque;

use flotilla_store::runs::RunRow;
use flotilla_store::runs::signals::{self, SignalEntry};
use flotilla_targets::StepFailure;
use flotilla_workflow::expr::Scope;
use serde_json::Value as Json;

use super::{Began, Nodes, Wait, checkpoint};

/// The unconsumed signals the claim found, oldest first; each is taken
/// once in a segment.
pub(super) struct Pending(VecDeque<SignalEntry>);

impl Pending {
    pub(super) fn of(row: &RunRow) -> Result<Self, StepFailure> {
        let entries = signals::entries(row).map_err(|e| StepFailure::Defect(e.to_string()))?;
        Ok(Self(
            entries
                .into_iter()
                .filter(SignalEntry::is_pending)
                .collect(),
        ))
    }

    /// The oldest signal called `name`: its number and payload.
    pub(super) fn take(&mut self, name: &str) -> Option<(i64, Json)> {
        let at = self.0.iter().position(|s| s.name == name)?;
        self.0.remove(at).map(|s| (s.seq, s.payload))
    }
}

impl Nodes<'_> {
    /// Starts `wait_for` step `index`, which waits for `signal`.
    pub(super) async fn begin_wait(
        &self,
        index: usize,
        signal: &str,
        scope: &Scope,
        pending: &mut Pending,
    ) -> Began {
        let name = self.compiled.steps[index].definition.name.clone();
        match self.holds(index, scope).await {
            Ok(false) => Began::Answer(checkpoint(name, None, None)),
            Ok(true) => match pending.take(signal) {
                Some((seq, payload)) => match self.judge(index, &payload, scope).await {
                    Ok(()) => {
                        let mut taken = checkpoint(name, None, Some(payload));
                        taken.signal = Some(seq);
                        Began::Answer(taken)
                    }
                    Err(failed) => Began::Failed(failed),
                },
                None => Began::Waits(Wait::Signal(signal.to_owned())),
            },
            Err(failed) => Began::Failed(failed),
        }
    }
}
