//! Bounds on waiting: a wait's `timeout_ms` and `on_timeout`, and the
//! workflow's `execution_timeout_ms`.

use super::Problems;
use crate::model::{StepDefinition, WorkflowDefinition};

/// The longest `execution_timeout_ms`: 366 days, as the longest `sleep`.
pub(crate) const MAX_EXECUTION_TIMEOUT_MS: u64 = 366 * 24 * 3600 * 1000;

impl Problems {
    /// `on_timeout` ends a wait that ran past its `timeout_ms`: it is for
    /// a `wait_for`, `start` or external step that has one.
    pub(super) fn wait_bounds(&mut self, at: Option<&str>, step: &StepDefinition) {
        if step.on_timeout.is_none() {
            return;
        }
        let waits = step.wait_for.is_some() || step.start.is_some() || step.is_external();
        if !waits {
            self.add(
                at,
                "on_timeout",
                "is for a wait_for, start or external step (a call's timeout is a retryable failure)",
            );
        } else if step.timeout_ms.is_none() {
            self.add(at, "on_timeout", "needs the timeout_ms it applies after");
        }
    }

    pub(super) fn execution_timeout(&mut self, definition: &WorkflowDefinition) {
        if let Some(timeout) = definition.execution_timeout_ms
            && !(1..=MAX_EXECUTION_TIMEOUT_MS).contains(&timeout)
        {
            self.top(
                "execution_timeout_ms",
                format!("must be 1 to {MAX_EXECUTION_TIMEOUT_MS} (366 days), got {timeout}"),
            );
        }
    }
}
