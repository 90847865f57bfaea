//! Workflow definitions: the JSON document a user writes, and its compiled
//! form that the engine runs.
//!
//! A definition is parsed, then compiled: every CEL expression and JSON
//! Schema is compiled once, and every problem found is reported together,
//! each naming its step and field (see [`validate`]).

pub mod expr;
mod model;
pub mod validate;

pub use model::{Completion, StepDefinition, WorkflowDefinition};
pub use validate::{CompiledStep, CompiledWorkflow, DefinitionProblem, InvalidDefinition};
