//! `flotilla-worker`: a fleet member. The library holds the run engine
//! ([`engine`]), its targets and workflow definitions, the request consumer
//! ([`consumer`]) and the HTTP API ([`api`]); [`startup`] builds and runs
//! them together, and the binary is a thin shell over it (and over
//! [`group_offsets`], its `offsets set`). SQL lives in
//! `flotilla-store`, what every binary shares in `flotilla-runtime`.

pub mod api;
pub mod config;
pub mod consumer;
pub mod engine;
pub mod group_offsets;
pub mod startup;
pub mod target;
#[cfg(feature = "test-support")]
pub mod test_support;
pub mod workflow;

pub use config::WorkerConfig;
pub use startup::{Application, StartupError};
