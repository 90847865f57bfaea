//! Leased rows: the claim, the fenced writes of the lease holder, and the
//! sweep of leases that lapsed.
//!
//! Every write to a RUNNING row is conditioned on the lease token it was
//! claimed with (a fresh UUID per claim, never reused); a write that matches
//! no row means the lease is gone and nothing was written.
//!
//! A cancel asked of a RUNNING job (`request_cancel`) is honoured by
//! whatever takes the job out of RUNNING next: its holder's transition
//! (CANCELLED instead of parked, asleep, finished or queued again), or the
//! sweep of its lapsed lease. Only a shutdown's `hand_back_all` leaves the
//! ask on the QUEUED row, eligible at once: the next claim honours it
//! before anything is called.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use super::{COLUMNS, COLUMNS_BUT_CHECKPOINT_ROWS, RunRow, reread_checkpoint_rows};

mod sweep;
mod transition;
mod write;

pub use sweep::{
    Lapsed, SweepPolicy, Swept, SweptLease, defer_sweep, hand_back_all, lapsed, sweep_one,
};
pub use transition::{Fence, Transition};
pub use write::{Written, held_elsewhere, transition};

/// Claims up to `limit` of the oldest eligible QUEUED rows this release
/// can read ([`super::READER_LEVEL`]) in one statement: flips them to RUNNING, stamps the lease and a fresh token per
/// row (never reused), and counts the attempt. Rows come back oldest first,
/// the checkpoint rows of resumed runs read in a second statement
/// (see `reread_checkpoint_rows`): a run whose list Postgres cannot build
/// comes back with [`RunRow::unreadable`] set, beside the others.
///
/// # Errors
/// Database errors.
pub async fn claim(
    conn: &mut PgConnection,
    worker_id: &str,
    now: DateTime<Utc>,
    lease_until: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<RunRow>, sqlx::Error> {
    let mut rows: Vec<RunRow> = crate::sql::query_as(&format!(
        "WITH picked AS (
             SELECT job_id AS picked_id FROM workflow_run
             WHERE status = 'QUEUED' AND run_after <= $2 AND reader_level <= $5
             ORDER BY run_after, created_at
             LIMIT $4
             FOR UPDATE SKIP LOCKED)
         UPDATE workflow_run SET status = 'RUNNING', lease_owner = $1,
             lease_token = gen_random_uuid(), lease_until = $3,
             attempt = attempt + 1, updated_at = $2, wake_at = NULL
         FROM picked WHERE job_id = picked_id
         RETURNING {COLUMNS_BUT_CHECKPOINT_ROWS}"
    ))
    .bind(worker_id)
    .bind(now)
    .bind(lease_until)
    .bind(limit)
    .bind(super::READER_LEVEL)
    .fetch_all(&mut *conn)
    .await?;
    reread_checkpoint_rows(conn, &mut rows).await?;
    rows.sort_by_key(|row| (row.run_after, row.created_at));
    Ok(rows)
}

/// Extends the lease of `token` on `job_id`; `false` when the lease is gone.
///
/// # Errors
/// Database errors.
pub async fn renew(
    conn: &mut PgConnection,
    job_id: Uuid,
    token: Uuid,
    now: DateTime<Utc>,
    lease_until: DateTime<Utc>,
) -> Result<Renewal, sqlx::Error> {
    let renewed: Option<(Option<String>,)> = crate::sql::query_as(
        "UPDATE workflow_run SET lease_until = $4, updated_at = $3
         WHERE job_id = $1 AND lease_token = $2 AND status = 'RUNNING'
         RETURNING cancel_requested",
    )
    .bind(job_id)
    .bind(token)
    .bind(now)
    .bind(lease_until)
    .fetch_optional(conn)
    .await?;
    Ok(match renewed {
        None => Renewal::Lost,
        Some((None,)) => Renewal::Held,
        Some((Some(reason),)) => Renewal::CancelAsked(reason),
    })
}

/// What a renewal found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renewal {
    Held,
    /// Another worker holds the job, or it is no longer RUNNING.
    Lost,
    /// Still held, and someone asked to cancel the job: their reason.
    CancelAsked(String),
}

/// Asks the worker running `job_id` to cancel it with `reason`: recorded in
/// the row (the first ask is kept), no event, nothing the holder's fence
/// compares. `None`: the job is not RUNNING. The holder's heartbeat sees
/// the ask; its next transition out of RUNNING honours it in any case
/// (see [`Written::Cancelled`]), so a segment that parks, sleeps, ends or
/// hands the job back first still leaves it CANCELLED.
///
/// # Errors
/// Database errors.
pub async fn request_cancel(
    conn: &mut PgConnection,
    job_id: Uuid,
    reason: &str,
) -> Result<Option<super::RunRow>, sqlx::Error> {
    crate::sql::query_as(&format!(
        "UPDATE workflow_run SET cancel_requested = coalesce(cancel_requested, $2)
         WHERE job_id = $1 AND status = 'RUNNING'
         RETURNING {COLUMNS}"
    ))
    .bind(job_id)
    .bind(reason)
    .fetch_optional(conn)
    .await
}
