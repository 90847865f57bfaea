//! Turning a definition document into a [`CompiledWorkflow`], or into the
//! full list of what is wrong with it.

use std::collections::HashSet;

use serde_json::Value as Json;

use crate::compiled::{
    CompiledStep, CompiledWorkflow, DefinitionProblem, InvalidDefinition, Timer,
};
use crate::expr::Expression;
use crate::graph::Graph;
use crate::limits::{self, MAX_PATTERNS, MAX_START_STEPS, MAX_STEPS};
use crate::model::{
    MAX_ATTEMPTS, MAX_DEADLINE_MS, MAX_ITEMS, MAX_PAGES, MAX_PARALLELISM, StepDefinition,
    WorkflowDefinition,
};

mod assign;
mod call_shape;
mod checks;
mod retry;
mod shape;
mod waits;

impl CompiledWorkflow {
    /// Parses and compiles a definition document. `known_targets` are the
    /// target names this fleet member can call.
    ///
    /// Call it on a thread with a deep stack, as the engine does
    /// (`Engine::compile`, on its evaluation threads): the CEL parser
    /// recurses with large frames for every level of nesting (an
    /// expression within the limits needs several MiB in a debug build),
    /// and an overflow aborts the process.
    ///
    /// # Errors
    /// Every problem found, each naming its step and field.
    pub fn compile(
        document: &Json,
        known_targets: &HashSet<String>,
    ) -> Result<Self, InvalidDefinition> {
        // Fields the model does not have are named (with the one meant)
        // and set aside, so the rest of the document is still checked.
        let mut problems = Problems::default();
        let known = shape::without_unknown_fields(document, &mut problems);
        let set_aside = problems.0.len();
        let definition: WorkflowDefinition = match serde_json::from_value(known) {
            Ok(definition) => definition,
            Err(e) => {
                // The model's reading stops at the first mistake of shape;
                // the schema lists them all.
                let mut structural = crate::schema::structural_problems(document);
                if structural.is_empty() {
                    structural.push(DefinitionProblem {
                        step: None,
                        field: "document".into(),
                        message: e.to_string(),
                    });
                }
                problems.0.extend(structural);
                return Err(InvalidDefinition {
                    problems: problems.0,
                });
            }
        };
        if definition.name.trim().is_empty() {
            problems.top("name", "is blank");
        }
        if definition.steps.is_empty() {
            problems.top("steps", "a workflow has at least one step");
        }
        let step_count = definition.steps.len() + definition.on_failure.len();
        if step_count > MAX_STEPS {
            problems.top(
                "steps",
                format!("{step_count} steps (on_failure included), over the limit of {MAX_STEPS}"),
            );
        }
        let starts = definition
            .steps
            .iter()
            .filter(|s| s.start.is_some())
            .count();
        if starts > MAX_START_STEPS {
            problems.top(
                "steps",
                format!("{starts} start steps, over the limit of {MAX_START_STEPS}"),
            );
        }
        problems.count(None, "output", definition.output.len());
        let patterns = std::iter::once(&definition.input_schema)
            .chain(
                definition
                    .steps
                    .iter()
                    .filter_map(|s| s.output_schema.as_ref()),
            )
            .map(limits::patterns_in)
            .fold(0usize, usize::saturating_add);
        if patterns > MAX_PATTERNS {
            problems.top(
                "schemas",
                format!("{patterns} patterns in all, over the limit of {MAX_PATTERNS}"),
            );
        }
        // Over a limit of size: nothing more is compiled (that is the work
        // the limit bounds).
        if problems.0.len() > set_aside {
            return Err(InvalidDefinition {
                problems: problems.0,
            });
        }
        if !(1..=MAX_ATTEMPTS).contains(&definition.max_attempts) {
            problems.top(
                "max_attempts",
                format!(
                    "must be 1 to {MAX_ATTEMPTS}, got {}",
                    definition.max_attempts
                ),
            );
        }
        if !(1..=MAX_DEADLINE_MS).contains(&definition.deadline_ms) {
            problems.top(
                "deadline_ms",
                format!(
                    "must be 1 to {MAX_DEADLINE_MS} (a day), got {}",
                    definition.deadline_ms
                ),
            );
        }
        problems.execution_timeout(&definition);
        let debounce_key = problems.debounce(&definition);
        let concurrency_key = problems.concurrency(&definition);
        if let Some(parallelism) = definition.parallelism
            && !(1..=MAX_PARALLELISM).contains(&parallelism)
        {
            problems.top(
                "parallelism",
                format!("must be 1 to {MAX_PARALLELISM}, got {parallelism}"),
            );
        }
        let graph = Graph::resolve(&definition.steps)
            .map_err(|found| {
                for problem in found {
                    problems.add(problem.step.as_deref(), "needs", problem.message);
                }
            })
            .ok();
        let input_schema = problems.schema(None, "input_schema", &definition.input_schema);

        let mut seen = HashSet::new();
        let mut steps = Vec::with_capacity(definition.steps.len());
        for step in &definition.steps {
            if let Some(compiled) = problems.step(step, known_targets, &mut seen) {
                steps.push(compiled);
            }
        }
        let mut on_failure = Vec::with_capacity(definition.on_failure.len());
        for step in &definition.on_failure {
            problems.compensation_shape(step);
            if let Some(compiled) = problems.step(step, known_targets, &mut seen) {
                on_failure.push(compiled);
            }
        }
        problems.per_item_child_names(&definition.steps);
        problems.retry_policies(&definition, &mut steps, &mut on_failure);
        let output = problems.assignments(None, "output", &definition.output);
        let verdict = definition
            .verdict
            .as_deref()
            .and_then(|source| problems.expression(None, "verdict", source));

        if let Some(graph) = graph
            .as_ref()
            .filter(|_| steps.len() == definition.steps.len())
        {
            problems.reads_outside_needs(&definition.steps, graph, &steps);
        }
        let by_name = definition
            .steps
            .iter()
            .enumerate()
            .map(|(i, step)| (step.name.clone(), i))
            .collect();
        match (problems.0.is_empty(), input_schema, graph) {
            (true, Some(input_schema), Some(graph)) => Ok(Self {
                definition,
                document: document.clone(),
                input_schema,
                by_name,
                steps,
                on_failure,
                graph,
                output,
                verdict,
                debounce_key,
                concurrency_key,
                patterns,
            }),
            _ => Err(InvalidDefinition {
                problems: problems.0,
            }),
        }
    }
}

#[derive(Default)]
struct Problems(Vec<DefinitionProblem>);

impl Problems {
    fn add(&mut self, step: Option<&str>, field: &str, message: impl Into<String>) {
        self.0.push(DefinitionProblem {
            step: step.map(str::to_owned),
            field: field.to_owned(),
            message: message.into(),
        });
    }

    fn top(&mut self, field: &str, message: impl Into<String>) {
        self.add(None, field, message);
    }

    /// Compiles one step, adding what is wrong with it; `seen` holds the
    /// names taken so far.
    fn step(
        &mut self,
        step: &StepDefinition,
        known_targets: &HashSet<String>,
        seen: &mut HashSet<String>,
    ) -> Option<CompiledStep> {
        let at = Some(step.name.as_str());
        if step.name.trim().is_empty() {
            self.add(at, "name", "is blank");
        } else if step.name.len() > limits::MAX_STEP_NAME_BYTES {
            self.add(
                at,
                "name",
                format!(
                    "{} bytes long, over the limit of {}",
                    step.name.len(),
                    limits::MAX_STEP_NAME_BYTES
                ),
            );
        } else if !seen.insert(step.name.clone()) {
            self.add(
                at,
                "name",
                "is used by an earlier step; step names are unique",
            );
        }
        if step.is_timer() {
            self.timer_shape(at, step);
        } else if let Some(signal) = &step.wait_for {
            self.wait_shape(at, step, signal);
        } else if let Some(start) = &step.start {
            self.start_shape(at, step, start);
        } else {
            if !known_targets.contains(&step.target) {
                let mut known: Vec<_> = known_targets.iter().map(String::as_str).collect();
                known.sort_unstable();
                self.add(
                    at,
                    "target",
                    format!(
                        "unknown target {:?} (known: {})",
                        step.target,
                        known.join(", ")
                    ),
                );
            }
            if step.path.is_none()
                && let Some(problem) = limits::method_problem(&step.method)
            {
                self.add(at, "method", problem);
            }
        }
        let call_shape = self.call_shape(at, step);
        let repeat = self.repeat(at, step);
        self.wait_bounds(at, step);
        if step.timeout_ms == Some(0) {
            self.add(at, "timeout_ms", "must be above 0");
        }
        if step.cancel_children.is_some() && step.start.is_none() {
            self.add(at, "cancel_children", "only a start step has children");
        }
        // A start step's input is built as a call's request is.
        let (rules_field, rule_sources) = match &step.start {
            Some(start) => ("start.input", &start.input),
            None => ("rules", &step.rules),
        };
        if !self.count(
            at,
            "rules and validate",
            rule_sources.len() + step.validate.len(),
        ) {
            return None;
        }
        let rules = self.assignments(at, rules_field, rule_sources);
        let output_schema = step
            .output_schema
            .as_ref()
            .and_then(|schema| self.schema(at, "output_schema", schema));
        let validate: Vec<Expression> = step
            .validate
            .iter()
            .enumerate()
            .filter_map(|(i, source)| self.expression(at, &format!("validate[{i}]"), source))
            .collect();
        let when = step.when.as_deref().and_then(|source| {
            let when = self.expression(at, "when", source)?;
            if let Some(kind) = when.surely_not_boolean() {
                self.add(at, "when", format!("is {kind}, not a boolean"));
            }
            Some(when)
        });
        let timer = if let Some(sleep) = &step.sleep {
            self.sleep(at, sleep).map(Timer::Sleep)
        } else {
            step.until
                .as_deref()
                .and_then(|source| self.expression(at, "until", source))
                .map(Timer::Until)
        };
        let for_each = step.for_each.as_deref().and_then(|source| {
            let list = self.expression(at, "for_each", source)?;
            if let Some(kind) = list.surely_not_list() {
                self.add(at, "for_each", format!("is {kind}, not a list"));
            }
            Some(list)
        });
        if let Some(max) = step.max_items
            && !(1..=MAX_ITEMS).contains(&max)
        {
            self.add(
                at,
                "max_items",
                format!("must be 1 to {MAX_ITEMS}, got {max}"),
            );
        }
        if let Some(max) = step.max_pages {
            if !step.paged {
                self.add(at, "max_pages", "is for a paged step (paged: true)");
            } else if !(1..=MAX_PAGES).contains(&max) {
                self.add(
                    at,
                    "max_pages",
                    format!("must be 1 to {MAX_PAGES}, got {max}"),
                );
            }
        }
        if step.paged && (step.is_timer() || step.is_external() || step.for_each.is_some()) {
            self.add(
                at,
                "paged",
                "a timer, an external or a for_each step is not paged",
            );
        }
        if step.for_each.is_some() && (step.is_timer() || step.is_external()) {
            self.add(
                at,
                "for_each",
                "a timer or an external step is not called per item",
            );
        }
        Some(CompiledStep {
            definition: step.clone(),
            rules,
            output_schema,
            validate,
            when,
            timer,
            for_each,
            call_shape,
            repeat,
            retry: crate::retry::StepRetry::plain(crate::model::default_max_attempts()),
        })
    }
}

#[cfg(test)]
mod tests;
