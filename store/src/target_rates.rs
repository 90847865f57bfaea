//! Rate limits of targets, fleet-wide (`workflow_target_rate`): one row per
//! rate-limited target holding `next_at`, the earliest instant its next
//! call may begin. A permit is granted when `next_at` has come, and moves
//! it one interval (`period / calls`) past the later of itself and now, in
//! one statement under the row's lock: the generic cell rate algorithm
//! with no burst. Permits are therefore at least an interval apart, and no
//! window of the period holds more than `calls + 1` of them, whichever
//! workers took them; a permit costs the same at any rate.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::StoreError;

/// What asking for a permit came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// The call may begin now.
    Granted,
    /// The next permit frees at this instant.
    FreeAt(DateTime<Utc>),
}

/// Takes a permit for a call to `target` at `now`, under a rate of
/// `calls` per `period`.
///
/// # Errors
/// Database errors.
pub async fn take(
    pool: &PgPool,
    target: &str,
    (calls, period): (u32, Duration),
    now: DateTime<Utc>,
) -> Result<Permit, StoreError> {
    let interval = chrono::Duration::from_std(period / calls.max(1))
        .unwrap_or(chrono::Duration::MAX)
        .max(chrono::Duration::microseconds(1));
    crate::sql::session(pool, async |conn| {
        let granted: Option<DateTime<Utc>> = crate::sql::query_scalar(
            "INSERT INTO workflow_target_rate AS r (target, next_at) VALUES ($1, $2 + $3)
             ON CONFLICT (target) DO UPDATE SET next_at = greatest(r.next_at, $2) + $3
             WHERE r.next_at <= $2
             RETURNING next_at",
        )
        .bind(target)
        .bind(now)
        .bind(interval)
        .fetch_optional(&mut *conn)
        .await?;
        if granted.is_some() {
            return Ok(Permit::Granted);
        }
        let next_at: Option<DateTime<Utc>> =
            crate::sql::query_scalar("SELECT next_at FROM workflow_target_rate WHERE target = $1")
                .bind(target)
                .fetch_optional(&mut *conn)
                .await?;
        // Gone meanwhile (it never is): ask again at once.
        Ok(Permit::FreeAt(next_at.unwrap_or(now)))
    })
    .await
}
