//! Bounds on waiting: a wait's `timeout_ms` and `on_timeout`, the
//! workflow's `execution_timeout_ms`, its `debounce` (a key and the
//! window a job waits for a later request of it) and its `concurrency`
//! (a key and the most jobs of it at once).

use super::Problems;
use crate::expr::Expression;
use crate::model::{StepDefinition, WorkflowDefinition};

/// The longest debounce window: a day.
pub(crate) const MAX_DEBOUNCE_WINDOW_MS: u64 = 24 * 3600 * 1000;

/// The most jobs one concurrency key may let run at once.
pub(crate) const MAX_CONCURRENCY_LIMIT: u32 = 10_000;

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

    /// The debounce key's expression, compiled; its window in bounds.
    pub(super) fn debounce(&mut self, definition: &WorkflowDefinition) -> Option<Expression> {
        let debounce = definition.debounce.as_ref()?;
        if !(1..=MAX_DEBOUNCE_WINDOW_MS).contains(&debounce.window_ms) {
            self.top(
                "debounce.window_ms",
                format!(
                    "must be 1 to {MAX_DEBOUNCE_WINDOW_MS} (a day), got {}",
                    debounce.window_ms
                ),
            );
        }
        self.expression(None, "debounce.key", &debounce.key)
    }

    /// The concurrency key's expression, compiled; its limit in bounds.
    pub(super) fn concurrency(&mut self, definition: &WorkflowDefinition) -> Option<Expression> {
        let concurrency = definition.concurrency.as_ref()?;
        if !(1..=MAX_CONCURRENCY_LIMIT).contains(&concurrency.limit) {
            self.top(
                "concurrency.limit",
                format!(
                    "must be 1 to {MAX_CONCURRENCY_LIMIT}, got {}",
                    concurrency.limit
                ),
            );
        }
        self.expression(None, "concurrency.key", &concurrency.key)
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
