//! An operator's retry that moves a job to another stored version of its
//! workflow: the checkpoints of the steps that run again are dropped (in
//! the row's array and its checkpoint rows), with their timers and the
//! unfinished children they started; the signals they took are given back
//! to be taken again; the rest are kept.

use chrono::{DateTime, Utc};
use sqlx::PgTransaction;
use sqlx::types::Json;
use uuid::Uuid;

use super::{COLUMNS, RunRow};

/// Where the retry moves the job.
#[derive(Debug)]
pub struct Onto<'a> {
    pub version: i32,
    /// The version's document: the row's copy becomes it, where the row
    /// keeps a copy (one that points at its version points at the new one).
    pub definition: &'a serde_json::Value,
    pub max_attempts: i32,
    /// The layout a worker must read to run the new version.
    pub reader_level: i16,
    /// The new version's `execution_timeout_ms`, counted from the retry.
    pub execution_timeout_ms: Option<i64>,
    /// The steps whose checkpoints go: they run again.
    pub run_again: &'a [String],
    /// The version's concurrency key for the job's input, and its limit.
    pub concurrency: Option<(&'a str, i32)>,
}

/// As [`super::idle::retry`], onto `onto`'s version, in the caller's
/// transaction. `None` when the job is not DEAD, FAILED or CANCELLED.
///
/// # Errors
/// Database errors.
pub async fn retry_onto(
    tx: &mut PgTransaction<'_>,
    job_id: Uuid,
    now: DateTime<Utc>,
    onto: &Onto<'_>,
) -> Result<Option<RunRow>, sqlx::Error> {
    let moved: Option<Uuid> = crate::sql::query_scalar(
        "UPDATE workflow_run SET status = 'QUEUED', attempt = 0, run_after = $2, updated_at = $2,
             error = NULL, verdict = NULL, result = NULL, outstanding_step = NULL,
             lease_losses = 0, unplaced_since = NULL, compensation = NULL, cancel_requested = NULL,
             step_requests = NULL, reply_deadline = NULL, wake_at = NULL, failed_attempts = '{}', holds_slot = false,
             workflow_version = $3,
             definition = CASE WHEN definition IS NULL THEN NULL ELSE $4 END,
             max_attempts = $5, reader_level = greatest(reader_level, $6),
             expires_at = $2 + $7 * interval '1 millisecond',
             concurrency_key = $9, concurrency_limit = $10,
             checkpoints = (SELECT coalesce(jsonb_agg(e ORDER BY n), '[]'::jsonb)
                            FROM jsonb_array_elements(CASE WHEN jsonb_typeof(checkpoints) = 'array' THEN checkpoints ELSE '[]'::jsonb END) WITH ORDINALITY AS t(e, n)
                            WHERE NOT (e ->> 'name' = ANY($8))),
             timers = (SELECT jsonb_object_agg(k, v)
                       FROM jsonb_each(CASE WHEN jsonb_typeof(timers) = 'object' THEN timers ELSE '{}'::jsonb END) AS t(k, v)
                       WHERE NOT (k = ANY($8)) AND k NOT LIKE 'deadline:%'),
             signals = (SELECT jsonb_agg(CASE WHEN e ->> 'consumed_by' = ANY($8)
                                         THEN e - 'consumed_by' - 'consumed_at' ELSE e END ORDER BY n)
                        FROM jsonb_array_elements(CASE WHEN jsonb_typeof(signals) = 'array' THEN signals ELSE '[]'::jsonb END)
                             WITH ORDINALITY AS g(e, n)),
             children = (SELECT jsonb_object_agg(k, v)
                         FROM jsonb_each(CASE WHEN jsonb_typeof(children) = 'object' THEN children ELSE '{}'::jsonb END) AS c(k, v)
                         WHERE v ->> 'status' = 'COMPLETED' AND NOT (k = ANY($8)))
         WHERE job_id = $1 AND status IN ('DEAD', 'FAILED', 'CANCELLED')
         RETURNING job_id",
    )
    .bind(job_id)
    .bind(now)
    .bind(onto.version)
    .bind(Json(onto.definition))
    .bind(onto.max_attempts)
    .bind(onto.reader_level)
    .bind(onto.execution_timeout_ms)
    .bind(onto.run_again)
    .bind(onto.concurrency.map(|(key, _)| key))
    .bind(onto.concurrency.map(|(_, limit)| limit))
    .fetch_optional(&mut **tx)
    .await?;
    if moved.is_none() {
        return Ok(None);
    }
    crate::sql::query(
        "DELETE FROM workflow_run_checkpoint WHERE job_id = $1 AND entry ->> 'name' = ANY($2)",
    )
    .bind(job_id)
    .bind(onto.run_again)
    .execute(&mut **tx)
    .await?;
    crate::sql::query_as(&format!(
        "SELECT {COLUMNS} FROM workflow_run WHERE job_id = $1"
    ))
    .bind(job_id)
    .fetch_optional(&mut **tx)
    .await
}
