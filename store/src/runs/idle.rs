//! Rows nobody holds: answering a parked step, settling a waiting or queued
//! job, and the operator's retry.

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgTransaction};
use uuid::Uuid;

use super::{COLUMNS, Checkpoint, CheckpointLayout, RunRow, STAMP, checkpoint_write};
use crate::StoreError;
use crate::outbox::{self, EventKind, EventStamp};

/// Part of an operator's retry's SET clause: the outcomes of children
/// that did not complete are forgotten, so the step that started one
/// starts it again (the same child, retried) on the next run.
const FORGET_UNFINISHED: &str = "children = (SELECT jsonb_object_agg(e.k, e.v) \
     FROM jsonb_each(children) AS e(k, v) WHERE e.v ->> 'status' = 'COMPLETED')";

/// Accepts an external step's response on a locked WAITING row: adds the
/// checkpoint (in `layout` unless the run already keeps its checkpoints as
/// rows) and requeues with fresh attempts (the work after a human step
/// does not inherit the retries spent before it), with its STEP_CHECKPOINT
/// event. `false`: the row is not WAITING, nothing was written.
///
/// # Errors
/// Database errors; an event the contract refuses.
pub async fn resume_waiting(
    tx: &mut PgTransaction<'_>,
    job_id: Uuid,
    checkpoint: &Checkpoint,
    layout: CheckpointLayout,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let update = format!(
        "UPDATE workflow_run SET status = 'QUEUED', outstanding_step = NULL, run_after = $3, updated_at = $3, attempt = 0,
             {}, event_sequence = event_sequence + 1
         WHERE job_id = $1 AND status = 'WAITING'",
        layout.assignment("$2")
    );
    let stamp: Option<EventStamp> =
        crate::sql::query_as(&checkpoint_write(&update, "$2", 0, STAMP))
            .bind(job_id)
            .bind(Json(checkpoint))
            .bind(now)
            .fetch_optional(&mut **tx)
            .await?;
    let Some(stamp) = stamp else { return Ok(false) };
    let event = EventKind::StepCheckpoint {
        step: checkpoint.name.clone(),
        note: checkpoint.note(),
    };
    outbox::insert(tx, &stamp, event, now).await?;
    Ok(true)
}

/// How a job nobody holds is settled for good.
#[derive(Debug, Clone, Copy)]
pub enum IdleSettle<'a> {
    /// FAILED (a rejected external response), with its verdict.
    Fail { error: &'a str, verdict: &'a str },
    /// CANCELLED by an operator, with the reason.
    Cancel { reason: &'a str },
}

/// Settles a QUEUED or WAITING row for good, with its event. `false`: the row
/// is in another state (or missing), nothing was written.
///
/// # Errors
/// Database errors; an event the contract refuses.
pub async fn settle_idle(
    tx: &mut PgTransaction<'_>,
    job_id: Uuid,
    settle: IdleSettle<'_>,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let (status, error, verdict, event) = match settle {
        IdleSettle::Fail { error, verdict } => (
            crate::RunStatus::Failed,
            error,
            Some(verdict),
            EventKind::Failed {
                error: error.to_owned(),
                verdict: Some(verdict.to_owned()),
            },
        ),
        IdleSettle::Cancel { reason } => (
            crate::RunStatus::Cancelled,
            reason,
            None,
            EventKind::Cancelled {
                reason: reason.to_owned(),
            },
        ),
    };
    let stamp: Option<EventStamp> = crate::sql::query_as(&format!(
        "UPDATE workflow_run SET status = $2, error = $3, verdict = coalesce($4, verdict), outstanding_step = NULL,
             updated_at = $5, event_sequence = event_sequence + 1
         WHERE job_id = $1 AND status IN ('QUEUED', 'WAITING')
         RETURNING {STAMP}"
    ))
    .bind(job_id)
    .bind(status)
    .bind(error)
    .bind(verdict)
    .bind(now)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(stamp) = stamp else { return Ok(false) };
    outbox::insert(tx, &stamp, event, now).await?;
    Ok(true)
}

/// Operator retry: a DEAD, FAILED or CANCELLED job goes back to the queue with
/// fresh attempts, no lapses counted and a fresh wait for its targets,
/// keeping its checkpoints and the results of the children that completed
/// (a child that did not is started again: retried). Each wait's deadline
/// is dropped (it waits its whole `timeout_ms` again) and an execution
/// timeout counts again from the retry. `None` when the job is in another
/// state.
///
/// # Errors
/// Database errors.
pub async fn retry(
    conn: &mut PgConnection,
    job_id: Uuid,
    now: DateTime<Utc>,
) -> Result<Option<RunRow>, sqlx::Error> {
    crate::sql::query_as(&format!(
        "UPDATE workflow_run SET status = 'QUEUED', attempt = 0, run_after = $2, updated_at = $2,
             error = NULL, verdict = NULL, result = NULL, outstanding_step = NULL,
             lease_losses = 0, unplaced_since = NULL, compensation = NULL, cancel_requested = NULL,
             step_requests = NULL, reply_deadline = NULL, wake_at = NULL, failed_attempts = '{{}}', holds_slot = false,
             timers = (SELECT jsonb_object_agg(k, v)
                       FROM jsonb_each(CASE WHEN jsonb_typeof(timers) = 'object' THEN timers ELSE '{{}}'::jsonb END) AS t(k, v)
                       WHERE k NOT LIKE 'deadline:%'),
             expires_at = CASE WHEN jsonb_typeof(d.document -> 'execution_timeout_ms') = 'number'
                 THEN $2 + (d.document ->> 'execution_timeout_ms')::numeric * interval '1 millisecond' END,
             {}
         FROM (SELECT coalesce(r.definition, (SELECT s.definition FROM workflow_definition s
                   WHERE s.name = r.workflow_name AND s.version = r.workflow_version)) AS document
               FROM workflow_run r WHERE r.job_id = $1) AS d
         WHERE job_id = $1 AND status IN ('DEAD', 'FAILED', 'CANCELLED')
         RETURNING {COLUMNS}",
        FORGET_UNFINISHED
    ))
    .bind(job_id)
    .bind(now)
    .fetch_optional(conn)
    .await
}

/// Why a WAITING job was put back in the queue by [`wake_due`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DueWake {
    /// A request to a Kafka target ran out (`reply_deadline`): the segment
    /// finds it past its deadline and fails the step by the retry rules.
    ReplyDeadline,
    /// A timer reached on another branch came due (`wake_at`): the segment
    /// runs what follows it and parks again.
    Timer,
}

/// Puts back in the queue, attempt given back, up to `limit` WAITING jobs
/// whose earliest awaited request ran out or whose earliest pending timer
/// came due at `now`, whatever step they are parked on. Rows another
/// session holds are left for the next sweep. Returns each job with why.
///
/// # Errors
/// Database errors.
pub async fn wake_due(
    pool: &sqlx::PgPool,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<(Uuid, DueWake)>, sqlx::Error> {
    let woken: Vec<(Uuid, bool)> = crate::sql::session(pool, async |conn| {
        crate::sql::query_as(
            "WITH due AS (
                 SELECT job_id, coalesce(reply_deadline <= $1, false) AS ran_out
                 FROM workflow_run
                 WHERE status = 'WAITING' AND (reply_deadline <= $1 OR wake_at <= $1 OR expires_at <= $1)
                 ORDER BY least(reply_deadline, wake_at, expires_at) LIMIT $2
                 FOR UPDATE SKIP LOCKED)
             UPDATE workflow_run r SET status = 'QUEUED', outstanding_step = NULL, run_after = $1,
                 attempt = greatest(attempt - 1, 0), reply_deadline = NULL, wake_at = NULL,
                 updated_at = $1
             FROM due WHERE r.job_id = due.job_id AND r.status = 'WAITING'
             RETURNING r.job_id, due.ran_out",
        )
        .bind(now)
        .bind(limit)
        .fetch_all(conn)
        .await
    })
    .await?;
    // A job QUEUED for later (a timer, a retry's pause) that has expired
    // meanwhile comes back now, to be ended; not one waiting for a worker
    // with its targets (it would only be handed back again each sweep).
    crate::sql::session(pool, async |conn| {
        crate::sql::query(
            "UPDATE workflow_run SET run_after = $1
             WHERE job_id IN (SELECT job_id FROM workflow_run
                              WHERE status = 'QUEUED' AND expires_at <= $1 AND run_after > $1
                                AND unplaced_since IS NULL
                              LIMIT $2 FOR UPDATE SKIP LOCKED)",
        )
        .bind(now)
        .bind(limit)
        .execute(conn)
        .await
    })
    .await?;
    Ok(woken
        .into_iter()
        .map(|(job_id, ran_out)| {
            let why = if ran_out {
                DueWake::ReplyDeadline
            } else {
                DueWake::Timer
            };
            (job_id, why)
        })
        .collect())
}
