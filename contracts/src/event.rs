//! `WorkflowRunEvent`: one committed state change of a job.
//!
//! Events are built only through the typed constructors, which enforce the
//! rules; decoding re-checks them, so a rule-breaking event can neither be
//! produced by Flotilla nor slip in from the wire.

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::rules::{check_uuid, check_workflow_name, non_blank};
use crate::{Message, Metadata, RuleViolation};

pub use crate::event_type::WorkflowRunEventType;

/// The verdict of a STEP_CHECKPOINT event whose step was skipped.
pub const SKIPPED: &str = "skipped";
/// The verdict of a STEP_CHECKPOINT event of a wait that ran past its
/// `timeout_ms` and was ended by its `on_timeout`.
pub const TIMED_OUT: &str = "timed out";
/// The verdict of a STEP_CHECKPOINT event of a compensation step.
pub const COMPENSATION: &str = "compensation";

/// The fields every event carries, whatever its type.
#[derive(Debug, Clone, PartialEq)]
pub struct EventHeader {
    pub event_id: Uuid,
    pub job_id: Uuid,
    pub sequence: i64,
    pub workflow_name: String,
    pub attempt: i32,
    pub occurred_at: DateTime<Utc>,
}

/// One state change of a job, as published to the event topic.
///
/// Unlike the messages the fleet consumes, an event's JSON decoder ignores
/// fields it does not know: events only grow by optional fields, and a
/// consumer built before one was added must go on reading (as Avro's
/// schema resolution does for the same change).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowRunEvent {
    event_id: Uuid,
    job_id: Uuid,
    sequence: i64,
    #[serde(rename = "type")]
    event_type: WorkflowRunEventType,
    workflow_name: String,
    attempt: i32,
    #[serde(default)]
    step_name: Option<String>,
    #[serde(default)]
    verdict: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    result: Option<serde_json::Value>,
    #[serde(with = "micros")]
    occurred_at: DateTime<Utc>,
    /// The version of the workflow the job runs; absent for a job that
    /// keeps its own copy of the definition (rows from before versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    workflow_version: Option<i32>,
    /// The job's metadata, as its request gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    metadata: Option<Metadata>,
}

/// Optional fields of an event, set by the constructors.
#[derive(Default)]
struct Body {
    step_name: Option<String>,
    verdict: Option<String>,
    error: Option<String>,
    result: Option<serde_json::Value>,
}

impl WorkflowRunEvent {
    fn build(
        header: EventHeader,
        event_type: WorkflowRunEventType,
        body: Body,
    ) -> Result<Self, RuleViolation> {
        let occurred_at = truncate_to_micros(header.occurred_at);
        let header = EventHeader {
            occurred_at,
            ..header
        };
        let event = Self::from_parts(
            header,
            event_type,
            body.step_name,
            body.verdict,
            body.error,
            body.result,
        );
        event.check_rules()?;
        Ok(event)
    }

    /// Reassembles a decoded event; the caller checks the rules.
    pub(crate) fn from_parts(
        header: EventHeader,
        event_type: WorkflowRunEventType,
        step_name: Option<String>,
        verdict: Option<String>,
        error: Option<String>,
        result: Option<serde_json::Value>,
    ) -> Self {
        Self {
            event_id: header.event_id,
            job_id: header.job_id,
            sequence: header.sequence,
            event_type,
            workflow_name: header.workflow_name,
            attempt: header.attempt,
            step_name,
            verdict,
            error,
            result,
            occurred_at: header.occurred_at,
            workflow_version: None,
            metadata: None,
        }
    }

    /// The same event, carrying its job's metadata (an empty map is none).
    ///
    /// # Errors
    /// Metadata past its bounds.
    pub fn with_metadata(mut self, metadata: Option<Metadata>) -> Result<Self, RuleViolation> {
        self.metadata = metadata.filter(|m| !m.is_empty());
        self.check_rules()?;
        Ok(self)
    }

    /// The same event, stamped with the version of the workflow its job runs.
    ///
    /// # Errors
    /// A version below 1.
    pub fn with_workflow_version(mut self, version: Option<i32>) -> Result<Self, RuleViolation> {
        self.workflow_version = version;
        self.check_rules()?;
        Ok(self)
    }

    /// The job was accepted and is queued.
    ///
    /// # Errors
    /// A header that breaks a rule (nil ids, sequence below 1, blank workflow name).
    pub fn accepted(header: EventHeader) -> Result<Self, RuleViolation> {
        Self::build(header, WorkflowRunEventType::Accepted, Body::default())
    }

    /// Steps were grafted onto the job: an ACCEPTED event (the job accepted
    /// more work; no new event type, so consumers of every release read
    /// it) whose verdict is `grafted revision <n>: <steps>`.
    ///
    /// # Errors
    /// A header that breaks a rule.
    pub fn grafted(
        header: EventHeader,
        revision: i32,
        steps: &[String],
    ) -> Result<Self, RuleViolation> {
        let body = Body {
            verdict: Some(format!("grafted revision {revision}: {}", steps.join(", "))),
            ..Body::default()
        };
        Self::build(header, WorkflowRunEventType::Accepted, body)
    }

    /// The signal `name` reached the job (numbered `seq` there): an
    /// ACCEPTED event (the job accepted input; no new event type, so
    /// consumers of every release read it) whose verdict is
    /// `signal <seq> received: <name>`. The `wait_for` step that takes it
    /// later has a STEP_CHECKPOINT noted `signal <seq>`.
    ///
    /// # Errors
    /// A header that breaks a rule.
    pub fn signal_received(
        header: EventHeader,
        name: &str,
        seq: i64,
    ) -> Result<Self, RuleViolation> {
        let body = Body {
            verdict: Some(format!("signal {seq} received: {name}")),
            ..Body::default()
        };
        Self::build(header, WorkflowRunEventType::Accepted, body)
    }

    /// The step `step_name` has a checkpoint; `note` says what kind when it
    /// is not the step's answer (`skipped`, `item <n>`, `page <n>`,
    /// `compensation`, `signal <n>`) and becomes the event's verdict.
    ///
    /// # Errors
    /// A contract rule the values break.
    pub fn step_checkpoint(
        header: EventHeader,
        step_name: impl Into<String>,
        note: Option<String>,
    ) -> Result<Self, RuleViolation> {
        let body = Body {
            step_name: Some(step_name.into()),
            verdict: note,
            ..Body::default()
        };
        Self::build(header, WorkflowRunEventType::StepCheckpoint, body)
    }

    /// The job waits on the timer step `step_name` until `until`: a
    /// WAITING event whose verdict is `sleeping until <RFC 3339 instant>`.
    ///
    /// # Errors
    /// A contract rule the values break.
    pub fn sleeping(
        header: EventHeader,
        step_name: impl Into<String>,
        until: DateTime<Utc>,
    ) -> Result<Self, RuleViolation> {
        let body = Body {
            step_name: Some(step_name.into()),
            verdict: Some(format!(
                "sleeping until {}",
                until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
            )),
            ..Body::default()
        };
        Self::build(header, WorkflowRunEventType::Waiting, body)
    }

    /// The job is parked on the external step `step_name`.
    ///
    /// # Errors
    /// A blank step name or a header that breaks a rule.
    pub fn waiting(
        header: EventHeader,
        step_name: impl Into<String>,
    ) -> Result<Self, RuleViolation> {
        let body = Body {
            step_name: Some(step_name.into()),
            ..Body::default()
        };
        Self::build(header, WorkflowRunEventType::Waiting, body)
    }

    /// The job finished with `verdict` (non-empty) and `result`.
    ///
    /// # Errors
    /// An empty verdict or a header that breaks a rule.
    pub fn completed(
        header: EventHeader,
        verdict: impl Into<String>,
        result: serde_json::Value,
    ) -> Result<Self, RuleViolation> {
        // A JSON null result is no result, so both encodings agree on it.
        let body = Body {
            verdict: Some(verdict.into()),
            result: (!result.is_null()).then_some(result),
            ..Body::default()
        };
        Self::build(header, WorkflowRunEventType::Completed, body)
    }

    /// The job failed (a verdict or a defect); `error` is carried verbatim.
    ///
    /// # Errors
    /// An empty error or a header that breaks a rule.
    pub fn failed(
        header: EventHeader,
        error: impl Into<String>,
        verdict: Option<String>,
    ) -> Result<Self, RuleViolation> {
        let body = Body {
            error: Some(error.into()),
            verdict,
            ..Body::default()
        };
        Self::build(header, WorkflowRunEventType::Failed, body)
    }

    /// The job ran out of attempts; `error` is the last one, verbatim.
    ///
    /// # Errors
    /// An empty error or a header that breaks a rule.
    pub fn dead(header: EventHeader, error: impl Into<String>) -> Result<Self, RuleViolation> {
        let body = Body {
            error: Some(error.into()),
            ..Body::default()
        };
        Self::build(header, WorkflowRunEventType::Dead, body)
    }

    /// An operator cancelled the job; `reason` is carried as the error.
    ///
    /// # Errors
    /// An empty reason or a header that breaks a rule.
    pub fn cancelled(
        header: EventHeader,
        reason: impl Into<String>,
    ) -> Result<Self, RuleViolation> {
        let body = Body {
            error: Some(reason.into()),
            ..Body::default()
        };
        Self::build(header, WorkflowRunEventType::Cancelled, body)
    }

    #[must_use]
    pub fn event_id(&self) -> Uuid {
        self.event_id
    }
    #[must_use]
    pub fn job_id(&self) -> Uuid {
        self.job_id
    }
    #[must_use]
    pub fn sequence(&self) -> i64 {
        self.sequence
    }
    #[must_use]
    pub fn event_type(&self) -> WorkflowRunEventType {
        self.event_type
    }
    #[must_use]
    pub fn workflow_name(&self) -> &str {
        &self.workflow_name
    }
    #[must_use]
    pub fn attempt(&self) -> i32 {
        self.attempt
    }
    #[must_use]
    pub fn step_name(&self) -> Option<&str> {
        self.step_name.as_deref()
    }
    #[must_use]
    pub fn verdict(&self) -> Option<&str> {
        self.verdict.as_deref()
    }
    #[must_use]
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }
    #[must_use]
    pub fn result(&self) -> Option<&serde_json::Value> {
        self.result.as_ref()
    }
    #[must_use]
    pub fn occurred_at(&self) -> DateTime<Utc> {
        self.occurred_at
    }
    /// The version of the workflow the job runs, when the job has one.
    #[must_use]
    pub fn workflow_version(&self) -> Option<i32> {
        self.workflow_version
    }
    /// The job's metadata, when its request gave some.
    #[must_use]
    pub fn metadata(&self) -> Option<&Metadata> {
        self.metadata.as_ref()
    }
}

impl Message for WorkflowRunEvent {
    const AVRO_NAME: &'static str = "io.flotilla.v1.WorkflowRunEvent";

    fn schema_text() -> &'static str {
        include_str!("../schemas/WorkflowRunEvent.avsc")
    }

    fn check_rules(&self) -> Result<(), RuleViolation> {
        use WorkflowRunEventType as T;
        check_uuid("event_id", &self.event_id)?;
        check_uuid("job_id", &self.job_id)?;
        check_workflow_name(&self.workflow_name)?;
        if self.sequence < 1 {
            return Err(RuleViolation::SequenceBelowOne(self.sequence));
        }
        if self.attempt < 0 {
            return Err(RuleViolation::NegativeAttempt(self.attempt));
        }
        if let Some(version) = self.workflow_version.filter(|v| *v < 1) {
            return Err(RuleViolation::VersionBelowOne(version));
        }
        if let Some(metadata) = &self.metadata {
            crate::metadata::check(metadata)?;
        }
        let present = |field: &Option<String>| field.as_deref().is_some_and(non_blank);
        match self.event_type {
            T::Unspecified => Err(RuleViolation::UnspecifiedType),
            T::Completed if !present(&self.verdict) => Err(RuleViolation::CompletedWithoutVerdict),
            T::Failed | T::Dead | T::Cancelled if !present(&self.error) => {
                Err(RuleViolation::TerminalWithoutError {
                    event_type: self.event_type.as_str(),
                })
            }
            T::StepCheckpoint | T::Waiting if !present(&self.step_name) => {
                Err(RuleViolation::StepEventWithoutStep {
                    event_type: self.event_type.as_str(),
                })
            }
            _ => Ok(()),
        }
    }
}

/// Avro carries microseconds; truncating up front makes every encoding lossless.
fn truncate_to_micros(at: DateTime<Utc>) -> DateTime<Utc> {
    at.duration_trunc(TimeDelta::microseconds(1)).unwrap_or(at)
}

/// `occurred_at` in JSON: RFC 3339 with exactly microsecond precision.
pub(crate) mod micros {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&at.to_rfc3339_opts(SecondsFormat::Micros, true))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let text = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&text)
            .map(|at| super::truncate_to_micros(at.with_timezone(&Utc)))
            .map_err(serde::de::Error::custom)
    }
}
