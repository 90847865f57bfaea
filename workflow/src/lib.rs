//! `flotilla-workflow`: the definition language. The JSON document a user
//! writes ([`WorkflowDefinition`]), its compiled form the engine runs
//! ([`CompiledWorkflow`]), the CEL expressions in it ([`expr`]) and their
//! cost budget ([`budget`]), the graph of its steps ([`Graph`]) and which
//! of them may start next ([`Frontier`]).
//!
//! A definition is parsed, then compiled: every CEL expression and JSON
//! Schema is compiled once, and every problem found is reported together,
//! each naming its step and field (see [`CompiledWorkflow::compile`]).
//!
//! This crate does no IO: no runtime, database, broker or HTTP client is
//! among its dependencies, so the CLI can check a definition offline and
//! its tests run in milliseconds.

pub mod budget;
mod compile;
mod compiled;
pub mod expr;
mod frontier;
pub mod graph;
pub mod http;
pub mod limits;
mod model;
mod references;
pub mod retry;
pub mod schema;
pub mod unchanged;

pub use budget::{Budget, DEFAULT_BUDGET, Exhausted};
pub use compiled::{
    Assignment, CompiledRepeat, CompiledStep, CompiledWorkflow, DefinitionProblem,
    InvalidDefinition, MAX_SLEEP, Timer, assemble, schema_violations,
};
pub use frontier::Frontier;
pub use graph::Graph;
pub use model::{
    Completion, Concurrency, DEFAULT_MAX_ITEMS, DEFAULT_MAX_PAGES, DEFAULT_PARALLELISM, Debounce,
    MAX_ATTEMPTS, MAX_DEADLINE_MS, MAX_ITEMS, MAX_PAGES, MAX_PARALLELISM, OnExcess, OnTimeout,
    Repeat, StartChild, StepDefinition, Verb, WorkflowDefinition,
};
pub use retry::{FailureMatch, RetryPolicy, StepRetry};

/// A definition document from its text: JSON, or YAML (which JSON is a
/// part of), as a definitions directory, the CLI and the API's callers
/// write it.
///
/// # Errors
/// The text is neither, with where it stops being either.
pub fn read_document(text: &str) -> Result<serde_json::Value, String> {
    serde_yaml_ng::from_str(text).map_err(|e| e.to_string())
}
