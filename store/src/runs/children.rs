//! Child workflows on the run row: the link from a child to its parent,
//! the parent's `children` (each finished child's outcome by the step that
//! started it, written by the trigger `flotilla_child_finished` in the
//! child's own terminal transaction), and what the cancel cascade reads.

use chrono::{DateTime, Utc};
use serde::Deserialize;
use sqlx::{PgConnection, PgTransaction};
use uuid::Uuid;

use super::{COLUMNS, RunRow};
use crate::RunStatus;

/// The deepest a family nests: a job at this depth starts no child.
pub const MAX_DEPTH: i16 = 8;

/// Part of a requeue's SET clause (a retryable failure): only DEAD
/// children, which failed the step retryably, are forgotten and retried; a
/// FAILED or CANCELLED child stays the step's verdict.
pub(super) const FORGET_DEAD: &str = "children = (SELECT jsonb_object_agg(e.k, e.v) \
     FROM jsonb_each(children) AS e(k, v) WHERE e.v ->> 'status' <> 'DEAD')";

/// Whether the row holds the outcome of a child started by one of the
/// steps in the text array `$8`.
pub(super) const FINISHED_ONE_OF_8: &str = "coalesce(children ?| $8::text[], false)";

/// A finished child as its parent's row keeps it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ChildOutcome {
    pub job_id: Uuid,
    pub status: RunStatus,
    #[serde(default)]
    pub result: Option<serde_json::Value>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub verdict: Option<String>,
}

/// The outcome of the child started by `step`, if it finished.
///
/// # Errors
/// The row's `children` do not read (a row another writer broke).
pub fn outcome_of(row: &RunRow, step: &str) -> Result<Option<ChildOutcome>, String> {
    let Some(children) = &row.children else {
        return Ok(None);
    };
    children
        .0
        .get(step)
        .map(|entry| serde_json::from_value(entry.clone()))
        .transpose()
        .map_err(|e| format!("the outcome of step {step}'s child does not read: {e}"))
}

/// Links the child `child` (just submitted, in this transaction) to its
/// parent. A child that is already finished (refused at submission) has
/// its outcome written to the parent by the trigger at once.
///
/// # Errors
/// Database errors.
pub async fn link(
    tx: &mut PgTransaction<'_>,
    child: Uuid,
    (parent, step): (Uuid, &str),
    depth: i16,
    cancel_with_parent: bool,
) -> Result<(), sqlx::Error> {
    crate::sql::query(
        "UPDATE workflow_run SET parent_job_id = $2, parent_step = $3, depth = $4, cancel_with_parent = $5,
             root_job_id = (SELECT coalesce(p.root_job_id, p.job_id) FROM workflow_run p WHERE p.job_id = $2)
         WHERE job_id = $1 AND parent_job_id IS NULL",
    )
    .bind(child)
    .bind(parent)
    .bind(step)
    .bind(depth)
    .bind(cancel_with_parent)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Locks the row of the child `child`, if there is one, until the
/// transaction ends: a parent that writes its child takes the child's lock
/// before its own row's, the order a child's terminal write takes them in
/// (the child's row, then, by the trigger, its parent's), so the two wait
/// for each other instead of deadlocking.
///
/// # Errors
/// Database errors.
pub async fn lock_child(tx: &mut PgTransaction<'_>, child: Uuid) -> Result<(), sqlx::Error> {
    crate::sql::query("SELECT 1 FROM workflow_run WHERE job_id = $1 FOR UPDATE")
        .bind(child)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Counts one more job into the family of `parent` (its root's, or its
/// own when nobody started it), unless the family already holds `most`
/// jobs (the root included). The family and, when it is full, `None`.
/// Takes the family's row lock: call it after every lock on a run row.
///
/// # Errors
/// Database errors.
pub async fn join_family(
    tx: &mut PgTransaction<'_>,
    parent: Uuid,
    most: i32,
) -> Result<(Uuid, Option<i32>), sqlx::Error> {
    crate::sql::query_as(
        "WITH root AS (SELECT coalesce(root_job_id, job_id) AS id FROM workflow_run WHERE job_id = $1),
         counted AS (
             INSERT INTO workflow_family (root_job_id, jobs) SELECT id, 2 FROM root
             ON CONFLICT (root_job_id) DO UPDATE SET jobs = workflow_family.jobs + 1
                 WHERE workflow_family.jobs < $2
             RETURNING jobs)
         SELECT (SELECT id FROM root), (SELECT jobs FROM counted)",
    )
    .bind(parent)
    .bind(most)
    .fetch_one(&mut **tx)
    .await
}

/// Copies the outcome of the finished child `child` into its parent's
/// `children` under `step`, as the trigger does when a child finishes: for
/// a child found finished already when its step runs again.
///
/// # Errors
/// Database errors.
pub async fn record_outcome(
    tx: &mut PgTransaction<'_>,
    (parent, step): (Uuid, &str),
    child: Uuid,
) -> Result<(), sqlx::Error> {
    crate::sql::query(
        "UPDATE workflow_run p SET children = coalesce(p.children, '{}'::jsonb) || jsonb_build_object($2::text,
             jsonb_build_object('job_id', c.job_id, 'status', c.status, 'result', c.result,
                 'error', c.error, 'verdict', c.verdict))
         FROM workflow_run c WHERE p.job_id = $1 AND c.job_id = $3",
    )
    .bind(parent)
    .bind(step)
    .bind(child)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Puts a child that ended FAILED, DEAD or CANCELLED back in the queue
/// with fresh attempts (an operator's retry, asked by its parent's step
/// running again). `false`: it is in another state.
///
/// # Errors
/// Database errors.
pub async fn retry_child(
    tx: &mut PgTransaction<'_>,
    child: Uuid,
    now: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    Ok(super::idle::retry(&mut *tx, child, now).await?.is_some())
}

/// The status of the job `child`, if it exists.
///
/// # Errors
/// Database errors.
pub async fn status_of(
    conn: &mut PgConnection,
    child: Uuid,
) -> Result<Option<RunStatus>, sqlx::Error> {
    crate::sql::query_scalar("SELECT status FROM workflow_run WHERE job_id = $1")
        .bind(child)
        .fetch_optional(conn)
        .await
}

/// The child `child` of `parent`'s step `step` as it is now: its status
/// (none without a row) and the outcome its parent's row holds for it.
///
/// # Errors
/// Database errors; an outcome that does not read.
pub async fn now_of(
    conn: &mut PgConnection,
    (parent, step): (Uuid, &str),
    child: Uuid,
) -> Result<(Option<RunStatus>, Option<ChildOutcome>), sqlx::Error> {
    let (status, outcome): (
        Option<RunStatus>,
        Option<sqlx::types::Json<serde_json::Value>>,
    ) = crate::sql::query_as(
        "SELECT (SELECT status FROM workflow_run WHERE job_id = $3),
                    (SELECT children -> $2 FROM workflow_run WHERE job_id = $1)",
    )
    .bind(parent)
    .bind(step)
    .bind(child)
    .fetch_one(conn)
    .await?;
    let outcome = outcome
        .map(|sqlx::types::Json(entry)| serde_json::from_value(entry))
        .transpose()
        .map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
    Ok((status, outcome))
}

/// The jobs `parent` started, oldest first.
///
/// # Errors
/// Database errors.
pub async fn children_of(
    conn: &mut PgConnection,
    parent: Uuid,
) -> Result<Vec<RunRow>, sqlx::Error> {
    crate::sql::query_as(&format!(
        "SELECT {COLUMNS} FROM workflow_run WHERE parent_job_id = $1 ORDER BY created_at, job_id"
    ))
    .bind(parent)
    .fetch_all(conn)
    .await
}

/// Up to `limit` unfinished children, cancelled with their parent, whose
/// parent ended CANCELLED, FAILED or DEAD (with that status): what the
/// cancel cascade has left to do, oldest change first. A RUNNING child already asked to cancel is left out: its
/// holder honours the ask, or the sweep of its lapsed lease does, and a
/// pass full of them would never reach the orphans behind.
///
/// # Errors
/// Database errors.
pub async fn orphaned_by_cancel(
    conn: &mut PgConnection,
    limit: i64,
) -> Result<Vec<(Uuid, Uuid, RunStatus)>, sqlx::Error> {
    crate::sql::query_as(
        "SELECT c.job_id, c.parent_job_id, p.status FROM workflow_run c
         JOIN workflow_run p ON p.job_id = c.parent_job_id
         WHERE c.parent_job_id IS NOT NULL AND c.cancel_with_parent
           AND c.status IN ('QUEUED', 'RUNNING', 'WAITING')
           AND p.status IN ('CANCELLED', 'FAILED', 'DEAD')
           AND NOT (c.status = 'RUNNING' AND c.cancel_requested IS NOT NULL)
         ORDER BY c.updated_at
         LIMIT $1",
    )
    .bind(limit)
    .fetch_all(conn)
    .await
}
