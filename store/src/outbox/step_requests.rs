//! The request outbox of Kafka-target steps: rows written with the park
//! that waits for their replies, sent by the relay holding the job's
//! bucket, deleted once the broker acknowledged them, or once they are no
//! longer wanted ([`PendingStepRequest::unwanted_at`]).

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

use crate::RunStatus;
use crate::runs::step_requests::RequestEntry;

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
    /// The job's status now; `None`: the job is gone (removed, or never
    /// written).
    pub run_status: Option<RunStatus>,
    /// The step's entry in the run's `step_requests` now, unparsed: one
    /// broken entry must not fail the whole read.
    pub current: Option<Json<serde_json::Value>>,
}

/// Why a request waiting in the outbox is no longer worth sending: the
/// `reason` label of `flotilla_step_requests_dropped_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unwanted {
    /// Its deadline passed: the step timed out, or will before a reply.
    PastDeadline,
    /// The step's current request is another (a later attempt's, or the
    /// job was retried), or its entry does not read.
    Superseded,
    /// A reply was matched to it already.
    Answered,
    /// The job ended (cancelled, failed, completed).
    JobFinished,
    /// No such job any more.
    JobGone,
}

impl Unwanted {
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::PastDeadline => "past_deadline",
            Self::Superseded => "superseded",
            Self::Answered => "answered",
            Self::JobFinished => "job_finished",
            Self::JobGone => "job_gone",
        }
    }
}

impl PendingStepRequest {
    /// Why this request is not to be sent at `now`; `None`: send it.
    ///
    /// As of the read: a job cancelled, or a step timed out, between the
    /// read and the send still gets its request. No outbox can close that
    /// window (the send cannot commit with the row); the service's
    /// deadline (the `flotilla.deadline` header) and the dropped reply
    /// bound what it costs.
    #[must_use]
    pub fn unwanted_at(&self, now: DateTime<Utc>) -> Option<Unwanted> {
        match self.run_status {
            None => return Some(Unwanted::JobGone),
            Some(status) if status.is_finished() => return Some(Unwanted::JobFinished),
            Some(_) => {}
        }
        let entry = self
            .current
            .as_ref()
            .and_then(|Json(entry)| serde_json::from_value::<RequestEntry>(entry.clone()).ok())
            .filter(|entry| entry.correlation_id == self.correlation_id);
        let Some(entry) = entry else {
            return Some(Unwanted::Superseded);
        };
        if entry.reply.is_some() {
            Some(Unwanted::Answered)
        } else if entry.deadline <= now {
            Some(Unwanted::PastDeadline)
        } else {
            None
        }
    }
}

/// Up to `limit` requests of `buckets` due at `now`, oldest first, each
/// with its job's status and its step's current entry.
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
        "SELECT o.id, o.job_id, o.step_name, o.correlation_id, o.topic, o.encoding, o.payload,
                o.traceparent, o.tracestate, o.bucket, o.attempts,
                r.status AS run_status, r.step_requests -> o.step_name AS current
         FROM workflow_step_request_outbox o
         LEFT JOIN workflow_run r ON r.job_id = o.job_id
         WHERE o.bucket = ANY($1) AND o.next_attempt_at <= $2
         ORDER BY o.id LIMIT $3",
    )
    .bind(buckets)
    .bind(now)
    .bind(limit)
    .fetch_all(conn)
    .await
}

/// Removes requests that are done with: acknowledged by the broker, or no
/// longer wanted.
///
/// # Errors
/// Database errors.
pub async fn delete(conn: &mut PgConnection, ids: &[i64]) -> Result<u64, sqlx::Error> {
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
