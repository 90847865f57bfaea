//! Workflow definitions: the JSON document a user writes, and its compiled
//! form that the engine runs.
//!
//! A definition is parsed, then compiled: every CEL expression and JSON
//! Schema is compiled once, and every problem found is reported together,
//! each naming its step and field (see [`compile`]).

pub mod compile;
pub mod expr;
mod model;

pub use compile::{CompiledStep, CompiledWorkflow, DefinitionProblem, InvalidDefinition};
pub use model::{Completion, StepDefinition, WorkflowDefinition};
