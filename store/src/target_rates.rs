//! Rate limits of targets, fleet-wide (`workflow_target_rate`): one row per
//! rate-limited target holding `last_at`, when its latest permitted call
//! began. A permit is granted when an interval (`period / calls`) has
//! passed since, and sets `last_at` to now, in one statement under the
//! row's lock: the generic cell rate algorithm with no burst. Permits are
//! therefore at least an interval apart, and no window of the period holds
//! more than `calls + 1` of them, whichever workers took them; a permit
//! costs the same at any rate, and a changed limit holds from the next
//! permit (the interval is the caller's, not stored).

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
    // Whole microseconds, as Postgres keeps instants; at least one.
    let interval = i64::try_from(period.as_micros() / u128::from(calls.max(1)))
        .unwrap_or(i64::MAX)
        .max(1);
    crate::sql::session(pool, async |conn| {
        let granted: Option<DateTime<Utc>> = crate::sql::query_scalar(
            "INSERT INTO workflow_target_rate AS r (target, last_at) VALUES ($1, $2)
             ON CONFLICT (target) DO UPDATE SET last_at = $2
             WHERE r.last_at + $3 * interval '1 microsecond' <= $2
             RETURNING last_at",
        )
        .bind(target)
        .bind(now)
        .bind(interval)
        .fetch_optional(&mut *conn)
        .await?;
        if granted.is_some() {
            return Ok(Permit::Granted);
        }
        let free_at: Option<DateTime<Utc>> = crate::sql::query_scalar(
            "SELECT last_at + $2 * interval '1 microsecond' FROM workflow_target_rate WHERE target = $1",
        )
        .bind(target)
        .bind(interval)
        .fetch_optional(&mut *conn)
        .await?;
        // Gone meanwhile (it never is): ask again at once.
        Ok(Permit::FreeAt(free_at.unwrap_or(now)))
    })
    .await
}
