//! What callers ask of the engine, one operation per file: the API and
//! ingest submit (`submit.rs`, `batch.rs`), signal, complete a step,
//! graft, retry and cancel (`operator/`, by filter in `operator/bulk.rs`),
//! register definitions, keep schedules, record Kafka replies, read jobs,
//! graphs, children and the fleet, and wait for a job to finish
//! (`awaiting.rs`).
//! Operations never import the step executors (`nodes/`).

pub mod awaiting;
pub(crate) mod batch;
pub mod children;
pub(crate) mod complete_step;
pub(crate) mod definitions;
pub(crate) mod fleet;
pub(crate) mod graft;
pub mod graph_view;
pub(crate) mod operator;
pub use operator::bulk;
pub(crate) mod queries;
pub mod reply;
pub mod schedules;
pub mod signal;
pub(crate) mod submit;
