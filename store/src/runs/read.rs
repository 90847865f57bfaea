//! Reading runs: one by id (with or without its lock), its outline or
//! definition under the lock, pages of them by filter, the timer backlog.

use crate::status::RunStatus;
use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, Postgres, QueryBuilder};
use uuid::Uuid;

use super::*;

/// Jobs waiting on timers: how many sleep past `now`, and since when the
/// oldest whose instant has come is still waiting to be claimed.
///
/// Counts the QUEUED jobs that have reached a timer (a timer-ful job
/// queued for a retry counts too); a wait's deadline is no timer.
///
/// # Errors
/// Database errors.
pub async fn timer_backlog(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
) -> Result<(i64, Option<DateTime<Utc>>), sqlx::Error> {
    crate::sql::query_as(
        "SELECT count(*) FILTER (WHERE run_after > $1), min(run_after) FILTER (WHERE run_after <= $1)
         FROM workflow_run WHERE status = 'QUEUED' AND timers IS NOT NULL
           AND jsonb_typeof(timers) = 'object'
           AND EXISTS (SELECT 1 FROM jsonb_object_keys(timers) AS k WHERE k NOT LIKE 'deadline:%')",
    )
    .bind(now)
    .fetch_one(conn)
    .await
}

/// The row of `job_id`.
///
/// # Errors
/// Database errors.
pub async fn get(conn: &mut PgConnection, job_id: Uuid) -> Result<Option<RunRow>, sqlx::Error> {
    crate::sql::query_as(&format!(
        "SELECT {COLUMNS} FROM workflow_run WHERE job_id = $1"
    ))
    .bind(job_id)
    .fetch_optional(conn)
    .await
}

/// Which of `job_ids` are finished (COMPLETED, FAILED, DEAD or
/// CANCELLED): one probe of the primary key each, for the waits of the API.
///
/// # Errors
/// Database errors.
pub async fn finished_among(
    conn: &mut PgConnection,
    job_ids: &[Uuid],
) -> Result<Vec<Uuid>, sqlx::Error> {
    crate::sql::query_scalar(
        "SELECT job_id FROM workflow_run
         WHERE job_id = ANY($1) AND status IN ('COMPLETED', 'FAILED', 'DEAD', 'CANCELLED')",
    )
    .bind(job_ids)
    .fetch_all(conn)
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
    let mut row: Option<RunRow> = crate::sql::query_as(&format!(
        "SELECT {COLUMNS} FROM workflow_run WHERE job_id = $1 FOR UPDATE"
    ))
    .bind(job_id)
    .fetch_optional(&mut *conn)
    .await?;
    reread_checkpoint_rows(conn, row.as_mut_slice()).await?;
    Ok(row)
}

/// The row of `job_id` locked until the transaction ends, its checkpoints
/// in outline only (no answers; see `checkpoint_outline`): for a change that
/// judges the job's graph but never replays it (a signal). The lock is
/// taken first, in a statement of its own, so the outline, read next,
/// sees every checkpoint committed before it.
///
/// # Errors
/// Database errors.
pub async fn outline_for_update(
    conn: &mut PgConnection,
    job_id: Uuid,
) -> Result<Option<RunRow>, sqlx::Error> {
    let locked: Option<i32> =
        crate::sql::query_scalar("SELECT 1 FROM workflow_run WHERE job_id = $1 FOR UPDATE")
            .bind(job_id)
            .fetch_optional(&mut *conn)
            .await?;
    if locked.is_none() {
        return Ok(None);
    }
    crate::sql::query_as(&format!(
        "SELECT {OUTLINE_COLUMNS} FROM workflow_run WHERE job_id = $1"
    ))
    .bind(job_id)
    .fetch_optional(conn)
    .await
}

/// The definition `job_id` runs: its own copy, or the stored version it
/// points at (`None`: no such job).
///
/// # Errors
/// Database errors.
pub async fn definition_of(
    conn: &mut PgConnection,
    job_id: Uuid,
) -> Result<Option<serde_json::Value>, sqlx::Error> {
    let found: Option<Json<serde_json::Value>> = crate::sql::query_scalar(
        "SELECT coalesce(definition, (SELECT d.definition FROM workflow_definition d \
             WHERE d.name = workflow_name AND d.version = workflow_version), 'null'::jsonb) \
         FROM workflow_run WHERE job_id = $1",
    )
    .bind(job_id)
    .fetch_optional(conn)
    .await?;
    Ok(found.map(|Json(definition)| definition))
}

/// Which jobs a listing returns.
#[derive(Debug, Clone, Default)]
pub struct ListFilter<'a> {
    pub status: Option<RunStatus>,
    pub workflow_name: Option<&'a str>,
    /// Only jobs strictly older than this `(created_at, job_id)` cursor.
    pub before: Option<(DateTime<Utc>, Uuid)>,
    /// Only jobs created at or after this time.
    pub created_after: Option<DateTime<Utc>>,
    /// Only jobs created strictly before this time.
    pub created_before: Option<DateTime<Utc>>,
    /// Only jobs whose metadata holds every entry of this object.
    pub metadata: Option<&'a serde_json::Value>,
}

/// Up to `limit` jobs matching `filter`, newest first.
///
/// The statement names only the filters that are set, and the status as a
/// literal: the status index is partial (it leaves out the statuses every
/// claim and completion write), and the planner can use a partial index only
/// when the statement itself proves the predicate, which a `$1` in a generic
/// plan never does.
///
/// # Errors
/// Database errors.
pub async fn list(
    conn: &mut PgConnection,
    filter: &ListFilter<'_>,
    limit: i64,
) -> Result<Vec<RunRow>, sqlx::Error> {
    list_statement(filter, limit)
        .build_query_as()
        .persistent(crate::sql::keep_prepared())
        .fetch_all(conn)
        .await
}

/// The statement [`list`] runs, its arguments bound in the order the filters
/// are declared, the limit last.
#[must_use]
pub fn list_statement<'a>(filter: &ListFilter<'a>, limit: i64) -> QueryBuilder<'a, Postgres> {
    let mut query =
        QueryBuilder::<Postgres>::new(format!("SELECT {COLUMNS} FROM workflow_run WHERE TRUE"));
    if let Some(status) = filter.status {
        // A word from the enum, never text from outside.
        query.push(format_args!(" AND status = '{}'", status.as_str()));
    }
    if let Some(name) = filter.workflow_name {
        query.push(" AND workflow_name = ").push_bind(name);
    }
    if let Some((at, job_id)) = filter.before {
        query
            .push(" AND (created_at, job_id) < (")
            .push_bind(at)
            .push(", ")
            .push_bind(job_id)
            .push(")");
    }
    if let Some(after) = filter.created_after {
        query.push(" AND created_at >= ").push_bind(after);
    }
    if let Some(before) = filter.created_before {
        query.push(" AND created_at < ").push_bind(before);
    }
    if let Some(metadata) = filter.metadata {
        // `@>` over the partial GIN index (`metadata IS NOT NULL` follows
        // from the strict operator).
        query
            .push(" AND metadata @> ")
            .push_bind(sqlx::types::Json(metadata))
            .push("::jsonb");
    }
    query
        .push(" ORDER BY created_at DESC, job_id DESC LIMIT ")
        .push_bind(limit);
    query
}
