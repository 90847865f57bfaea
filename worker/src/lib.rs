//! `flotilla-worker`: a fleet member, the binary and its wiring. [`config`]
//! reads flags and environment, [`startup`] builds the engine
//! (`flotilla-engine`), its ingest (`flotilla-ingest`) and its API
//! (`flotilla-api`) and runs them together under one shutdown grace; the
//! binary is a thin shell over it (and over [`group_offsets`], its
//! `offsets set`).
//!
//! The crates it wires are re-exported under their short names so the
//! worker's tests and benchmarks name one dependency.

pub mod config;
pub mod group_offsets;
pub mod startup;
#[cfg(feature = "test-support")]
pub mod test_support;

pub use config::WorkerConfig;
pub use flotilla_api as api;
pub use flotilla_engine as engine;
pub use flotilla_ingest as ingest;
pub use flotilla_targets as targets;
pub use flotilla_workflow as workflow;
pub use startup::{Application, StartupError};
