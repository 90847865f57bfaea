//! `WorkflowStepRequest` and `WorkflowStepReply`: a step whose target is a
//! pair of topics. The worker writes the request to the outbox when the
//! step is reached; the relay publishes it; the service answers on the
//! reply topic, naming the request's correlation id.

use chrono::DurationRound as _;
use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::rules::{check_uuid, non_blank};
use crate::{Message, RuleViolation};

/// The headers of a step request's record, beside `traceparent` and
/// `tracestate` (the step's trace) and `content-type`. The value holds the
/// same facts; the headers let a service route or drop a record unread.
pub mod headers {
    /// The job's id.
    pub const JOB_ID: &str = "flotilla.job-id";
    /// The step's name.
    pub const STEP: &str = "flotilla.step";
    /// The request's correlation id, fresh for every attempt: the reply names it.
    pub const CORRELATION_ID: &str = "flotilla.correlation-id";
    /// Where the reply goes.
    pub const REPLY_TOPIC: &str = "flotilla.reply-topic";
    /// `<job_id>:<step>`, the same for every attempt of the step.
    pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
    /// The request's deadline, RFC 3339 in UTC to the microsecond (as the
    /// value's `deadline` in JSON): a reply after it is dropped, so a
    /// service may drop a request read after it without decoding it.
    pub const DEADLINE: &str = "flotilla.deadline";
}

/// A step's request to a service listening on a topic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowStepRequest {
    job_id: Uuid,
    step_name: String,
    attempt: i32,
    correlation_id: Uuid,
    reply_topic: String,
    idempotency_key: String,
    request: serde_json::Value,
    #[serde(with = "crate::event::micros")]
    deadline: DateTime<Utc>,
}

/// What builds a [`WorkflowStepRequest`].
#[derive(Debug, Clone)]
pub struct StepRequestParts {
    pub job_id: Uuid,
    pub step_name: String,
    pub attempt: i32,
    pub correlation_id: Uuid,
    pub reply_topic: String,
    pub request: serde_json::Value,
    pub deadline: DateTime<Utc>,
}

impl WorkflowStepRequest {
    /// Builds a request; its idempotency key is `<job_id>:<step_name>`.
    ///
    /// # Errors
    /// Nil ids, a blank step name or reply topic, an attempt below 1.
    pub fn new(parts: StepRequestParts) -> Result<Self, RuleViolation> {
        let request = Self {
            idempotency_key: format!("{}:{}", parts.job_id, parts.step_name),
            job_id: parts.job_id,
            step_name: parts.step_name,
            attempt: parts.attempt,
            correlation_id: parts.correlation_id,
            reply_topic: parts.reply_topic,
            request: parts.request,
            deadline: parts
                .deadline
                .duration_trunc(TimeDelta::microseconds(1))
                .unwrap_or(parts.deadline),
        };
        request.check_rules()?;
        Ok(request)
    }

    /// Rebuilds a decoded request, its idempotency key as it came.
    pub(crate) fn from_parts(
        parts: StepRequestParts,
        idempotency_key: String,
    ) -> Result<Self, RuleViolation> {
        let mut request = Self::new(parts)?;
        request.idempotency_key = idempotency_key;
        request.check_rules()?;
        Ok(request)
    }

    #[must_use]
    pub fn job_id(&self) -> Uuid {
        self.job_id
    }
    #[must_use]
    pub fn step_name(&self) -> &str {
        &self.step_name
    }
    #[must_use]
    pub fn attempt(&self) -> i32 {
        self.attempt
    }
    #[must_use]
    pub fn correlation_id(&self) -> Uuid {
        self.correlation_id
    }
    #[must_use]
    pub fn reply_topic(&self) -> &str {
        &self.reply_topic
    }
    #[must_use]
    pub fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }
    #[must_use]
    pub fn request(&self) -> &serde_json::Value {
        &self.request
    }
    #[must_use]
    pub fn deadline(&self) -> DateTime<Utc> {
        self.deadline
    }

    /// The [`headers`] of its record, by name, in the order sent.
    #[must_use]
    pub fn headers(&self) -> [(&'static str, String); 6] {
        [
            (headers::JOB_ID, self.job_id.to_string()),
            (headers::STEP, self.step_name.clone()),
            (headers::CORRELATION_ID, self.correlation_id.to_string()),
            (headers::REPLY_TOPIC, self.reply_topic.clone()),
            (headers::IDEMPOTENCY_KEY, self.idempotency_key.clone()),
            (
                headers::DEADLINE,
                self.deadline
                    .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            ),
        ]
    }
}

impl Message for WorkflowStepRequest {
    const AVRO_NAME: &'static str = "io.flotilla.v1.WorkflowStepRequest";

    fn schema_text() -> &'static str {
        include_str!("../schemas/WorkflowStepRequest.avsc")
    }

    fn check_rules(&self) -> Result<(), RuleViolation> {
        check_uuid("job_id", &self.job_id)?;
        check_uuid("correlation_id", &self.correlation_id)?;
        for (field, value) in [
            ("step_name", &self.step_name),
            ("reply_topic", &self.reply_topic),
            ("idempotency_key", &self.idempotency_key),
        ] {
            if !non_blank(value) {
                return Err(RuleViolation::Blank { field });
            }
        }
        if self.attempt < 1 {
            return Err(RuleViolation::AttemptBelowOne(self.attempt));
        }
        Ok(())
    }
}

/// A service's answer to a [`WorkflowStepRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowStepReply {
    correlation_id: Uuid,
    job_id: Uuid,
    #[serde(default)]
    result: Option<serde_json::Value>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    retryable: bool,
}

impl WorkflowStepReply {
    /// The answer `result` to the request `correlation_id` of `job_id`.
    ///
    /// # Errors
    /// Nil ids; a `null` result (no answer).
    pub fn answer(
        job_id: Uuid,
        correlation_id: Uuid,
        result: serde_json::Value,
    ) -> Result<Self, RuleViolation> {
        Self::build(job_id, correlation_id, Some(result), None, false)
    }

    /// No answer, and why; `retryable` when trying again may succeed.
    ///
    /// # Errors
    /// Nil ids, a blank error.
    pub fn refusal(
        job_id: Uuid,
        correlation_id: Uuid,
        error: impl Into<String>,
        retryable: bool,
    ) -> Result<Self, RuleViolation> {
        Self::build(job_id, correlation_id, None, Some(error.into()), retryable)
    }

    pub(crate) fn build(
        job_id: Uuid,
        correlation_id: Uuid,
        result: Option<serde_json::Value>,
        error: Option<String>,
        retryable: bool,
    ) -> Result<Self, RuleViolation> {
        let reply = Self {
            correlation_id,
            job_id,
            // JSON `null` is no answer: it would not survive the JSON form.
            result: result.filter(|result| !result.is_null()),
            error,
            retryable,
        };
        reply.check_rules()?;
        Ok(reply)
    }

    #[must_use]
    pub fn correlation_id(&self) -> Uuid {
        self.correlation_id
    }
    #[must_use]
    pub fn job_id(&self) -> Uuid {
        self.job_id
    }
    /// The answer, when there is one (never JSON `null`).
    #[must_use]
    pub fn result(&self) -> Option<&serde_json::Value> {
        self.result.as_ref()
    }
    #[must_use]
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }
    #[must_use]
    pub fn retryable(&self) -> bool {
        self.retryable
    }
}

impl Message for WorkflowStepReply {
    const AVRO_NAME: &'static str = "io.flotilla.v1.WorkflowStepReply";

    fn schema_text() -> &'static str {
        include_str!("../schemas/WorkflowStepReply.avsc")
    }

    fn check_rules(&self) -> Result<(), RuleViolation> {
        check_uuid("job_id", &self.job_id)?;
        check_uuid("correlation_id", &self.correlation_id)?;
        match (&self.result, &self.error) {
            (Some(_), None) if !self.retryable => Ok(()),
            (None, Some(error)) if non_blank(error) => Ok(()),
            (None, Some(_)) => Err(RuleViolation::Blank { field: "error" }),
            _ => Err(RuleViolation::ReplyNotOneOf),
        }
    }
}
