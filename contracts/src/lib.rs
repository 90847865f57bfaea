//! Flotilla's wire contract: the messages that cross Kafka, their Avro
//! schemas, their JSON and Avro encodings, and the rules every message obeys.
//!
//! This crate does no IO (no tokio, rdkafka or sqlx in its tree) so that any
//! producer or consumer can depend on it. Talking to a Schema Registry lives in
//! `flotilla-codec`; here Avro is encoded against the embedded schemas and
//! framed with a schema id the caller supplies.

pub mod avro;
mod error;
mod event;
mod event_type;
pub mod framing;
pub mod json;
pub mod metadata;
mod request;
mod rules;
mod signal;
mod step;
pub mod topics;

pub use error::DecodeError;
pub use event::{
    COMPENSATION, EventHeader, SKIPPED, TIMED_OUT, WorkflowRunEvent, WorkflowRunEventType,
};
pub use metadata::Metadata;
pub use request::WorkflowRunRequest;
pub use rules::MAX_PRIORITY;
pub use rules::RuleViolation;
pub use signal::WorkflowRunSignal;
pub use step::{StepRequestParts, WorkflowStepReply, WorkflowStepRequest, headers as step_headers};

/// A message type of the contract: it knows its Avro schema and its rules.
pub trait Message: Sized + serde::Serialize + serde::de::DeserializeOwned {
    /// The record's full Avro name, e.g. `io.flotilla.v1.WorkflowRunEvent`.
    const AVRO_NAME: &'static str;

    /// The `.avsc` text embedded at build time.
    fn schema_text() -> &'static str;

    /// Checks the message rules.
    ///
    /// # Errors
    /// The first rule the message breaks.
    fn check_rules(&self) -> Result<(), RuleViolation>;
}
