//! The message-level rules. Each variant names exactly one rule so that an
//! error seen in a log or a dead-letter header says which one was broken.

/// A broken message rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleViolation {
    #[error("rule broken: an event's type is never UNSPECIFIED")]
    UnspecifiedType,
    #[error("rule broken: a COMPLETED event carries a non-empty verdict")]
    CompletedWithoutVerdict,
    #[error("rule broken: a {event_type} event carries the error verbatim, and it is empty")]
    TerminalWithoutError { event_type: &'static str },
    #[error("rule broken: a {event_type} event names its step, and step_name is empty")]
    StepEventWithoutStep { event_type: &'static str },
    #[error("rule broken: sequence starts at 1, got {0}")]
    SequenceBelowOne(i64),
    #[error("rule broken: attempt is never negative, got {0}")]
    NegativeAttempt(i32),
    #[error("rule broken: workflow_name is not blank")]
    BlankWorkflowName,
    #[error("rule broken: a signal's name is not blank")]
    BlankSignalName,
    #[error("rule broken: {field} is not blank")]
    Blank { field: &'static str },
    #[error("rule broken: a step request's attempt starts at 1, got {0}")]
    AttemptBelowOne(i32),
    #[error(
        "rule broken: a step reply carries exactly one of result and error (retryable only with error)"
    )]
    ReplyNotOneOf,
    #[error("rule broken: {field} is not the nil UUID")]
    NilUuid { field: &'static str },
    #[error("rule broken: workflow_version counts from 1, got {0}")]
    VersionBelowOne(i32),
    #[error("rule broken: priority is 0 to {MAX_PRIORITY}, got {0}")]
    PriorityOutOfRange(i32),
    #[error("rule broken: metadata {0}")]
    Metadata(String),
}

/// The highest priority a request may ask for.
pub const MAX_PRIORITY: i32 = 10;

pub(crate) fn non_blank(value: &str) -> bool {
    !value.trim().is_empty()
}

pub(crate) fn check_uuid(field: &'static str, id: &uuid::Uuid) -> Result<(), RuleViolation> {
    if id.is_nil() {
        Err(RuleViolation::NilUuid { field })
    } else {
        Ok(())
    }
}

pub(crate) fn check_workflow_name(name: &str) -> Result<(), RuleViolation> {
    if non_blank(name) {
        Ok(())
    } else {
        Err(RuleViolation::BlankWorkflowName)
    }
}

pub(crate) fn check_signal_name(name: &str) -> Result<(), RuleViolation> {
    if non_blank(name) {
        Ok(())
    } else {
        Err(RuleViolation::BlankSignalName)
    }
}
