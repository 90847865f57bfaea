//! Reading the outbox as a history: a job's timeline and the backlog, for
//! the console. Payloads are read as plain JSON, not as the
//! contract's type, so a row written by another version still shows.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

/// One event of a job as the timeline shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TimelineEntry {
    pub sequence: i64,
    pub event_type: String,
    /// When the commit point happened (the event's `occurred_at`; the row's
    /// creation when the payload lacks it).
    pub occurred_at: String,
    pub attempt: Option<i64>,
    /// The workflow version the job ran at that point, when it has one.
    pub workflow_version: Option<i64>,
    /// The job's metadata, as the event echoes it.
    pub metadata: Option<Value>,
    pub step_name: Option<String>,
    pub verdict: Option<String>,
    pub error: Option<String>,
    /// The row's publication state: PENDING, PUBLISHED or FAILED.
    pub publication: String,
}

#[derive(sqlx::FromRow)]
struct TimelineRow {
    sequence: i64,
    event_type: String,
    payload: Json<Value>,
    status: String,
    created_at: DateTime<Utc>,
}

/// The events of `job_id` still in the outbox, in sequence order (retention
/// deletes published rows after a while, so the first may be missing).
///
/// # Errors
/// Database errors.
pub async fn timeline(
    conn: &mut PgConnection,
    job_id: Uuid,
) -> Result<Vec<TimelineEntry>, sqlx::Error> {
    let rows: Vec<TimelineRow> = crate::sql::query_as(
        "SELECT o.sequence, o.event_type, coalesce(o.payload, o.body) AS payload, s.status, o.created_at
         FROM workflow_run_outbox o
         JOIN workflow_run_outbox_state s ON s.job_id = o.job_id AND s.sequence = o.sequence
         WHERE o.job_id = $1 ORDER BY o.sequence",
    )
    .bind(job_id)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(TimelineEntry::from).collect())
}

impl From<TimelineRow> for TimelineEntry {
    fn from(row: TimelineRow) -> Self {
        let payload = row.payload.0;
        let text = |key: &str| payload.get(key).and_then(Value::as_str).map(str::to_owned);
        Self {
            sequence: row.sequence,
            occurred_at: text("occurred_at").unwrap_or_else(|| row.created_at.to_rfc3339()),
            attempt: payload.get("attempt").and_then(Value::as_i64),
            workflow_version: payload.get("workflow_version").and_then(Value::as_i64),
            metadata: payload.get("metadata").filter(|m| m.is_object()).cloned(),
            step_name: text("step_name"),
            verdict: text("verdict"),
            error: text("error"),
            event_type: row.event_type,
            publication: row.status,
        }
    }
}

/// The outbox's state: what waits for the relay and what it gave up on.
#[derive(Debug, Clone, Default, sqlx::FromRow, serde::Serialize)]
pub struct OutboxSummary {
    pub pending: i64,
    pub failed: i64,
    pub oldest_pending_at: Option<DateTime<Utc>>,
}

/// Counts the rows past no bucket's progress ([`super::UNPUBLISHED`]) and
/// the FAILED ones.
///
/// # Errors
/// Database errors.
pub async fn summary(conn: &mut PgConnection) -> Result<OutboxSummary, sqlx::Error> {
    let mut tx = sqlx::Connection::begin(conn).await?;
    super::relay::prefer_indexes(&mut tx).await?;
    let summary = crate::sql::query_as(&format!(
        "SELECT u.pending, (SELECT count(*) FROM workflow_run_outbox_failed) AS failed,
                u.oldest AS oldest_pending_at
         FROM ({}) u",
        super::UNPUBLISHED
    ))
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(summary)
}
