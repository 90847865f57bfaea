//! Workflow definitions: the JSON document a user writes, and its compiled
//! form that the engine runs.
//!
//! A definition is parsed, then compiled: every CEL expression and JSON
//! Schema is compiled once, and every problem found is reported together,
//! each naming its step and field (see [`compile`]).

pub mod budget;
pub mod compile;
pub mod expr;
pub mod graph;
pub mod limits;
mod model;
mod reads;

pub use budget::{Budget, DEFAULT_BUDGET, Exhausted};
pub use compile::{CompiledStep, CompiledWorkflow, DefinitionProblem, InvalidDefinition, Timer};
pub use graph::Graph;
pub use model::{
    Completion, DEFAULT_MAX_ITEMS, DEFAULT_MAX_PAGES, DEFAULT_PARALLELISM, MAX_ATTEMPTS,
    MAX_DEADLINE_MS, MAX_ITEMS, MAX_PAGES, MAX_PARALLELISM, StartChild, StepDefinition,
    WorkflowDefinition,
};
