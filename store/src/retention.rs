//! Retention of finished runs: deleting the runs that finished before a
//! cutoff, a bounded batch at a time, each leaving a compact record in
//! `workflow_run_removed` ([`remove_finished`]); reading that record when a
//! removed job id is submitted again ([`removed`]); and forgetting records
//! past the idempotency horizon ([`forget_removed`]). One member of the
//! fleet at a time: each batch takes a transaction-scoped advisory lock,
//! and one that finds it held does nothing. Rows are picked with
//! `FOR UPDATE SKIP LOCKED` among finished runs, which no claim takes.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool, PgTransaction};
use uuid::Uuid;

use crate::RunStatus;

/// The advisory lock key of retention (`hashtext` of this name).
const LOCK: &str = "flotilla.run-retention";

/// Which finished runs a batch removes: those of `status` that finished
/// before `cutoff`, of `workflow` only, or of every workflow but `except`;
/// never one `passed_over` (the store refused to remove it), nor a child
/// whose parent's row is still kept (the parent may still need its
/// outcome: an operator's retry restarts the children that did not
/// complete), so a family goes root first.
#[derive(Debug, Clone, Copy)]
pub struct Removal<'a> {
    pub status: RunStatus,
    pub workflow: Option<&'a str>,
    pub except: &'a [String],
    pub cutoff: DateTime<Utc>,
    pub passed_over: &'a [Uuid],
}

/// The condition on the runs a [`Removal`] names: parameters 1 to 4 are
/// its status, cutoff, workflow and exceptions, `passed_over` its own.
fn doomed(passed_over: &str) -> String {
    format!(
        "status = $1 AND created_at < $2 AND updated_at < $2
         AND ($3::text IS NULL OR workflow_name = $3)
         AND workflow_name <> ALL($4::text[])
         AND job_id <> ALL({passed_over}::uuid[])
         AND (parent_job_id IS NULL OR NOT EXISTS (
             SELECT 1 FROM workflow_run parent WHERE parent.job_id = workflow_run.parent_job_id))"
    )
}

/// What a removed run left behind.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct RemovedRun {
    pub job_id: Uuid,
    pub workflow_name: String,
    pub request_digest: String,
    pub status: RunStatus,
    pub finished_at: DateTime<Utc>,
    pub removed_at: DateTime<Utc>,
}

/// A transaction holding retention's lock; `None` (and nothing held) when
/// another member holds it.
async fn begin_alone(pool: &PgPool) -> Result<Option<PgTransaction<'static>>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let held: bool = crate::sql::query_scalar("SELECT pg_try_advisory_xact_lock(hashtext($1))")
        .bind(LOCK)
        .fetch_one(&mut *tx)
        .await?;
    if held {
        Ok(Some(tx))
    } else {
        tx.rollback().await?;
        Ok(None)
    }
}

/// Commits after a statement that succeeded, rolls back after one that
/// failed (never merely dropped: a dropped transaction keeps its locks,
/// retention's and the rows', until its connection is next used).
async fn end(
    tx: PgTransaction<'static>,
    done: Result<sqlx::postgres::PgQueryResult, sqlx::Error>,
) -> Result<u64, sqlx::Error> {
    match done {
        Ok(done) => {
            tx.commit().await?;
            Ok(done.rows_affected())
        }
        Err(e) => {
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

/// Removes up to `limit` runs that `removal` names, each with its record,
/// at `now`; `None` when another member is removing runs right now.
///
/// # Errors
/// Database errors (nothing is removed then).
pub async fn remove_finished(
    pool: &PgPool,
    removal: Removal<'_>,
    limit: i64,
    now: DateTime<Utc>,
) -> Result<Option<u64>, sqlx::Error> {
    remove(pool, removal, limit, now, None).await
}

/// [`remove_finished`], of `only` that run when given.
async fn remove(
    pool: &PgPool,
    removal: Removal<'_>,
    limit: i64,
    now: DateTime<Utc>,
    only: Option<Uuid>,
) -> Result<Option<u64>, sqlx::Error> {
    let Some(mut tx) = begin_alone(pool).await? else {
        return Ok(None);
    };
    // `created_at < cutoff` adds nothing (a run finishes after it was
    // made) but lets an index order the candidates: the resting-status
    // index for FAILED, DEAD and CANCELLED, `workflow_run_newest` for
    // COMPLETED (no index names COMPLETED rows: each would cost every
    // completion an index entry; docs/operations.md, "Retention").
    let removed = crate::sql::query(&format!(
        "WITH doomed AS (
             SELECT job_id FROM workflow_run
             WHERE {} AND ($8::uuid IS NULL OR job_id = $8)
             ORDER BY created_at
             LIMIT $5
             FOR UPDATE SKIP LOCKED),
         gone AS (
             DELETE FROM workflow_run r USING doomed d WHERE r.job_id = d.job_id
             RETURNING r.job_id, r.workflow_name, r.request_digest, r.status, r.updated_at)
         INSERT INTO workflow_run_removed
             (job_id, workflow_name, request_digest, status, finished_at, removed_at)
         SELECT job_id, workflow_name, request_digest, status, updated_at, $6 FROM gone
         ON CONFLICT (job_id) DO NOTHING",
        doomed("$7")
    ))
    .bind(removal.status)
    .bind(removal.cutoff)
    .bind(removal.workflow)
    .bind(removal.except)
    .bind(limit)
    .bind(now)
    .bind(removal.passed_over)
    .bind(only)
    .execute(&mut *tx)
    .await;
    let removed = end(tx, removed).await?;
    Ok(Some(removed))
}

/// Up to `limit` ids of the runs `removal` names, oldest first, read
/// without locks: what a batch the store refused is tried as, one by one
/// ([`remove_one`]).
///
/// # Errors
/// Database errors.
pub async fn candidates(
    pool: &PgPool,
    removal: Removal<'_>,
    limit: i64,
) -> Result<Vec<Uuid>, sqlx::Error> {
    crate::sql::session(pool, async |conn| {
        crate::sql::query_scalar(&format!(
            "SELECT job_id FROM workflow_run WHERE {} ORDER BY created_at LIMIT $6",
            doomed("$5")
        ))
        .bind(removal.status)
        .bind(removal.cutoff)
        .bind(removal.workflow)
        .bind(removal.except)
        .bind(removal.passed_over)
        .bind(limit)
        .fetch_all(conn)
        .await
    })
    .await
}

/// Removes `job_id` with its record, if `removal` still names it, in a
/// transaction of its own; `None` when another member is removing runs.
///
/// # Errors
/// Database errors, among them the store refusing this run.
pub async fn remove_one(
    pool: &PgPool,
    removal: Removal<'_>,
    job_id: Uuid,
    now: DateTime<Utc>,
) -> Result<Option<u64>, sqlx::Error> {
    remove(pool, removal, 1, now, Some(job_id)).await
}

/// Forgets up to `limit` records of runs removed before `before` whose
/// events have all left the outbox (published, then deleted by the relay's
/// retention); `None` when another member is removing right now.
///
/// # Errors
/// Database errors.
pub async fn forget_removed(
    pool: &PgPool,
    before: DateTime<Utc>,
    limit: i64,
) -> Result<Option<u64>, sqlx::Error> {
    let Some(mut tx) = begin_alone(pool).await? else {
        return Ok(None);
    };
    // A record whose job still has events in the outbox stays: the same id
    // submitted as a new run would collide with them.
    let forgotten = crate::sql::query(
        "DELETE FROM workflow_run_removed WHERE job_id IN (
             SELECT rm.job_id FROM workflow_run_removed rm
             WHERE rm.removed_at < $1
               AND NOT EXISTS (SELECT 1 FROM workflow_run_outbox o WHERE o.job_id = rm.job_id)
             ORDER BY rm.removed_at LIMIT $2)",
    )
    .bind(before)
    .bind(limit)
    .execute(&mut *tx)
    .await;
    let forgotten = end(tx, forgotten).await?;
    Ok(Some(forgotten))
}

/// The record of `job_id`, if its run was removed within the horizon.
///
/// # Errors
/// Database errors.
pub async fn removed(
    conn: &mut PgConnection,
    job_id: Uuid,
) -> Result<Option<RemovedRun>, sqlx::Error> {
    crate::sql::query_as(
        "SELECT job_id, workflow_name, request_digest, status, finished_at, removed_at
         FROM workflow_run_removed WHERE job_id = $1",
    )
    .bind(job_id)
    .fetch_optional(conn)
    .await
}

/// How many runs of `status` finished before `cutoff` wait for removal,
/// counted up to `cap` (the backlog metric need not read a million rows).
///
/// # Errors
/// Database errors.
pub async fn backlog(
    pool: &PgPool,
    status: RunStatus,
    cutoff: DateTime<Utc>,
    cap: i64,
) -> Result<i64, sqlx::Error> {
    crate::sql::session(pool, async |conn| {
        crate::sql::query_scalar(
            "SELECT count(*) FROM (SELECT 1 FROM workflow_run
                 WHERE status = $1 AND created_at < $2 AND updated_at < $2 LIMIT $3) AS waiting",
        )
        .bind(status)
        .bind(cutoff)
        .bind(cap)
        .fetch_one(conn)
        .await
    })
    .await
}
