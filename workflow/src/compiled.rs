//! A definition ready to run: the compiled types the engine reads, and
//! the JSON Schema check every input and answer goes through.

use std::fmt;

use serde_json::{Map, Value as Json};

use crate::expr::{Expression, Scope};
use crate::graph::Graph;
use crate::limits::{MAX_VIOLATIONS, PATTERN_SIZE_LIMIT};
use crate::model::{StepDefinition, WorkflowDefinition};

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
    /// Its HTTP call's verb, path, query and headers, when it names any.
    pub call_shape: Option<crate::http::CallShape>,
    /// How it polls, when it repeats.
    pub repeat: Option<CompiledRepeat>,
    /// Its retry policy, the workflow's filling its gaps.
    pub retry: crate::retry::StepRetry,
}

/// A `repeat`, compiled.
#[derive(Debug)]
pub struct CompiledRepeat {
    pub until: Expression,
    pub every: std::time::Duration,
    pub for_at_most: std::time::Duration,
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
    pub(crate) by_name: std::collections::HashMap<String, usize>,
    pub output: Vec<Assignment>,
    pub verdict: Option<Expression>,
    /// The debounce key's expression, over `input`.
    pub debounce_key: Option<Expression>,
    /// The concurrency key's expression, over `input`.
    pub concurrency_key: Option<Expression>,
    /// Regular expressions its schemas compiled (`pattern`, `patternProperties`).
    pub(crate) patterns: usize,
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

/// Builds a JSON object (a request, a child's input, a job's result) by
/// evaluating each assignment into its field path.
///
/// # Errors
/// An expression fails, or two assignments set a field inside a non-object.
pub fn assemble(assignments: &[Assignment], scope: &Scope) -> Result<Json, String> {
    let mut document = Json::Object(Map::new());
    for assignment in assignments {
        let value = assignment.expression.evaluate(scope)?;
        let mut at = &mut document;
        let (last, parents) = assignment.path.split_last().ok_or("empty field path")?;
        for segment in parents {
            let object = at
                .as_object_mut()
                .ok_or_else(|| format!("{segment} is set to a non-object earlier"))?;
            at = object
                .entry(segment.clone())
                .or_insert_with(|| Json::Object(Map::new()));
        }
        at.as_object_mut()
            .ok_or_else(|| {
                format!(
                    "{} is set to a non-object earlier",
                    assignment.path.join(".")
                )
            })?
            .insert(last.clone(), value);
    }
    Ok(document)
}
