//! Rate limits of targets, fleet-wide (`workflow_target_call`): before a
//! call to a target with a `rate_limit`, a worker takes a permit, a row
//! stamped with the instant the call begins. A take counts the rows of the
//! last period under a lock on the target, so the count it reads is the
//! count it leaves: no window of the period ever holds more permits than
//! the limit (a sliding log, exact at the instants the workers' clocks
//! give). Rows past the period are deleted by the takes that follow.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgPool, PgTransaction};

use crate::StoreError;

/// What asking for a permit came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// The call may begin now.
    Granted,
    /// `calls` calls began within the last period: the next permit frees
    /// at this instant.
    FreeAt(DateTime<Utc>),
}

/// Takes a permit for a call to `target` at `now` when fewer than `calls`
/// calls to it began in the `period` before `now`.
///
/// # Errors
/// Database errors (the transaction is rolled back).
pub async fn take(
    pool: &PgPool,
    target: &str,
    (calls, period): (u32, Duration),
    now: DateTime<Utc>,
) -> Result<Permit, StoreError> {
    let mut tx = pool.begin().await?;
    let permit = take_in(&mut tx, target, (calls, period), now).await;
    crate::sql::end_transaction(tx, permit).await
}

async fn take_in(
    tx: &mut PgTransaction<'_>,
    target: &str,
    (calls, period): (u32, Duration),
    now: DateTime<Utc>,
) -> Result<Permit, StoreError> {
    let period = chrono::Duration::from_std(period).unwrap_or(chrono::Duration::MAX);
    let since = now - period;
    crate::sql::query(
        "SELECT pg_advisory_xact_lock(hashtextextended('flotilla.target-rate:' || $1, 0))",
    )
    .bind(target)
    .execute(&mut **tx)
    .await?;
    crate::sql::query("DELETE FROM workflow_target_call WHERE target = $1 AND began_at <= $2")
        .bind(target)
        .bind(since)
        .execute(&mut **tx)
        .await?;
    // The oldest of the last `calls` permits: the next one frees when it
    // leaves the window.
    let oldest_of_last: Option<DateTime<Utc>> = crate::sql::query_scalar(
        "SELECT began_at FROM workflow_target_call WHERE target = $1
         ORDER BY began_at DESC OFFSET $2 - 1 LIMIT 1",
    )
    .bind(target)
    .bind(i64::from(calls.max(1)))
    .fetch_optional(&mut **tx)
    .await?;
    if let Some(oldest) = oldest_of_last {
        return Ok(Permit::FreeAt(oldest + period));
    }
    crate::sql::query("INSERT INTO workflow_target_call (target, began_at) VALUES ($1, $2)")
        .bind(target)
        .bind(now)
        .execute(&mut **tx)
        .await?;
    Ok(Permit::Granted)
}
