//! The checks of one step's shape and of the fields every kind shares.

use serde_json::Value as Json;

use super::Problems;
use crate::compiled::{CompiledStep, MAX_SLEEP, Timer};
use crate::expr::Expression;
use crate::graph::Graph;
use crate::http::CallShape;
use crate::limits::{self, MAX_RULES, PATTERN_SIZE_LIMIT};
use crate::model::{StartChild, StepDefinition};

impl Problems {
    /// A compensation (`on_failure`) step is a plain call, run in list
    /// order once the job is headed to end FAILED or DEAD.
    pub(super) fn compensation_shape(&mut self, step: &StepDefinition) {
        let at = Some(step.name.as_str());
        let graph_fields = [
            ("needs", step.needs.is_some()),
            ("when", step.when.is_some()),
            ("sleep", step.sleep.is_some()),
            ("until", step.until.is_some()),
            ("for_each", step.for_each.is_some()),
            ("paged", step.paged),
            ("completion", step.completion.is_some()),
            ("wait_for", step.wait_for.is_some()),
            ("start", step.start.is_some()),
        ];
        for (field, present) in graph_fields {
            if present {
                self.add(
                    at,
                    field,
                    "an on_failure step is a plain call, run in list order",
                );
            }
        }
    }

    /// A timer has `sleep` or `until` and nothing a call has.
    pub(super) fn timer_shape(&mut self, at: Option<&str>, step: &StepDefinition) {
        let field = if step.sleep.is_some() {
            "sleep"
        } else {
            "until"
        };
        if step.sleep.is_some() && step.until.is_some() {
            self.add(at, field, "a timer has sleep or until, not both");
        }
        let called = [
            ("target", !step.target.is_empty()),
            ("method", !step.method.is_empty()),
            ("rules", !step.rules.is_empty()),
            ("validate", !step.validate.is_empty()),
            ("output_schema", step.output_schema.is_some()),
            ("completion", step.completion.is_some()),
            ("timeout_ms", step.timeout_ms.is_some()),
            ("when", step.when.is_some()),
            ("wait_for", step.wait_for.is_some()),
            ("start", step.start.is_some()),
        ];
        for (name, present) in called {
            if present {
                self.add(at, name, "a timer calls no target: it has no target, method, rules, validate, output_schema, completion, timeout_ms or when");
            }
        }
    }

    /// A `wait_for` step names its signal and calls nothing; its answer
    /// is judged by `output_schema` and `validate` like a call's.
    pub(super) fn wait_shape(&mut self, at: Option<&str>, step: &StepDefinition, signal: &str) {
        if signal.trim().is_empty() {
            self.add(at, "wait_for", "is blank");
        } else if signal.len() > limits::MAX_SIGNAL_NAME_BYTES {
            self.add(
                at,
                "wait_for",
                format!(
                    "{} bytes long, over the limit of {}",
                    signal.len(),
                    limits::MAX_SIGNAL_NAME_BYTES
                ),
            );
        }
        self.calls_nothing(at, step, "a wait_for step");
    }

    /// A `start` step names a workflow and calls nothing; its response
    /// (the child's result) is judged by `output_schema` and `validate`.
    pub(super) fn start_shape(
        &mut self,
        at: Option<&str>,
        step: &StepDefinition,
        start: &StartChild,
    ) {
        if start.workflow.trim().is_empty() {
            self.add(at, "start.workflow", "is blank");
        }
        // One child per item: the list is its `for_each`.
        let per_item = StepDefinition {
            for_each: None,
            ..step.clone()
        };
        self.calls_nothing(
            at,
            &per_item,
            "a start step (its child's input is built by start.input)",
        );
        if step.for_each.is_some() && (step.timeout_ms.is_some() || step.on_timeout.is_some()) {
            self.add(
                at,
                "timeout_ms",
                "a start step with for_each waits for its children unbounded (bound each child's workflow with execution_timeout_ms)",
            );
        }
    }

    /// The children of a `start` step with `for_each` are known by
    /// `<step>[<index>]`: no other step may be named so, or its child
    /// and an item's would be one.
    pub(super) fn per_item_child_names(&mut self, steps: &[StepDefinition]) {
        let per_item: Vec<&str> = steps
            .iter()
            .filter(|s| s.start.is_some() && s.for_each.is_some())
            .map(|s| s.name.as_str())
            .collect();
        for step in steps {
            let taken = per_item.iter().find(|parent| {
                step.name
                    .strip_prefix(**parent)
                    .and_then(|rest| rest.strip_prefix('['))
                    .and_then(|rest| rest.strip_suffix(']'))
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            });
            if let Some(parent) = taken {
                self.add(
                    Some(&step.name),
                    "name",
                    format!("is the name the children of step {parent} are known by"),
                );
            }
        }
    }

    /// A step that calls no target (`what`: a wait or a start) has none of
    /// a call's fields, nor another kind's.
    pub(super) fn calls_nothing(&mut self, at: Option<&str>, step: &StepDefinition, what: &str) {
        let fields = [
            ("target", !step.target.is_empty()),
            ("method", !step.method.is_empty()),
            ("rules", !step.rules.is_empty()),
            ("completion", step.completion.is_some()),
            ("for_each", step.for_each.is_some()),
            ("paged", step.paged),
            ("wait_for", step.wait_for.is_some() && step.start.is_some()),
        ];
        for (name, present) in fields {
            if present {
                self.add(at, name, format!("{what} calls no target: it has no target, method, rules, completion, for_each or paged, and is not both a wait_for and a start"));
            }
        }
    }

    /// A `sleep`: a duration (`30m`, `2s`) above zero and at most a year.
    pub(super) fn sleep(&mut self, at: Option<&str>, text: &str) -> Option<std::time::Duration> {
        match humantime::parse_duration(text) {
            Ok(duration) if duration.is_zero() => {
                self.add(at, "sleep", "must be above 0");
                None
            }
            Ok(duration) if duration > MAX_SLEEP => {
                self.add(at, "sleep", "over the limit of 366 days");
                None
            }
            Ok(duration) => Some(duration),
            Err(e) => {
                self.add(
                    at,
                    "sleep",
                    format!("not a duration such as 30m or 2s: {e}"),
                );
                None
            }
        }
    }

    /// An expression of a step may name only the steps that end before it
    /// starts (its ancestors): any other is not there when it runs.
    pub(super) fn reads_outside_needs(
        &mut self,
        definitions: &[StepDefinition],
        graph: &Graph,
        compiled: &[CompiledStep],
    ) {
        let index: std::collections::HashMap<&str, usize> = definitions
            .iter()
            .enumerate()
            .map(|(i, step)| (step.name.as_str(), i))
            .collect();
        for (i, step) in compiled.iter().enumerate() {
            let at = Some(step.definition.name.as_str());
            let fields = step
                .rules
                .iter()
                .enumerate()
                .map(|(n, rule)| (format!("rules[{n}]"), &rule.expression))
                .chain(
                    step.validate
                        .iter()
                        .enumerate()
                        .map(|(n, rule)| (format!("validate[{n}]"), rule)),
                )
                .chain(step.when.iter().map(|when| ("when".to_owned(), when)))
                .chain(
                    step.for_each
                        .iter()
                        .map(|list| ("for_each".to_owned(), list)),
                )
                .chain(step.timer.iter().filter_map(|timer| match timer {
                    Timer::Until(until) => Some(("until".to_owned(), until)),
                    Timer::Sleep(_) => None,
                }))
                .chain(step.call_shape.iter().flat_map(CallShape::expressions))
                .chain(
                    step.repeat
                        .iter()
                        .map(|repeat| ("repeat.until".to_owned(), &repeat.until)),
                );
            for (field, expression) in fields {
                for name in expression.steps_named() {
                    match index.get(name.as_str()) {
                        None => self.add(at, &field, format!("reads steps.{name}, which is no step")),
                        Some(&j) if !graph.is_ancestor(j, i) => self.add(
                            at,
                            &field,
                            format!(
                                "reads steps.{name}, which it does not need (a step reads only the steps that end before it: add it to needs)"
                            ),
                        ),
                        Some(_) => {}
                    }
                }
            }
        }
    }

    /// `field` holds `count` rules: at most [`MAX_RULES`]; `false` (and a
    /// problem) past it.
    pub(super) fn count(&mut self, step: Option<&str>, field: &str, count: usize) -> bool {
        if count > MAX_RULES {
            self.add(
                step,
                field,
                format!("{count} entries, over the limit of {MAX_RULES}"),
            );
            return false;
        }
        true
    }

    pub(super) fn schema(
        &mut self,
        step: Option<&str>,
        field: &str,
        schema: &Json,
    ) -> Option<jsonschema::Validator> {
        if let Some(problem) = limits::schema_size_problem(schema) {
            self.add(step, field, problem);
            return None;
        }
        // Patterns compile with the linear-time engine (limits.rs).
        let patterns = jsonschema::PatternOptions::regex().size_limit(PATTERN_SIZE_LIMIT);
        match jsonschema::options()
            .with_pattern_options(patterns)
            .build(schema)
        {
            Ok(validator) => Some(validator),
            Err(e) => {
                self.add(step, field, format!("not a valid JSON Schema: {e}"));
                None
            }
        }
    }

    pub(super) fn expression(
        &mut self,
        step: Option<&str>,
        field: &str,
        source: &str,
    ) -> Option<Expression> {
        match Expression::compile(source) {
            Ok(expression) => Some(expression),
            Err(e) => {
                self.add(step, field, format!("CEL does not compile: {e}"));
                None
            }
        }
    }
}
