//! The request outbox of Kafka-target steps: rows written with the park
//! that waits for their replies, sent by the relay holding the job's
//! bucket, deleted once the broker acknowledged them.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

/// A request waiting to be sent.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PendingStepRequest {
    pub id: i64,
    pub job_id: Uuid,
    pub step_name: String,
    pub correlation_id: Uuid,
    pub topic: String,
    /// `avro` or `json`.
    pub encoding: String,
    /// The contract's JSON form, decoded only when sent: one row a newer or
    /// broken writer left must not fail the whole read.
    pub payload: Json<serde_json::Value>,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    pub bucket: i16,
    pub attempts: i32,
}

/// Up to `limit` requests of `buckets` due at `now`, oldest first.
///
/// # Errors
/// Database errors.
pub async fn pending(
    conn: &mut PgConnection,
    buckets: &[i16],
    now: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<PendingStepRequest>, sqlx::Error> {
    crate::sql::query_as(
        "SELECT id, job_id, step_name, correlation_id, topic, encoding, payload,
                traceparent, tracestate, bucket, attempts
         FROM workflow_step_request_outbox
         WHERE bucket = ANY($1) AND next_attempt_at <= $2
         ORDER BY id LIMIT $3",
    )
    .bind(buckets)
    .bind(now)
    .bind(limit)
    .fetch_all(conn)
    .await
}

/// Removes the requests the broker acknowledged.
///
/// # Errors
/// Database errors.
pub async fn delete_sent(conn: &mut PgConnection, ids: &[i64]) -> Result<u64, sqlx::Error> {
    if ids.is_empty() {
        return Ok(0);
    }
    let done = crate::sql::query("DELETE FROM workflow_step_request_outbox WHERE id = ANY($1)")
        .bind(ids)
        .execute(conn)
        .await?;
    Ok(done.rows_affected())
}

/// Puts a request that was not sent off until `next_attempt_at`, saying why.
///
/// # Errors
/// Database errors.
pub async fn defer(
    conn: &mut PgConnection,
    id: i64,
    error: &str,
    next_attempt_at: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    crate::sql::query(
        "UPDATE workflow_step_request_outbox
         SET attempts = attempts + 1, last_error = $2, next_attempt_at = $3 WHERE id = $1",
    )
    .bind(id)
    .bind(error)
    .bind(next_attempt_at)
    .execute(conn)
    .await?;
    Ok(())
}
