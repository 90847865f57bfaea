//! Bounds on waiting: a wait's `timeout_ms` and `on_timeout`, a step's
//! `repeat` (how often and how long it polls), the
//! workflow's `execution_timeout_ms`, its `debounce` (a key and the
//! window a job waits for a later request of it) and its `concurrency`
//! (a key and the most jobs of it at once).

use std::time::Duration;

use super::Problems;
use crate::compiled::CompiledRepeat;
use crate::expr::Expression;
use crate::model::{StepDefinition, WorkflowDefinition};

/// The shortest pause between a repeating step's calls.
pub(crate) const MIN_REPEAT_EVERY: Duration = Duration::from_secs(1);
/// The longest: a day.
pub(crate) const MAX_REPEAT_EVERY: Duration = Duration::from_secs(24 * 3600);
/// The most pauses one `for` may hold (`for` / `every`).
pub(crate) const MAX_REPEATS: u128 = 10_000;

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
        if step.repeat.is_some() {
            // Past its `for`, a repeating step ends by its `on_timeout`.
        } else if !waits {
            self.add(
                at,
                "on_timeout",
                "is for a wait_for, start, external or repeating step (a call's timeout is a retryable failure)",
            );
        } else if step.timeout_ms.is_none() {
            self.add(at, "on_timeout", "needs the timeout_ms it applies after");
        }
    }

    /// A repeating step's `repeat`: on a plain call, `until` a boolean,
    /// `every` and `for` durations in bounds.
    pub(super) fn repeat(
        &mut self,
        at: Option<&str>,
        step: &StepDefinition,
    ) -> Option<CompiledRepeat> {
        let repeat = step.repeat.as_ref()?;
        if step.is_timer()
            || step.wait_for.is_some()
            || step.start.is_some()
            || step.is_external()
            || step.for_each.is_some()
            || step.paged
        {
            self.add(
                at,
                "repeat",
                "only a plain call repeats (not a timer, a wait, a start, a for_each or a paged step)",
            );
            return None;
        }
        let mut duration = |field: &str, text: &str| match humantime::parse_duration(text) {
            Ok(duration) => Some(duration),
            Err(e) => {
                self.add(at, field, format!("not a duration such as 30s or 1h: {e}"));
                None
            }
        };
        let every = duration("repeat.every", &repeat.every);
        let for_at_most = duration("repeat.for", &repeat.for_at_most);
        let until = self.expression(at, "repeat.until", &repeat.until);
        if let Some(kind) = until.as_ref().and_then(Expression::surely_not_boolean) {
            self.add(at, "repeat.until", format!("is {kind}, not a boolean"));
        }
        let (every, for_at_most) = (every?, for_at_most?);
        if !(MIN_REPEAT_EVERY..=MAX_REPEAT_EVERY).contains(&every) {
            self.add(at, "repeat.every", "must be 1 second to a day");
        }
        if for_at_most < every {
            self.add(at, "repeat.for", "is shorter than one pause (every)");
        } else if for_at_most > crate::compiled::MAX_SLEEP {
            self.add(at, "repeat.for", "over the limit of 366 days");
        } else if for_at_most.as_millis() / every.as_millis().max(1) > MAX_REPEATS {
            self.add(
                at,
                "repeat.for",
                format!("holds more than {MAX_REPEATS} pauses of its every"),
            );
        }
        Some(CompiledRepeat {
            until: until?,
            every,
            for_at_most,
        })
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
