//! `WorkflowRunRequest`: what a client produces to ask for a run.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::rules::{MAX_PRIORITY, check_uuid, check_workflow_name};
use crate::{Message, Metadata, RuleViolation};

/// Asks the fleet to run the stored workflow `workflow_name` on `input`.
///
/// `job_id` is chosen by the client and is the idempotency key: sending the
/// same request twice yields one job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowRunRequest {
    job_id: Uuid,
    workflow_name: String,
    input: serde_json::Value,
    /// The stored version to run; `None` runs the newest. Absent from the
    /// requests of producers older than the field, which decode as `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    workflow_version: Option<i32>,
    /// 0 to [`MAX_PRIORITY`]: a head start in the queue (see
    /// `docs/workflows.md`, "Priority"); `None` is 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    priority: Option<i32>,
    /// The caller's labels on the job (bounded, `metadata.rs`); absent
    /// from producers older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    metadata: Option<Metadata>,
}

impl WorkflowRunRequest {
    /// Builds a request.
    ///
    /// # Errors
    /// A nil `job_id` or a blank `workflow_name`.
    pub fn new(
        job_id: Uuid,
        workflow_name: impl Into<String>,
        input: serde_json::Value,
    ) -> Result<Self, RuleViolation> {
        let request = Self {
            job_id,
            workflow_name: workflow_name.into(),
            input,
            workflow_version: None,
            priority: None,
            metadata: None,
        };
        request.check_rules()?;
        Ok(request)
    }

    /// Names the stored version to run instead of the newest.
    ///
    /// # Errors
    /// A version below 1.
    pub fn with_workflow_version(mut self, version: Option<i32>) -> Result<Self, RuleViolation> {
        self.workflow_version = version;
        self.check_rules()?;
        Ok(self)
    }

    /// Asks for a head start in the queue (0 to [`MAX_PRIORITY`]).
    ///
    /// # Errors
    /// A priority out of that range.
    pub fn with_priority(mut self, priority: Option<i32>) -> Result<Self, RuleViolation> {
        self.priority = priority;
        self.check_rules()?;
        Ok(self)
    }

    /// Labels the job (an empty map is none).
    ///
    /// # Errors
    /// Metadata past its bounds.
    pub fn with_metadata(mut self, metadata: Option<Metadata>) -> Result<Self, RuleViolation> {
        self.metadata = metadata.filter(|m| !m.is_empty());
        self.check_rules()?;
        Ok(self)
    }

    /// The caller's labels on the job.
    #[must_use]
    pub fn metadata(&self) -> Option<&Metadata> {
        self.metadata.as_ref()
    }

    /// The priority asked for; `None` is 0.
    #[must_use]
    pub fn priority(&self) -> Option<i32> {
        self.priority
    }

    /// The stored version asked for; `None`: the newest.
    #[must_use]
    pub fn workflow_version(&self) -> Option<i32> {
        self.workflow_version
    }

    #[must_use]
    pub fn job_id(&self) -> Uuid {
        self.job_id
    }

    #[must_use]
    pub fn workflow_name(&self) -> &str {
        &self.workflow_name
    }

    #[must_use]
    pub fn input(&self) -> &serde_json::Value {
        &self.input
    }

    /// Gives up the input without a copy.
    #[must_use]
    pub fn into_input(self) -> serde_json::Value {
        self.input
    }
}

impl Message for WorkflowRunRequest {
    const AVRO_NAME: &'static str = "io.flotilla.v1.WorkflowRunRequest";

    fn schema_text() -> &'static str {
        include_str!("../schemas/WorkflowRunRequest.avsc")
    }

    fn check_rules(&self) -> Result<(), RuleViolation> {
        check_uuid("job_id", &self.job_id)?;
        check_workflow_name(&self.workflow_name)?;
        if let Some(version) = self.workflow_version.filter(|v| *v < 1) {
            return Err(RuleViolation::VersionBelowOne(version));
        }
        if let Some(metadata) = &self.metadata {
            crate::metadata::check(metadata)?;
        }
        match self.priority {
            Some(priority) if !(0..=MAX_PRIORITY).contains(&priority) => {
                Err(RuleViolation::PriorityOutOfRange(priority))
            }
            _ => Ok(()),
        }
    }
}
