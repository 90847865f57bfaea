//! Turning a definition document into a [`CompiledWorkflow`], or into the
//! full list of what is wrong with it.

use std::collections::HashSet;
use std::fmt;

use serde_json::{Map, Value as Json};

use super::expr::Expression;
use super::graph::Graph;
use super::limits::{
    self, MAX_PATTERNS, MAX_RULES, MAX_START_STEPS, MAX_STEPS, MAX_VIOLATIONS, PATTERN_SIZE_LIMIT,
};
use super::model::{
    MAX_ATTEMPTS, MAX_DEADLINE_MS, MAX_ITEMS, MAX_PAGES, MAX_PARALLELISM, StartChild,
    StepDefinition, WorkflowDefinition,
};

/// One thing wrong with a definition, located by step and field.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DefinitionProblem {
    /// The step, when the problem is inside one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// The field, e.g. `rules[1]` or `input_schema`.
    pub field: String,
    pub message: String,
}

impl fmt::Display for DefinitionProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.step {
            Some(step) => write!(f, "step {step}: {}: {}", self.field, self.message),
            None => write!(f, "{}: {}", self.field, self.message),
        }
    }
}

/// A refused definition, with every problem found.
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid workflow definition: {}", .problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct InvalidDefinition {
    pub problems: Vec<DefinitionProblem>,
}

/// An assignment `path = expression`; `path` is the request field it sets.
#[derive(Debug)]
pub struct Assignment {
    pub path: Vec<String>,
    pub expression: Expression,
}

#[derive(Debug)]
pub struct CompiledStep {
    pub definition: StepDefinition,
    pub rules: Vec<Assignment>,
    pub output_schema: Option<jsonschema::Validator>,
    pub validate: Vec<Expression>,
    /// False: the step is skipped.
    pub when: Option<Expression>,
    /// What a timer waits for; `None` for a step that calls a target.
    pub timer: Option<Timer>,
    /// The list a `for_each` step calls its target once per item of.
    pub for_each: Option<Expression>,
}

/// What a timer step waits for.
#[derive(Debug)]
pub enum Timer {
    /// This long after its last need ended.
    Sleep(std::time::Duration),
    /// The instant this expression gives (an RFC 3339 timestamp).
    Until(Expression),
}

/// The longest a `sleep` may be.
pub const MAX_SLEEP: std::time::Duration = std::time::Duration::from_secs(366 * 24 * 3600);

/// A definition ready to run: every expression and schema compiled.
#[derive(Debug)]
pub struct CompiledWorkflow {
    pub definition: WorkflowDefinition,
    pub document: Json,
    pub input_schema: jsonschema::Validator,
    pub steps: Vec<CompiledStep>,
    /// The compensation steps, run in order when the job is headed to end
    /// FAILED or DEAD (`on_failure`).
    pub on_failure: Vec<CompiledStep>,
    /// Which steps each step needs.
    pub graph: Graph,
    /// Step indexes by name.
    by_name: std::collections::HashMap<String, usize>,
    pub output: Vec<Assignment>,
    pub verdict: Option<Expression>,
    /// Regular expressions its schemas compiled (`pattern`, `patternProperties`).
    patterns: usize,
}

impl CompiledWorkflow {
    /// What this compiled definition weighs in memory, about, given the
    /// length of its text: the text several times over (parsed, kept for
    /// events, as programs), and each pattern at its size limit.
    #[must_use]
    pub fn weight(&self, text_len: usize) -> usize {
        text_len
            .saturating_mul(4)
            .saturating_add(self.patterns.saturating_mul(PATTERN_SIZE_LIMIT))
    }

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
        let definition: WorkflowDefinition =
            serde_json::from_value(document.clone()).map_err(|e| InvalidDefinition {
                problems: vec![DefinitionProblem {
                    step: None,
                    field: "document".into(),
                    message: e.to_string(),
                }],
            })?;
        let mut problems = Problems::default();
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
        if !problems.0.is_empty() {
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
                patterns,
            }),
            _ => Err(InvalidDefinition {
                problems: problems.0,
            }),
        }
    }

    /// The step at `index`.
    #[must_use]
    pub fn step(&self, index: usize) -> Option<&CompiledStep> {
        self.steps.get(index)
    }

    /// The step at `index` counting the steps, then the `on_failure`
    /// steps after them (the index a compensation step is called by).
    ///
    /// # Panics
    /// `index` is past both lists.
    #[must_use]
    pub fn step_at(&self, index: usize) -> &CompiledStep {
        self.steps
            .get(index)
            .unwrap_or_else(|| &self.on_failure[index - self.steps.len()])
    }

    /// The index of the step called `name`.
    #[must_use]
    pub fn step_index(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The run layout a worker must read to run this definition
    /// (`runs::READER_LEVEL`).
    #[must_use]
    pub fn reader_level(&self) -> i16 {
        if self.steps.iter().any(|s| s.for_each.is_some()) {
            flotilla_store::runs::FOR_EACH_READER_LEVEL
        } else if self.definition.steps.iter().any(|s| s.start.is_some()) {
            flotilla_store::runs::CHILD_READER_LEVEL
        } else if self.waits_for_signals() {
            flotilla_store::runs::SIGNAL_READER_LEVEL
        } else if self.uses_graph_fields() {
            flotilla_store::runs::GRAPH_READER_LEVEL
        } else {
            0
        }
    }

    /// Whether any step waits for a signal.
    #[must_use]
    pub fn waits_for_signals(&self) -> bool {
        self.definition.steps.iter().any(|s| s.wait_for.is_some())
    }

    /// Whether the definition says anything a chain of steps cannot
    /// (`needs`, `when`, `parallelism`): such a run waits for a worker
    /// that reads graphs.
    #[must_use]
    pub fn uses_graph_fields(&self) -> bool {
        self.definition.parallelism.is_some()
            || self.definition.steps.iter().any(|step| {
                step.needs.is_some()
                    || step.when.is_some()
                    || step.is_timer()
                    || step.for_each.is_some()
            })
    }

    /// What step `index` reads as `steps`: the responses of its ancestors
    /// among `ended` (a skipped step has none).
    #[must_use]
    pub fn steps_in_scope(&self, index: usize, ended: &Map<String, Json>) -> Map<String, Json> {
        ended
            .iter()
            .filter(|(name, _)| {
                self.step_index(name)
                    .is_some_and(|j| self.graph.is_ancestor(j, index))
            })
            .map(|(name, response)| (name.clone(), response.clone()))
            .collect()
    }

    /// Checks `input` against the input schema.
    ///
    /// # Errors
    /// Every violation, each with its location in the input.
    pub fn check_input(&self, input: &Json) -> Result<(), Vec<String>> {
        schema_violations(&self.input_schema, input)
    }
}

/// Every way `value` breaks `schema`, as `<path>: <message>`.
///
/// # Errors
/// The violations, when there are any.
/// At most [`MAX_VIOLATIONS`] are listed, then a last line saying more
/// were found.
pub fn schema_violations(schema: &jsonschema::Validator, value: &Json) -> Result<(), Vec<String>> {
    let mut errors = schema.iter_errors(value);
    let mut violations: Vec<String> = errors
        .by_ref()
        .take(MAX_VIOLATIONS)
        .map(|e| {
            let at = e.instance_path().to_string();
            if at.is_empty() {
                e.to_string()
            } else {
                format!("{at}: {e}")
            }
        })
        .collect();
    if errors.next().is_some() {
        violations.push(format!(
            "(more violations; the first {MAX_VIOLATIONS} are listed)"
        ));
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(violations)
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
            if let Some(problem) = limits::method_problem(&step.method) {
                self.add(at, "method", problem);
            }
        }
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
        })
    }

    /// A compensation (`on_failure`) step is a plain call, run in list
    /// order once the job is headed to end FAILED or DEAD.
    fn compensation_shape(&mut self, step: &StepDefinition) {
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
    fn timer_shape(&mut self, at: Option<&str>, step: &StepDefinition) {
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
    fn wait_shape(&mut self, at: Option<&str>, step: &StepDefinition, signal: &str) {
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
    fn start_shape(&mut self, at: Option<&str>, step: &StepDefinition, start: &StartChild) {
        if start.workflow.trim().is_empty() {
            self.add(at, "start.workflow", "is blank");
        }
        self.calls_nothing(
            at,
            step,
            "a start step (its child's input is built by start.input)",
        );
    }

    /// A step that calls no target (`what`: a wait or a start) has none of
    /// a call's fields, nor another kind's.
    fn calls_nothing(&mut self, at: Option<&str>, step: &StepDefinition, what: &str) {
        let fields = [
            ("target", !step.target.is_empty()),
            ("method", !step.method.is_empty()),
            ("rules", !step.rules.is_empty()),
            ("completion", step.completion.is_some()),
            ("timeout_ms", step.timeout_ms.is_some()),
            ("for_each", step.for_each.is_some()),
            ("paged", step.paged),
            ("wait_for", step.wait_for.is_some() && step.start.is_some()),
        ];
        for (name, present) in fields {
            if present {
                self.add(at, name, format!("{what} calls no target: it has no target, method, rules, completion, timeout_ms, for_each or paged, and is not both a wait_for and a start"));
            }
        }
    }

    /// A `sleep`: a duration (`30m`, `2s`) above zero and at most a year.
    fn sleep(&mut self, at: Option<&str>, text: &str) -> Option<std::time::Duration> {
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
    fn reads_outside_needs(
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
                }));
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
    fn count(&mut self, step: Option<&str>, field: &str, count: usize) -> bool {
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

    fn schema(
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

    fn expression(&mut self, step: Option<&str>, field: &str, source: &str) -> Option<Expression> {
        match Expression::compile(source) {
            Ok(expression) => Some(expression),
            Err(e) => {
                self.add(step, field, format!("CEL does not compile: {e}"));
                None
            }
        }
    }

    fn assignments(
        &mut self,
        step: Option<&str>,
        field: &str,
        sources: &[String],
    ) -> Vec<Assignment> {
        let mut assignments = Vec::with_capacity(sources.len());
        for (i, source) in sources.iter().enumerate() {
            let field = format!("{field}[{i}]");
            let Some((path, expression)) = split_assignment(source) else {
                self.add(
                    step,
                    &field,
                    format!("{source:?} is not an assignment `field = <CEL expression>`"),
                );
                continue;
            };
            let Some(path) = field_path(path) else {
                self.add(
                    step,
                    &field,
                    format!("left-hand side {path:?} is not a field path like `customer.id`"),
                );
                continue;
            };
            if let Some(expression) = self.expression(step, &field, expression) {
                assignments.push(Assignment { path, expression });
            }
        }
        assignments
    }
}

/// Splits `lhs = rhs` at the first `=` that is not part of `==`, `!=`, `<=` or `>=`.
fn split_assignment(source: &str) -> Option<(&str, &str)> {
    let bytes = source.as_bytes();
    let at = (0..bytes.len()).find(|&i| {
        bytes[i] == b'='
            && bytes.get(i + 1) != Some(&b'=')
            && !matches!(
                i.checked_sub(1).map(|p| bytes[p]),
                Some(b'=' | b'!' | b'<' | b'>')
            )
    })?;
    let (lhs, rhs) = (source[..at].trim(), source[at + 1..].trim());
    (!rhs.is_empty()).then_some((lhs, rhs))
}

/// `a.b_c.d` as its segments, when every segment is an identifier.
fn field_path(path: &str) -> Option<Vec<String>> {
    let segments: Vec<String> = path.split('.').map(str::to_owned).collect();
    let identifier = |s: &String| {
        let mut chars = s.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    segments.iter().all(identifier).then_some(segments)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignments_split_at_the_assigning_equals_sign() {
        assert_eq!(split_assignment("a.b = x == 1"), Some(("a.b", "x == 1")));
        assert_eq!(split_assignment("ok = a != b"), Some(("ok", "a != b")));
        assert_eq!(split_assignment("x == 1"), None);
        assert_eq!(split_assignment("x = "), None);
        assert_eq!(split_assignment("x <= 1"), None);
    }

    #[test]
    fn field_paths_are_dotted_identifiers() {
        assert_eq!(
            field_path("customer.id"),
            Some(vec!["customer".into(), "id".into()])
        );
        assert_eq!(field_path("_x1"), Some(vec!["_x1".into()]));
        assert_eq!(field_path("a..b"), None);
        assert_eq!(field_path("a[0]"), None);
        assert_eq!(field_path("1a"), None);
        assert_eq!(field_path(""), None);
    }

    fn definition(input_schema: &Json) -> Json {
        serde_json::json!({
            "name": "w",
            "input_schema": input_schema,
            "steps": [{"name": "s", "target": "t", "method": "m"}]
        })
    }

    fn compile(document: &Json) -> Result<CompiledWorkflow, InvalidDefinition> {
        CompiledWorkflow::compile(document, &["t".to_owned()].into())
    }

    /// `^(a+)+$` against `aaaa…a!` takes a backtracking engine exponential
    /// time; the linear-time engine answers at once (the test's own
    /// timeout is the bound).
    #[test]
    fn a_catastrophic_pattern_validates_in_linear_time() {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {
                "s": {"type": "string", "pattern": "^(a+)+$"},
                "m": {"type": "object", "patternProperties": {"^(x+x+)+y$": {"type": "integer"}}}
            }
        });
        let compiled = compile(&definition(&schema)).unwrap();
        let hostile = format!("{}!", "a".repeat(100_000));
        let key = format!("{}z", "x".repeat(10_000));
        let input = serde_json::json!({"s": hostile, "m": {key: "not checked"}});
        let violations = compiled.check_input(&input).unwrap_err();
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].starts_with("/s:"), "{violations:?}");
    }

    #[test]
    fn a_pattern_that_needs_backtracking_is_refused_at_registration() {
        for pattern in [r"^(a)\1$", "^(?=a)a$", "^(?<!b)a$"] {
            let schema = serde_json::json!({"type": "string", "pattern": pattern});
            let refused = compile(&definition(&schema)).unwrap_err();
            assert_eq!(refused.problems[0].field, "input_schema", "{pattern}");
        }
    }

    #[test]
    fn violations_are_listed_up_to_the_cap() {
        let schema = serde_json::json!({"type": "array", "items": {"type": "integer"}});
        let compiled = compile(&definition(&schema)).unwrap();
        let input = serde_json::json!(vec!["x"; 1000]);
        let violations = compiled.check_input(&input).unwrap_err();
        assert_eq!(violations.len(), MAX_VIOLATIONS + 1);
        assert!(violations[MAX_VIOLATIONS].contains("more violations"));
    }

    #[test]
    fn a_definition_over_its_limits_is_refused_naming_each() {
        let step =
            |i: usize| serde_json::json!({"name": format!("s{i}"), "target": "t", "method": "m"});
        let many_steps = serde_json::json!({
            "name": "w", "input_schema": {},
            "steps": (0..=MAX_STEPS).map(step).collect::<Vec<_>>()
        });
        let refused = compile(&many_steps).unwrap_err();
        assert!(
            refused.problems.iter().any(|p| p.field == "steps"),
            "{refused}"
        );

        let many_rules = serde_json::json!({
            "name": "w", "input_schema": {},
            "steps": [{"name": "s", "target": "t", "method": "m",
                "rules": (0..=MAX_RULES).map(|i| format!("f{i} = 1")).collect::<Vec<_>>()}]
        });
        let refused = compile(&many_rules).unwrap_err();
        assert!(
            refused
                .problems
                .iter()
                .any(|p| p.field == "rules and validate"),
            "{refused}"
        );

        let huge_schema = serde_json::json!({"description": "d".repeat(limits::MAX_SCHEMA_BYTES)});
        let refused = compile(&definition(&huge_schema)).unwrap_err();
        assert_eq!(refused.problems[0].field, "input_schema", "{refused}");
    }

    fn graph(steps: &serde_json::Value) -> serde_json::Value {
        serde_json::json!({"name": "w", "input_schema": {}, "steps": steps})
    }

    fn problems(refused: &InvalidDefinition) -> Vec<(String, String, String)> {
        refused
            .problems
            .iter()
            .map(|p| {
                (
                    p.step.clone().unwrap_or_default(),
                    p.field.clone(),
                    p.message.clone(),
                )
            })
            .collect()
    }

    /// A list written before graphs keeps its meaning: each step reads
    /// every earlier one, as a chain.
    #[test]
    fn a_list_reads_every_earlier_step() {
        let compiled = compile(&graph(&serde_json::json!([
            {"name": "a", "target": "t", "method": "m"},
            {"name": "b", "target": "t", "method": "m"},
            {"name": "c", "target": "t", "method": "m",
             "rules": ["x = steps.a.n + steps['b'].n"], "when": "has(steps.a)"},
        ])))
        .unwrap();
        assert!(compiled.graph.is_chain());
    }

    #[test]
    fn an_expression_naming_a_step_it_does_not_need_is_refused_naming_both() {
        let refused = compile(&graph(&serde_json::json!([
            {"name": "a", "target": "t", "method": "m", "needs": []},
            {"name": "b", "target": "t", "method": "m", "needs": []},
            {"name": "c", "target": "t", "method": "m", "needs": ["a"],
             "rules": ["x = steps.a.n", "y = steps.b.n"], "validate": ["steps.ghost.ok"],
             "when": "steps.c.n > 1"},
        ])))
        .unwrap_err();
        assert_eq!(
            problems(&refused),
            [
                ("c".into(), "rules[1]".into(), "reads steps.b, which it does not need (a step reads only the steps that end before it: add it to needs)".into()),
                ("c".into(), "validate[0]".into(), "reads steps.ghost, which is no step".into()),
                ("c".into(), "when".into(), "reads steps.c, which it does not need (a step reads only the steps that end before it: add it to needs)".into()),
            ]
        );
    }

    #[test]
    fn cycles_bad_needs_a_when_that_is_no_boolean_and_parallelism_out_of_range_are_refused() {
        let mut definition = graph(&serde_json::json!([
            {"name": "a", "target": "t", "method": "m", "needs": ["b"]},
            {"name": "b", "target": "t", "method": "m", "needs": ["a"]},
            {"name": "c", "target": "t", "method": "m", "needs": ["nowhere"], "when": "input.n + 1"},
            {"name": "d", "target": "t", "method": "m", "needs": [], "when": "input.n >"},
            {"name": "e".repeat(129), "target": "t", "method": "m", "needs": []},
            {"name": "nap", "sleep": "soon", "needs": []},
            {"name": "each", "target": "t", "method": "m", "needs": [], "for_each": "input.n > 1", "max_items": 0},
            {"name": "wait", "until": "input.at", "sleep": "0s", "target": "t", "needs": []},
        ]));
        definition["parallelism"] = serde_json::json!(0);
        let refused = compile(&definition).unwrap_err();
        let found = problems(&refused);
        for expected in [
            ("", "parallelism", "must be 1 to 64, got 0"),
            ("a", "needs", "is on a cycle of needs"),
            ("b", "needs", "is on a cycle of needs"),
            ("c", "needs", "needs \"nowhere\", which is no step"),
            ("c", "when", "is arithmetic, not a boolean"),
            (
                &"e".repeat(129),
                "name",
                "129 bytes long, over the limit of 128",
            ),
        ] {
            assert!(
                found.contains(&(expected.0.into(), expected.1.into(), expected.2.into())),
                "{expected:?} not in {found:?}"
            );
        }
        for (at, field, starts) in [
            ("d", "when", "CEL does not compile"),
            ("nap", "sleep", "not a duration such as 30m or 2s"),
        ] {
            assert!(
                found.iter().any(|(step, f, message)| step == at
                    && f == field
                    && message.starts_with(starts)),
                "{at} {field} {starts}: {found:?}"
            );
        }
    }
}
