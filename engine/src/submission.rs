//! What a job is made of before it exists: a [`Submission`], which
//! workflow it names ([`WorkflowRef`]), what came of it ([`Submitted`],
//! [`SubmitError`]) and what identifies its content. Shared by every way
//! a job comes to exist: the API and ingest (`ops/submit.rs`), a `start`
//! step (`nodes/child.rs`) and a schedule's tick (`services/scheduler.rs`).

use flotilla_store::StoreError;
use flotilla_store::runs::RunRow;
use flotilla_workflow::{CompiledWorkflow, InvalidDefinition};
use serde_json::Value as Json;
use uuid::Uuid;

use crate::Engine;
use crate::support::digest::{hex_sha256, write_canonical};
use crate::support::storable::{self, Unstorable};

/// Which workflow to run.
#[derive(Debug, Clone)]
pub enum WorkflowRef {
    /// The newest stored version of this name.
    Stored(String),
    /// This stored version of this name (from 1).
    Version(String, i32),
    /// A definition document sent with the submission.
    Inline(Json),
}

#[derive(Debug, Clone)]
pub struct Submission {
    pub job_id: Uuid,
    pub workflow: WorkflowRef,
    pub input: Json,
    /// W3C trace context of the submitter, stored so the run joins its trace.
    pub traceparent: Option<String>,
    /// W3C `tracestate`, kept only beside a valid `traceparent`.
    pub tracestate: Option<String>,
    /// 0 to 10: a head start in the queue, a minute per point. Not part of
    /// the request's digest: the same job sent again with another
    /// priority is the same job.
    pub priority: i16,
    /// The caller's labels on the job, checked against the contract's
    /// bounds. Not part of the digest either: the first submission's stay.
    pub metadata: Option<flotilla_contracts::Metadata>,
}

/// The highest priority a submission may ask for (the contract's).
#[allow(clippy::cast_possible_truncation)]
pub const MAX_PRIORITY: i16 = flotilla_contracts::MAX_PRIORITY as i16;

/// What to do with a submission that names an unknown workflow or carries an
/// input that fails the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalMode {
    /// Write nothing; return the error (the API answers the caller).
    Refuse,
    /// Record a FAILED row with its FAILED event (the consumer: nothing from
    /// the topic is dropped silently).
    Record,
}

#[derive(Debug)]
pub enum Submitted {
    /// A new row (QUEUED, or FAILED when a refusal was recorded).
    Created(RunRow),
    /// The same submission was made before; this is its row.
    Existing(RunRow),
    /// The same submission was made before, and its run finished and was
    /// removed by retention; this is what it left (within the horizon).
    Removed(flotilla_store::retention::RemovedRun),
}

impl Submitted {
    /// The job's row; `None` for a run removed by retention.
    #[must_use]
    pub fn row(&self) -> Option<&RunRow> {
        match self {
            Self::Created(row) | Self::Existing(row) => Some(row),
            Self::Removed(_) => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("unknown workflow {0:?}: no stored definition has that name")]
    UnknownWorkflow(String),
    #[error("workflow {name:?} has no version {version}")]
    UnknownVersion { name: String, version: i32 },
    #[error(transparent)]
    InvalidDefinition(#[from] InvalidDefinition),
    #[error("input does not match the input schema of {workflow}: {}", .violations.join("; "))]
    InvalidInput {
        workflow: String,
        violations: Vec<String>,
    },
    #[error("job {0} exists with different content")]
    Conflict(Uuid),
    /// A value the store cannot hold (a NUL, an over-long name, the nil id).
    #[error("the request cannot be stored: {0}")]
    Unstorable(#[from] Unstorable),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl SubmitError {
    /// Whether the submission itself is at fault (and can be recorded as a FAILED row).
    #[must_use]
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Self::UnknownWorkflow(_)
                | Self::UnknownVersion { .. }
                | Self::InvalidDefinition(_)
                | Self::InvalidInput { .. }
        )
    }
}

impl SubmitError {
    /// A store error about the data (the database refused this request's
    /// content) becomes [`SubmitError::Unstorable`]; others stay as they are.
    pub(crate) fn data_to_unstorable(self) -> Self {
        match self {
            Self::Store(e) if e.is_about_the_data() => Self::Unstorable(Unstorable {
                field: "request".into(),
                reason: format!("was refused by the database: {e}"),
            }),
            other => other,
        }
    }
}

/// Checks what the store cannot hold before anything is written, and drops
/// a malformed `traceparent` (with a warning) rather than store or forward it.
///
/// # Errors
/// What the store cannot hold, naming the field.
pub(crate) fn admit(mut submission: Submission) -> Result<Submission, Unstorable> {
    check_submission(&submission)?;
    if let Some(traceparent) = &submission.traceparent
        && !flotilla_runtime::trace::valid_traceparent(traceparent)
    {
        tracing::warn!(job_id = %submission.job_id, traceparent = %traceparent.escape_debug(),
            "malformed traceparent dropped");
        submission.traceparent = None;
    }
    if let Some(tracestate) = &submission.tracestate
        && (submission.traceparent.is_none()
            || !flotilla_runtime::trace::valid_tracestate(tracestate))
    {
        tracing::warn!(job_id = %submission.job_id, "tracestate dropped (malformed, or without a traceparent)");
        submission.tracestate = None;
    }
    Ok(submission)
}

impl From<sqlx::Error> for SubmitError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

/// Checks every field of `submission` the store would refuse.
///
/// # Errors
/// The first field found, named.
fn check_submission(submission: &Submission) -> Result<(), Unstorable> {
    if submission.job_id.is_nil() {
        return Err(Unstorable::new("job_id", "is the nil UUID"));
    }
    match &submission.workflow {
        WorkflowRef::Stored(name) => storable::check_workflow_name(name)?,
        WorkflowRef::Version(name, version) => {
            storable::check_workflow_name(name)?;
            if *version < 1 {
                return Err(Unstorable::new(
                    "workflow_version",
                    format!("is {version}: versions count from 1"),
                ));
            }
        }
        WorkflowRef::Inline(document) => storable::check_json("workflow", document)?,
    }
    storable::check_json("input", &submission.input)
}

/// What identifies a submission's content: the workflow reference (a stored
/// name, not its version, so a repeat after a new version is still the same
/// request) and the input, hashed over canonical JSON.
pub(crate) fn request_digest(submission: &Submission) -> String {
    let workflow = match &submission.workflow {
        WorkflowRef::Stored(name) => serde_json::json!({ "stored": name }),
        // Naming a version is part of what was asked: the same job id
        // without it, or with another, is another request.
        WorkflowRef::Version(name, version) => {
            serde_json::json!({ "stored": name, "version": version })
        }
        WorkflowRef::Inline(document) => serde_json::json!({ "inline": document }),
    };
    let mut canonical = String::new();
    write_canonical(
        &serde_json::json!({ "workflow": workflow, "input": submission.input }),
        &mut canonical,
    );
    hex_sha256(&canonical)
}

/// The namespace of child job ids (UUID v5 of `<parent>:<step>`).
const CHILD_NAMESPACE: Uuid = Uuid::from_u128(0x2c8e_5a71_4d0b_4f96_9e3a_7b1c_6d2f_8e40);

/// The id of the child that `parent`'s step `step` starts: the same on
/// every attempt, so a retry or a crash never starts a second one, and
/// never an id seen before (a child's id is a hash of a parent's).
#[must_use]
pub fn child_id(parent: Uuid, step: &str) -> Uuid {
    Uuid::new_v5(&CHILD_NAMESPACE, format!("{parent}:{step}").as_bytes())
}

/// The run layout a worker must read to run `compiled`, its Kafka steps
/// aside (`runs::READER_LEVEL`).
fn reader_level(compiled: &CompiledWorkflow) -> i16 {
    use flotilla_store::runs::{
        CHILD_READER_LEVEL, CONCURRENCY_READER_LEVEL, CONTROLS_READER_LEVEL, FOR_EACH_READER_LEVEL,
        GRAPH_READER_LEVEL, SIGNAL_READER_LEVEL, STEP_FORMS_READER_LEVEL,
    };
    let definition = &compiled.definition;
    let controls = definition.retry.is_some()
        || definition.execution_timeout_ms.is_some()
        || definition.debounce.is_some()
        || definition
            .steps
            .iter()
            .chain(&definition.on_failure)
            .any(|s| {
                s.retry.is_some()
                    || s.on_timeout.is_some()
                    || (s.timeout_ms.is_some() && (s.wait_for.is_some() || s.start.is_some()))
            });
    let shaped = definition
        .steps
        .iter()
        .chain(&definition.on_failure)
        .any(|step| {
            step.shapes_its_call()
                || step.repeat.is_some()
                || (step.start.is_some() && step.for_each.is_some())
        });
    if shaped {
        STEP_FORMS_READER_LEVEL
    } else if definition.concurrency.is_some() {
        CONCURRENCY_READER_LEVEL
    } else if controls {
        CONTROLS_READER_LEVEL
    } else if compiled.steps.iter().any(|s| s.for_each.is_some()) {
        FOR_EACH_READER_LEVEL
    } else if compiled.definition.steps.iter().any(|s| s.start.is_some()) {
        CHILD_READER_LEVEL
    } else if compiled.waits_for_signals() {
        SIGNAL_READER_LEVEL
    } else if compiled.uses_graph_fields() {
        GRAPH_READER_LEVEL
    } else {
        0
    }
}

impl Engine {
    /// The run layout a job of `compiled` needs: a step of a Kafka target
    /// keeps `step_requests`, which earlier releases do not read.
    pub(crate) fn reader_level_of(&self, compiled: &CompiledWorkflow) -> i16 {
        let level = reader_level(compiled);
        if compiled
            .definition
            .steps
            .iter()
            .any(|step| self.targets().kafka(&step.target).is_some())
        {
            level.max(flotilla_store::runs::KAFKA_READER_LEVEL)
        } else {
            level
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_ignores_key_order_but_not_content() {
        let submission = |input: Json| Submission {
            metadata: None,
            priority: 0,
            job_id: Uuid::nil(),
            workflow: WorkflowRef::Stored("w".into()),
            input,
            traceparent: None,
            tracestate: None,
        };
        let a = request_digest(&submission(
            serde_json::json!({"a": 1, "b": {"c": 2, "d": 3}}),
        ));
        let b = request_digest(&submission(
            serde_json::json!({"b": {"d": 3, "c": 2}, "a": 1}),
        ));
        let c = request_digest(&submission(
            serde_json::json!({"a": 1, "b": {"c": 2, "d": 4}}),
        ));
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
