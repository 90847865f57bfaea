//! Debounce: a request of a workflow with a `debounce` key cancels the jobs
//! of the same key that have not started yet, so a burst of requests makes
//! one job, the last one's.

use chrono::{DateTime, Utc};
use sqlx::PgTransaction;
use uuid::Uuid;

use super::idle::{self, IdleSettle};
use crate::StoreError;

/// Cancels, with their CANCELLED events, the jobs of `key` other than
/// `survivor` that are QUEUED and have not started (no attempt spent, no
/// checkpoint). Holds a lock on the key until the caller's transaction
/// ends, so two submissions of one key at once settle one after the
/// other: the later sees the earlier's job and cancels it. Returns the
/// jobs cancelled.
///
/// # Errors
/// Database errors; an event the contract refuses.
pub async fn supersede(
    tx: &mut PgTransaction<'_>,
    key: &str,
    survivor: Uuid,
    now: DateTime<Utc>,
) -> Result<Vec<Uuid>, StoreError> {
    crate::sql::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(key)
        .execute(&mut **tx)
        .await?;
    let waiting: Vec<Uuid> = crate::sql::query_scalar(
        "SELECT job_id FROM workflow_run
         WHERE debounce_key = $1 AND status = 'QUEUED' AND job_id <> $2
           AND attempt = 0 AND checkpoints = '[]'::jsonb AND NOT has_checkpoint_rows
         ORDER BY created_at
         FOR UPDATE",
    )
    .bind(key)
    .bind(survivor)
    .fetch_all(&mut **tx)
    .await?;
    let reason = format!("debounced: superseded by job {survivor}, a later request of its key");
    let mut cancelled = Vec::with_capacity(waiting.len());
    for job_id in waiting {
        if idle::settle_idle(tx, job_id, IdleSettle::Cancel { reason: &reason }, now).await? {
            cancelled.push(job_id);
        }
    }
    Ok(cancelled)
}
