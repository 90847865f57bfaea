//! `finished_tally`: jobs finished per minute and final state, added to by
//! every worker from its own counts (see the engine's `services/finished_tally.rs`),
//! so that the fleet's last hour is a few rows to read at any history.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

/// Jobs that finished in one minute with one final state.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct FinishedInMinute {
    /// The start of the minute.
    pub minute: DateTime<Utc>,
    pub status: String,
    pub count: i64,
}

/// Adds `counts` to the tally, in one statement.
///
/// # Errors
/// Database errors.
pub async fn add(conn: &mut PgConnection, counts: &[FinishedInMinute]) -> Result<(), sqlx::Error> {
    if counts.is_empty() {
        return Ok(());
    }
    let minutes: Vec<DateTime<Utc>> = counts.iter().map(|c| c.minute).collect();
    let statuses: Vec<&str> = counts.iter().map(|c| c.status.as_str()).collect();
    let numbers: Vec<i64> = counts.iter().map(|c| c.count).collect();
    crate::sql::query(
        "INSERT INTO finished_tally (minute, status, count)
         SELECT * FROM unnest($1::timestamptz[], $2::text[], $3::bigint[])
         ON CONFLICT (minute, status) DO UPDATE SET count = finished_tally.count + EXCLUDED.count",
    )
    .bind(&minutes)
    .bind(&statuses)
    .bind(&numbers)
    .execute(conn)
    .await?;
    Ok(())
}

/// The tally's minutes since `since`, oldest first.
///
/// # Errors
/// Database errors.
pub async fn since(
    conn: &mut PgConnection,
    since: DateTime<Utc>,
) -> Result<Vec<FinishedInMinute>, sqlx::Error> {
    crate::sql::query_as(
        "SELECT minute, status, count FROM finished_tally WHERE minute >= $1 ORDER BY minute, status",
    )
    .bind(since)
    .fetch_all(conn)
    .await
}

/// Forgets the minutes before `before`.
///
/// # Errors
/// Database errors.
pub async fn forget_before(
    conn: &mut PgConnection,
    before: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let done = crate::sql::query("DELETE FROM finished_tally WHERE minute < $1")
        .bind(before)
        .execute(conn)
        .await?;
    Ok(done.rows_affected())
}
