//! `workflow_run`: every statement on the run row.
//!
//! Writes to a RUNNING row go through [`fenced`], conditioned on the lease
//! token; `None` back means the lease is gone and nothing was written.
//! Each commit point bumps `event_sequence` in the same statement, so the
//! caller gets the sequence for the event it inserts in the same transaction.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

use super::outbox::EventStamp;

/// The states of DESIGN.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RunStatus {
    Queued,
    Running,
    Waiting,
    Completed,
    Failed,
    Dead,
    Cancelled,
}

impl RunStatus {
    pub const ALL: [Self; 7] = [
        Self::Queued,
        Self::Running,
        Self::Waiting,
        Self::Completed,
        Self::Failed,
        Self::Dead,
        Self::Cancelled,
    ];

    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "QUEUED",
            Self::Running => "RUNNING",
            Self::Waiting => "WAITING",
            Self::Completed => "COMPLETED",
            Self::Failed => "FAILED",
            Self::Dead => "DEAD",
            Self::Cancelled => "CANCELLED",
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RunStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| format!("unknown status {s:?}"))
    }
}

/// One executed step: what the row's `checkpoints` array holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    pub name: String,
    pub skipped: bool,
    pub response: serde_json::Value,
}

/// The whole run row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RunRow {
    pub job_id: Uuid,
    pub workflow_name: String,
    pub workflow_version: Option<i32>,
    pub definition: Json<serde_json::Value>,
    pub input: Json<serde_json::Value>,
    pub request_digest: String,
    pub status: String,
    pub attempt: i32,
    pub max_attempts: i32,
    pub run_after: DateTime<Utc>,
    pub outstanding_step: Option<String>,
    /// Kept as raw JSON: a malformed array must fail the job loudly, not the load.
    pub checkpoints: Json<serde_json::Value>,
    pub result: Option<Json<serde_json::Value>>,
    pub verdict: Option<String>,
    pub error: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_until: Option<DateTime<Utc>>,
    pub lease_token: Option<Uuid>,
    pub event_sequence: i64,
    pub traceparent: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl RunRow {
    /// The stamp for an event at this row's current sequence.
    #[must_use]
    pub fn stamp(&self) -> EventStamp {
        EventStamp {
            job_id: self.job_id,
            event_sequence: self.event_sequence,
            workflow_name: self.workflow_name.clone(),
            attempt: self.attempt,
            traceparent: self.traceparent.clone(),
        }
    }

    /// The status; the schema's CHECK makes an unknown one impossible.
    #[must_use]
    pub fn status(&self) -> RunStatus {
        self.status.parse().unwrap_or(RunStatus::Failed)
    }

    /// Whether the checkpoints hold an entry for `step`.
    #[must_use]
    pub fn has_checkpoint(&self, step: &str) -> bool {
        self.checkpoints.0.as_array().is_some_and(|entries| {
            entries
                .iter()
                .any(|e| e.get("name").and_then(|n| n.as_str()) == Some(step))
        })
    }
}

const COLUMNS: &str = "job_id, workflow_name, workflow_version, definition, input, request_digest, status, \
    attempt, max_attempts, run_after, outstanding_step, checkpoints, result, verdict, error, lease_owner, \
    lease_until, lease_token, event_sequence, traceparent, created_at, updated_at";

const STAMP: &str = "job_id, event_sequence, workflow_name, attempt, traceparent";

/// A row to insert at submission.
#[derive(Debug)]
pub struct NewRun<'a> {
    pub job_id: Uuid,
    pub workflow_name: &'a str,
    pub workflow_version: Option<i32>,
    pub definition: &'a serde_json::Value,
    pub input: &'a serde_json::Value,
    pub request_digest: &'a str,
    /// QUEUED, or FAILED for a request recorded as refused.
    pub status: RunStatus,
    pub max_attempts: i32,
    pub error: Option<&'a str>,
    pub verdict: Option<&'a str>,
    pub traceparent: Option<&'a str>,
    pub now: DateTime<Utc>,
}

/// Inserts a new run with its first event sequence allocated and returns
/// it; `None` when a row with that job id exists already.
///
/// # Errors
/// Database errors.
pub async fn insert(
    conn: &mut PgConnection,
    run: &NewRun<'_>,
) -> Result<Option<RunRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "INSERT INTO workflow_run (job_id, workflow_name, workflow_version, definition, input, request_digest,
             status, max_attempts, run_after, error, verdict, event_sequence, traceparent, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 1, $12, $9, $9)
         ON CONFLICT (job_id) DO NOTHING
         RETURNING {COLUMNS}"
    ))
    .bind(run.job_id)
    .bind(run.workflow_name)
    .bind(run.workflow_version)
    .bind(Json(run.definition))
    .bind(Json(run.input))
    .bind(run.request_digest)
    .bind(run.status.as_str())
    .bind(run.max_attempts)
    .bind(run.now)
    .bind(run.error)
    .bind(run.verdict)
    .bind(run.traceparent)
    .fetch_optional(conn)
    .await
}

/// The row of `job_id`.
///
/// # Errors
/// Database errors.
pub async fn get(conn: &mut PgConnection, job_id: Uuid) -> Result<Option<RunRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM workflow_run WHERE job_id = $1"
    ))
    .bind(job_id)
    .fetch_optional(conn)
    .await
}

/// The row of `job_id`, locked until the transaction ends.
///
/// # Errors
/// Database errors.
pub async fn get_for_update(
    conn: &mut PgConnection,
    job_id: Uuid,
) -> Result<Option<RunRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM workflow_run WHERE job_id = $1 FOR UPDATE"
    ))
    .bind(job_id)
    .fetch_optional(conn)
    .await
}

/// Claims the oldest eligible QUEUED row in one statement: flips it to
/// RUNNING, stamps the lease and a fresh token, and counts the attempt.
///
/// # Errors
/// Database errors.
pub async fn claim(
    conn: &mut PgConnection,
    worker_id: &str,
    token: Uuid,
    now: DateTime<Utc>,
    lease_until: DateTime<Utc>,
) -> Result<Option<RunRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "UPDATE workflow_run SET status = 'RUNNING', lease_owner = $1, lease_token = $2, lease_until = $4,
             attempt = attempt + 1, updated_at = $3
         WHERE job_id = (
             SELECT job_id FROM workflow_run
             WHERE status = 'QUEUED' AND run_after <= $3
             ORDER BY run_after, created_at
             LIMIT 1
             FOR UPDATE SKIP LOCKED)
         RETURNING {COLUMNS}"
    ))
    .bind(worker_id)
    .bind(token)
    .bind(now)
    .bind(lease_until)
    .fetch_optional(conn)
    .await
}

/// A change to a RUNNING row by its lease holder.
#[derive(Debug)]
pub enum Fenced<'a> {
    /// Extends the lease; no event.
    Renew { lease_until: DateTime<Utc> },
    /// Appends a checkpoint (event: STEP_CHECKPOINT).
    Checkpoint { checkpoint: &'a Checkpoint },
    /// Parks on an external step (event: WAITING).
    Park { step: &'a str },
    /// Finishes (event: COMPLETED).
    Complete {
        result: &'a serde_json::Value,
        verdict: &'a str,
    },
    /// Fails for good (event: FAILED).
    Fail {
        error: &'a str,
        verdict: Option<&'a str>,
    },
    /// Attempts exhausted (event: DEAD).
    Dead { error: &'a str },
    /// Back to the queue after a retryable failure; no event.
    Requeue {
        error: &'a str,
        run_after: DateTime<Utc>,
    },
}

impl Fenced<'_> {
    /// Whether this change is a commit point with an event.
    #[must_use]
    pub fn has_event(&self) -> bool {
        !matches!(self, Self::Renew { .. } | Self::Requeue { .. })
    }
}

/// Applies `change` if `token` still holds the lease on `job_id`. Returns the
/// event stamp (sequence already bumped for changes with an event), or `None`
/// when the lease is lost: zero rows matched and nothing was written.
///
/// # Errors
/// Database errors.
pub async fn fenced(
    conn: &mut PgConnection,
    job_id: Uuid,
    token: Uuid,
    now: DateTime<Utc>,
    change: &Fenced<'_>,
) -> Result<Option<EventStamp>, sqlx::Error> {
    const RELEASE: &str = "lease_owner = NULL, lease_token = NULL, lease_until = NULL";
    const NEXT: &str = "event_sequence = event_sequence + 1";
    let set = match change {
        Fenced::Renew { .. } => "lease_until = $4".to_owned(),
        Fenced::Checkpoint { .. } => {
            format!("checkpoints = checkpoints || jsonb_build_array($4::jsonb), {NEXT}")
        }
        Fenced::Park { .. } => {
            format!("status = 'WAITING', outstanding_step = $4, {RELEASE}, {NEXT}")
        }
        Fenced::Complete { .. } => {
            format!(
                "status = 'COMPLETED', result = $4, verdict = $5, error = NULL, {RELEASE}, {NEXT}"
            )
        }
        Fenced::Fail { .. } => {
            format!("status = 'FAILED', error = $4, verdict = $5, {RELEASE}, {NEXT}")
        }
        Fenced::Dead { .. } => format!("status = 'DEAD', error = $4, {RELEASE}, {NEXT}"),
        Fenced::Requeue { .. } => {
            format!("status = 'QUEUED', error = $4, run_after = $5, {RELEASE}")
        }
    };
    let sql = format!(
        "UPDATE workflow_run SET {set}, updated_at = $3
         WHERE job_id = $1 AND lease_token = $2 AND status = 'RUNNING'
         RETURNING {STAMP}"
    );
    let query = sqlx::query_as(&sql).bind(job_id).bind(token).bind(now);
    let query = match change {
        Fenced::Renew { lease_until } => query.bind(*lease_until),
        Fenced::Checkpoint { checkpoint } => query.bind(Json(*checkpoint)),
        Fenced::Park { step } => query.bind(*step),
        Fenced::Complete { result, verdict } => query.bind(Json(*result)).bind(*verdict),
        Fenced::Fail { error, verdict } => query.bind(*error).bind(*verdict),
        Fenced::Dead { error } => query.bind(*error),
        Fenced::Requeue { error, run_after } => query.bind(*error).bind(*run_after),
    };
    query.fetch_optional(conn).await
}

/// Requeues up to `limit` RUNNING rows whose lease passed before `now`;
/// rows that used their last attempt go DEAD instead, and their stamps are
/// returned for the DEAD events.
///
/// # Errors
/// Database errors.
pub async fn sweep_expired(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<(u64, Vec<(EventStamp, String)>), sqlx::Error> {
    let expired: Vec<(Uuid, i32, i32, Option<String>)> = sqlx::query_as(
        "SELECT job_id, attempt, max_attempts, lease_owner FROM workflow_run
         WHERE status = 'RUNNING' AND lease_until < $1
         ORDER BY lease_until LIMIT $2
         FOR UPDATE SKIP LOCKED",
    )
    .bind(now)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    let mut requeued = 0;
    let mut dead = Vec::new();
    for (job_id, attempt, max_attempts, owner) in expired {
        let error = format!(
            "lease expired: worker {} stopped renewing during attempt {attempt}",
            owner.as_deref().unwrap_or("?")
        );
        let (set, status) = if attempt >= max_attempts {
            (
                "status = 'DEAD', event_sequence = event_sequence + 1",
                RunStatus::Dead,
            )
        } else {
            ("status = 'QUEUED', run_after = $2", RunStatus::Queued)
        };
        let stamp: EventStamp = sqlx::query_as(&format!(
            "UPDATE workflow_run SET {set}, error = $3, lease_owner = NULL, lease_token = NULL,
                 lease_until = NULL, updated_at = $2
             WHERE job_id = $1 RETURNING {STAMP}"
        ))
        .bind(job_id)
        .bind(now)
        .bind(&error)
        .fetch_one(&mut *conn)
        .await?;
        match status {
            RunStatus::Dead => dead.push((stamp, error)),
            _ => requeued += 1,
        }
    }
    Ok((requeued, dead))
}

/// Accepts an external step's response on a locked WAITING row: appends the
/// checkpoint and requeues with fresh attempts (the work after a human step
/// does not inherit the retries spent before it), bumping the sequence for
/// the STEP_CHECKPOINT event.
///
/// # Errors
/// Database errors.
pub async fn resume_waiting(
    conn: &mut PgConnection,
    job_id: Uuid,
    checkpoint: &Checkpoint,
    now: DateTime<Utc>,
) -> Result<EventStamp, sqlx::Error> {
    sqlx::query_as(&format!(
        "UPDATE workflow_run SET status = 'QUEUED', outstanding_step = NULL, run_after = $3, updated_at = $3, attempt = 0,
             checkpoints = checkpoints || jsonb_build_array($2::jsonb), event_sequence = event_sequence + 1
         WHERE job_id = $1 AND status = 'WAITING'
         RETURNING {STAMP}"
    ))
    .bind(job_id)
    .bind(Json(checkpoint))
    .bind(now)
    .fetch_one(conn)
    .await
}

/// Fails a locked WAITING or QUEUED row for good (a rejected external
/// response, or a refused operator action), bumping the sequence for the event.
///
/// # Errors
/// Database errors.
pub async fn settle_idle(
    conn: &mut PgConnection,
    job_id: Uuid,
    status: RunStatus,
    error: &str,
    verdict: Option<&str>,
    now: DateTime<Utc>,
) -> Result<Option<EventStamp>, sqlx::Error> {
    sqlx::query_as(&format!(
        "UPDATE workflow_run SET status = $2, error = $3, verdict = coalesce($4, verdict), outstanding_step = NULL,
             updated_at = $5, event_sequence = event_sequence + 1
         WHERE job_id = $1 AND status IN ('QUEUED', 'WAITING')
         RETURNING {STAMP}"
    ))
    .bind(job_id)
    .bind(status.as_str())
    .bind(error)
    .bind(verdict)
    .bind(now)
    .fetch_optional(conn)
    .await
}

/// Operator retry: a DEAD, FAILED or CANCELLED job goes back to the queue with
/// fresh attempts, keeping its checkpoints. `None` when the job is in another state.
///
/// # Errors
/// Database errors.
pub async fn retry(
    conn: &mut PgConnection,
    job_id: Uuid,
    now: DateTime<Utc>,
) -> Result<Option<RunRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "UPDATE workflow_run SET status = 'QUEUED', attempt = 0, run_after = $2, updated_at = $2,
             error = NULL, verdict = NULL, result = NULL, outstanding_step = NULL
         WHERE job_id = $1 AND status IN ('DEAD', 'FAILED', 'CANCELLED')
         RETURNING {COLUMNS}"
    ))
    .bind(job_id)
    .bind(now)
    .fetch_optional(conn)
    .await
}

/// A page of jobs, newest first, after `before` (a `(created_at, job_id)` cursor).
///
/// # Errors
/// Database errors.
pub async fn list(
    conn: &mut PgConnection,
    status: Option<RunStatus>,
    workflow_name: Option<&str>,
    before: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> Result<Vec<RunRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM workflow_run
         WHERE ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR workflow_name = $2)
           AND ($3::timestamptz IS NULL OR (created_at, job_id) < ($3, $4))
         ORDER BY created_at DESC, job_id DESC
         LIMIT $5"
    ))
    .bind(status.map(RunStatus::as_str))
    .bind(workflow_name)
    .bind(before.map(|(at, _)| at))
    .bind(before.map(|(_, id)| id))
    .bind(limit)
    .fetch_all(conn)
    .await
}
