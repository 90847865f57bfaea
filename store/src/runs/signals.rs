//! A job's signals: the row's `signals` array, oldest first.
//!
//! Whoever sends a signal appends it here (under the row lock) with an
//! event; the lease holder takes one with the checkpoint of the `wait_for`
//! step it answers (`TAKE_SIGNAL`); a park that finds one of its
//! signals arrived meanwhile requeues instead (`PENDING_ONE_OF_7`). The
//! sender's event counts in `foreign_events`, so it never moves the
//! holder's fence.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgTransaction;
use sqlx::types::Json;
use uuid::Uuid;

use super::{RunRow, STAMP};
use crate::StoreError;
use crate::outbox::{self, EventKind, EventStamp};

/// The most signals a row keeps. Consumed ones make room, oldest first; a
/// job holding this many unconsumed refuses the next.
pub const MAX_KEPT: usize = 100;

/// The most bytes (as JSON text) of signals a row keeps, taken ones
/// included: a signal rewrites the row's array, so this bounds what one
/// costs. One signal (a 64 KiB payload and a 16 KiB source at most)
/// always fits.
pub const MAX_KEPT_BYTES: usize = 1024 * 1024;

/// One signal as the row keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SignalEntry {
    /// Its number in the job, from 1, in the order received.
    pub seq: i64,
    pub name: String,
    pub idempotency_key: String,
    /// Digest of name, payload and source: a repeat of the key with other
    /// content is a conflict.
    pub digest: String,
    pub payload: serde_json::Value,
    pub source: serde_json::Value,
    /// The database's clock when it was received.
    pub received_at: DateTime<Utc>,
    /// The `wait_for` step that took it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumed_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumed_at: Option<DateTime<Utc>>,
}

impl SignalEntry {
    #[must_use]
    pub fn is_pending(&self) -> bool {
        self.consumed_at.is_none()
    }
}

/// Part of a checkpoint write's SET clause (the checkpoint is `$5`, the
/// time `$3`): a checkpoint that names a signal marks it consumed by its
/// step.
pub(super) const TAKE_SIGNAL: &str = "signals = CASE WHEN $5::jsonb -> 'signal' IS NULL THEN signals ELSE \
     (SELECT jsonb_agg(CASE WHEN e.s -> 'seq' = $5::jsonb -> 'signal' \
         THEN e.s || jsonb_build_object('consumed_by', $5::jsonb ->> 'name', 'consumed_at', $3::timestamptz) \
         ELSE e.s END ORDER BY e.o) \
      FROM jsonb_array_elements(signals) WITH ORDINALITY AS e(s, o)) END";

/// Whether the row holds an unconsumed signal named in the text array `$7`.
pub(super) const PENDING_ONE_OF_7: &str = "EXISTS (SELECT 1 FROM jsonb_array_elements(coalesce(signals, '[]'::jsonb)) AS e(s) \
     WHERE e.s ->> 'name' = ANY($7::text[]) AND e.s ->> 'consumed_at' IS NULL)";

/// The row's signals, oldest first.
///
/// # Errors
/// The column holds something else (a row another writer broke).
pub fn entries(row: &RunRow) -> Result<Vec<SignalEntry>, StoreError> {
    let Some(Json(signals)) = &row.signals else {
        return Ok(Vec::new());
    };
    serde_json::from_value(signals.clone()).map_err(|e| StoreError::Corrupt {
        job_id: row.job_id,
        reason: format!("its signals do not read: {e}"),
    })
}

/// How a received signal changes the job besides being kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Kept for a wait the job has not reached (or is running towards).
    Keep,
    /// The job waits for it: back to the queue now, with fresh attempts if
    /// it was parked.
    Requeue,
}

/// Writes `signals` (the whole array, the new signal `received` last) to
/// the unfinished, locked row of `job_id`, with its event. `false`: the
/// job is finished (nothing written).
///
/// # Errors
/// Database errors; an event the contract refuses.
pub async fn write(
    tx: &mut PgTransaction<'_>,
    job_id: Uuid,
    signals: &[SignalEntry],
    received: &SignalEntry,
    wake: Wake,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let requeue = match wake {
        Wake::Keep => "",
        Wake::Requeue => {
            ", attempt = CASE WHEN status = 'WAITING' THEN 0 ELSE attempt END, \
             status = 'QUEUED', outstanding_step = NULL, run_after = least(run_after, $3)"
        }
    };
    let stamp: Option<EventStamp> = crate::sql::query_as(&format!(
        "UPDATE workflow_run SET signals = $2, event_sequence = event_sequence + 1,
             foreign_events = foreign_events + 1, updated_at = $3{requeue}
         WHERE job_id = $1 AND status IN ('QUEUED', 'RUNNING', 'WAITING')
         RETURNING {STAMP}"
    ))
    .bind(job_id)
    .bind(Json(signals))
    .bind(now)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(stamp) = stamp else {
        return Ok(false);
    };
    let event = EventKind::SignalReceived {
        name: received.name.clone(),
        seq: received.seq,
    };
    outbox::insert(tx, &stamp, event, now).await?;
    Ok(true)
}

/// Whether `job_id` holds a signal named `name` that no step has taken:
/// read afresh (a signal accepted while the job runs is not in the row
/// its segment claimed).
///
/// # Errors
/// Database errors.
pub async fn has_pending(
    conn: &mut sqlx::PgConnection,
    job_id: uuid::Uuid,
    name: &str,
) -> Result<bool, sqlx::Error> {
    crate::sql::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM workflow_run r,
             jsonb_array_elements(CASE WHEN jsonb_typeof(r.signals) = 'array' THEN r.signals ELSE '[]'::jsonb END) AS e(s)
             WHERE r.job_id = $1 AND e.s ->> 'name' = $2 AND e.s ->> 'consumed_at' IS NULL)",
    )
    .bind(job_id)
    .bind(name)
    .fetch_one(conn)
    .await
}
