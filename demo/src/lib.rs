//! `flotilla-demo`: what the demo runs besides the fleet itself.
//!
//! - [`target`]: the service the sample workflows' steps call, with knobs
//!   for latency and failure rates (`flotilla-demo-target`).
//! - [`resources`]: the target's orders and exports, for the workflows
//!   that name their HTTP verb and path, and the one that polls.
//! - [`responder`]: the target's Kafka mode, a service answering step
//!   requests on a topic, as a workflow's Kafka target does.
//! - [`driver`]: produces the sample requests, answers the human steps,
//!   cancels one kind, shows progress, and checks every outcome
//!   (`flotilla-demo`).

pub mod driver;
pub mod resources;
pub mod responder;
pub mod target;
