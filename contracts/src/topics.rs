//! The default names of the topics and the consumer group, and the default
//! size limit of a record (each spelled once, here); every one is
//! configurable in the binaries.

/// Where clients produce `WorkflowRunRequest`s.
pub const REQUEST_TOPIC: &str = "workflow-run-requests";
/// Where the relay publishes `WorkflowRunEvent`s, keyed by job id.
pub const EVENT_TOPIC: &str = "workflow-run-events";
/// Where clients produce `WorkflowRunSignal`s, keyed by job id.
pub const SIGNAL_TOPIC: &str = "workflow-run-signals";
/// The workers' consumer group on the request topic.
pub const CONSUMER_GROUP: &str = "flotilla-worker";

/// The dead-letter topic of a request topic: `<request topic>.dlq`.
#[must_use]
pub fn dead_letter_topic(request_topic: &str) -> String {
    format!("{request_topic}.dlq")
}

/// The largest record the relay sends by default (Kafka's own default
/// `message.max.bytes` is about the same); workers refuse results whose
/// event would not fit.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 1_000_000;
