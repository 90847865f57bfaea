//! What the API returns: jobs and pages of jobs, as JSON documents.

use chrono::{DateTime, Utc};
use flotilla_engine::rows::RunRow;
use flotilla_engine::rows::RunStatus;
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use flotilla_engine::JobPage;
use flotilla_engine::ops::children::ChildLink;

/// A job as the API returns it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct JobView {
    pub job_id: Uuid,
    pub workflow_name: String,
    pub workflow_version: Option<i32>,
    #[schema(value_type = String, example = "QUEUED")]
    pub status: RunStatus,
    /// How many times the job has been claimed for work since it was
    /// submitted, woken or retried (one more after each failed attempt).
    pub attempt: i32,
    /// Each step's attempts unless its retry policy says otherwise.
    pub max_attempts: i32,
    /// The request's priority, 0 to 10 (a head start in the queue).
    pub priority: i16,
    /// The caller's labels on the job (strings by key), if it has any.
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// Each step's failed attempts so far: step → count.
    #[schema(value_type = Object)]
    pub failed_attempts: Value,
    /// When the workflow's `execution_timeout_ms` ends the job, if it has one.
    pub expires_at: Option<DateTime<Utc>>,
    /// The workflow's concurrency key this job's input gave
    /// (`<workflow>/<key>`), if it has one.
    pub concurrency_key: Option<String>,
    /// Whether the job holds a slot of its concurrency key (from its first
    /// step until it ends). A QUEUED job without one waits for one: its
    /// `error` says `held by its concurrency key …` and why.
    pub holds_slot: bool,
    pub run_after: DateTime<Utc>,
    pub outstanding_step: Option<String>,
    #[schema(value_type = Object)]
    pub input: Value,
    /// One entry per finished step, in order (a JSON array).
    #[schema(value_type = Vec<Object>)]
    pub checkpoints: Value,
    #[schema(value_type = Option<Object>)]
    pub result: Option<Value>,
    pub verdict: Option<String>,
    pub error: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_until: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The W3C trace id of the job's spans (from its stored `traceparent`).
    pub trace_id: Option<String>,
    /// The definition's revision (0 as submitted, one more per graft):
    /// what a graft names.
    pub revision: i32,
    /// Timers the job has reached, and the deadlines of its waits with a
    /// `timeout_ms`: step → the instant.
    pub timers: Option<Value>,
    /// The job whose step started this one, and that step.
    pub parent_job_id: Option<Uuid>,
    pub parent_step: Option<String>,
    /// 0 for a job nobody started; a child is one deeper than its parent.
    pub depth: i16,
    /// The jobs this one started (`GET /v1/jobs/{job_id}` only; empty in
    /// lists).
    pub children: Vec<ChildLink>,
    /// Each Kafka step's latest request: step → `{correlation_id, attempt,
    /// topic, reply_topic, deadline, requested_at, reply}`.
    #[schema(value_type = Option<Object>)]
    pub step_requests: Option<Value>,
    /// While WAITING: when the earliest request it waits on runs out.
    pub reply_deadline: Option<DateTime<Utc>>,
}

impl From<RunRow> for JobView {
    fn from(row: RunRow) -> Self {
        let trace_id = Some(flotilla_runtime::trace::trace_id(
            row.traceparent.as_deref(),
        ))
        .filter(|id| !id.is_empty())
        .map(str::to_owned);
        Self {
            trace_id,
            parent_job_id: row.parent_job_id,
            parent_step: row.parent_step,
            depth: row.depth,
            children: Vec::new(),
            step_requests: row.step_requests.map(|r| r.0),
            reply_deadline: (row.status == RunStatus::Waiting)
                .then_some(row.reply_deadline)
                .flatten(),
            revision: row.revision,
            timers: row.timers.map(|t| t.0),
            status: row.status,
            job_id: row.job_id,
            workflow_name: row.workflow_name,
            workflow_version: row.workflow_version,
            attempt: row.attempt,
            max_attempts: row.max_attempts,
            failed_attempts: row.failed_attempts.0,
            priority: row.priority,
            metadata: row.metadata.map(|m| m.0),
            expires_at: row.expires_at,
            concurrency_key: row.concurrency_key,
            // Kept on the row after it ends; a finished job holds nothing.
            holds_slot: row.holds_slot
                && matches!(
                    row.status,
                    RunStatus::Queued | RunStatus::Running | RunStatus::Waiting
                ),
            run_after: row.run_after,
            outstanding_step: row.outstanding_step,
            input: row.input.0,
            checkpoints: row.checkpoints.0,
            result: row.result.map(|r| r.0),
            verdict: row.verdict,
            error: row.error,
            lease_owner: row.lease_owner,
            lease_until: row.lease_until,
            created_at: row.created_at,
            updated_at: row.updated_at,
        }
    }
}

/// One page of jobs, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct JobPageView {
    pub jobs: Vec<JobView>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

impl From<JobPage> for JobPageView {
    fn from(page: JobPage) -> Self {
        Self {
            jobs: page.jobs.into_iter().map(JobView::from).collect(),
            next_cursor: page.next_cursor,
        }
    }
}

/// A job's events still in the outbox, in sequence order.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TimelineView {
    #[schema(value_type = Vec<Object>)]
    pub events: Vec<flotilla_engine::rows::TimelineEntry>,
}
