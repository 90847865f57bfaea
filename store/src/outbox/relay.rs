//! The relay's statements on the outbox: pending rows of its buckets,
//! marking, failure backoff, retention and the operator's replay.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

/// A PENDING row as the relay publishes it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PendingEvent {
    pub id: i64,
    pub event_id: Uuid,
    pub job_id: Uuid,
    pub sequence: i64,
    pub event_type: String,
    /// The row's bucket (of job ids), which a relay must hold to publish it.
    pub bucket: i16,
    /// The stored event, read raw: one row a newer or broken writer left
    /// must not fail the whole read (see `flotilla_contracts::json::decode_stored`).
    pub payload: Json<serde_json::Value>,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    pub attempts: i32,
}

/// The head of each job in `buckets`: per job, its lowest PENDING row, if
/// it is due. A job's next row is never among them while an earlier one is
/// PENDING (being sent, awaiting its acknowledgement or backing off), so a
/// relay that sends only what this returns, and reads again only after
/// marking, has at most one event of a job in flight and cannot put a later
/// one ahead of it. FAILED rows do not hold later ones back.
///
/// One ordered scan of the `(bucket, id)` index of PENDING rows per bucket,
/// oldest first, up to `limit` rows in all, taken from the buckets in the
/// order given (callers rotate it, so no bucket starves). A scan stops at
/// `limit` heads: its cost follows the rows returned and the later rows of
/// their jobs, not the backlog behind them or the published history.
///
/// # Errors
/// Database errors.
pub async fn publishable(
    conn: &mut PgConnection,
    buckets: &[i16],
    now: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<PendingEvent>, sqlx::Error> {
    sqlx::query_as(
        "SELECT head.* FROM unnest($1::smallint[]) AS owned(bucket)
         CROSS JOIN LATERAL (
             SELECT o.id, o.event_id, o.job_id, o.sequence, o.event_type, o.bucket, o.payload,
                    o.traceparent, o.tracestate, o.attempts
             FROM workflow_run_outbox o
             WHERE o.status = 'PENDING' AND o.bucket = owned.bucket AND o.next_attempt_at <= $2
               AND NOT EXISTS (
                   SELECT 1 FROM workflow_run_outbox earlier
                   WHERE earlier.job_id = o.job_id AND earlier.sequence < o.sequence
                     AND earlier.status = 'PENDING')
             ORDER BY o.id
             LIMIT $3) head
         LIMIT $3",
    )
    .bind(buckets)
    .bind(now)
    .bind(limit)
    .fetch_all(conn)
    .await
}

/// The fence of every relay write: the row's bucket is leased to this
/// relay, checked against the database's clock (not the relay's).
const HOLDS_BUCKET: &str = "EXISTS (SELECT 1 FROM relay_bucket b
    WHERE b.bucket = o.bucket AND b.owner = $9 AND b.lease_until > now())";

/// Marks rows PUBLISHED (the broker acknowledged them), only those of
/// buckets `relay_id` still holds; returns how many.
///
/// # Errors
/// Database errors.
pub async fn mark_published(
    conn: &mut PgConnection,
    relay_id: &str,
    ids: &[i64],
    now: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(&format!(
        "UPDATE workflow_run_outbox o SET status = 'PUBLISHED', published_at = $2, last_error = NULL
         WHERE o.id = ANY($1) AND o.status = 'PENDING' AND {}",
        HOLDS_BUCKET.replace("$9", "$3")
    ))
    .bind(ids)
    .bind(now)
    .bind(relay_id)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// Publish attempts a row gets before it lands FAILED.
pub const MAX_PUBLISH_ATTEMPTS: i32 = 10;

/// Counts a failed publish of row `id`: backs it off (`base × 2^(attempts−1)`)
/// or, at the tenth attempt, lands it FAILED with the error.
///
/// # Errors
/// Database errors.
pub async fn record_failure(
    conn: &mut PgConnection,
    relay_id: &str,
    id: i64,
    error: &str,
    next_attempt_at: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "UPDATE workflow_run_outbox o SET attempts = attempts + 1, last_error = $2, next_attempt_at = $3,
             status = CASE WHEN attempts + 1 >= $4 THEN 'FAILED' ELSE 'PENDING' END
         WHERE o.id = $1 AND o.status = 'PENDING' AND {}",
        HOLDS_BUCKET.replace("$9", "$5")
    ))
    .bind(id)
    .bind(error)
    .bind(next_attempt_at)
    .bind(MAX_PUBLISH_ATTEMPTS)
    .bind(relay_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Lands row `id` FAILED at once: it can never be published as it is (its
/// payload does not decode). An operator's replay puts it back.
///
/// # Errors
/// Database errors.
pub async fn fail_now(
    conn: &mut PgConnection,
    relay_id: &str,
    id: i64,
    error: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "UPDATE workflow_run_outbox o SET status = 'FAILED', attempts = attempts + 1, last_error = $2
         WHERE o.id = $1 AND o.status = 'PENDING' AND {}",
        HOLDS_BUCKET.replace("$9", "$3")
    ))
    .bind(id)
    .bind(error)
    .bind(relay_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Deletes up to `limit` PUBLISHED rows published before `cutoff`, if no
/// other relay is doing so right now (a transaction-scoped advisory lock):
/// `None` when another holds it.
///
/// # Errors
/// Database errors.
pub async fn delete_published_before(
    tx: &mut sqlx::PgTransaction<'_>,
    cutoff: DateTime<Utc>,
    limit: i64,
) -> Result<Option<u64>, sqlx::Error> {
    let mine: bool = sqlx::query_scalar(
        "SELECT pg_try_advisory_xact_lock(hashtext('flotilla:outbox-retention'))",
    )
    .fetch_one(&mut **tx)
    .await?;
    if !mine {
        return Ok(None);
    }
    let done = sqlx::query(
        "DELETE FROM workflow_run_outbox WHERE id IN (
             SELECT id FROM workflow_run_outbox WHERE status = 'PUBLISHED' AND published_at < $1
             ORDER BY published_at LIMIT $2)",
    )
    .bind(cutoff)
    .bind(limit)
    .execute(&mut **tx)
    .await?;
    Ok(Some(done.rows_affected()))
}

/// Operator action: FAILED rows (of one job, or all) back to PENDING with
/// fresh attempts. Returns how many.
///
/// # Errors
/// Database errors.
pub async fn replay_failed(
    conn: &mut PgConnection,
    job_id: Option<Uuid>,
    now: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE workflow_run_outbox SET status = 'PENDING', attempts = 0, next_attempt_at = $2
         WHERE status = 'FAILED' AND ($1::uuid IS NULL OR job_id = $1)",
    )
    .bind(job_id)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}
