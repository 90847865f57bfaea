//! `WorkflowRunSignal`: what a client produces to tell a job something.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::rules::{check_signal_name, check_uuid};
use crate::{Message, RuleViolation};

/// The signal `name` for the job `job_id`, with its `payload` (any JSON),
/// who sent it (`source`) and an optional idempotency key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowRunSignal {
    job_id: Uuid,
    name: String,
    payload: serde_json::Value,
    #[serde(default)]
    source: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    idempotency_key: Option<String>,
}

impl WorkflowRunSignal {
    /// Builds a signal.
    ///
    /// # Errors
    /// A nil `job_id` or a blank `name`.
    pub fn new(
        job_id: Uuid,
        name: impl Into<String>,
        payload: serde_json::Value,
        source: serde_json::Value,
        idempotency_key: Option<String>,
    ) -> Result<Self, RuleViolation> {
        let signal = Self {
            job_id,
            name: name.into(),
            payload,
            source,
            idempotency_key,
        };
        signal.check_rules()?;
        Ok(signal)
    }

    #[must_use]
    pub fn job_id(&self) -> Uuid {
        self.job_id
    }

    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    #[must_use]
    pub fn payload(&self) -> &serde_json::Value {
        &self.payload
    }

    /// Who sent it; JSON `null` when not said.
    #[must_use]
    pub fn source(&self) -> &serde_json::Value {
        &self.source
    }

    #[must_use]
    pub fn idempotency_key(&self) -> Option<&str> {
        self.idempotency_key.as_deref()
    }
}

impl Message for WorkflowRunSignal {
    const AVRO_NAME: &'static str = "io.flotilla.v1.WorkflowRunSignal";

    fn schema_text() -> &'static str {
        include_str!("../schemas/WorkflowRunSignal.avsc")
    }

    fn check_rules(&self) -> Result<(), RuleViolation> {
        check_uuid("job_id", &self.job_id)?;
        check_signal_name(&self.name)
    }
}
