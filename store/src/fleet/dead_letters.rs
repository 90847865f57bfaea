//! `dead_letter_tally`: how many requests were dead-lettered, by reason code,
//! across the fleet. The dead-letter topic holds each request and its reason;
//! this table only counts them, so the console can show them by reason
//! without reading the topic.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

/// Dead letters of one reason.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub struct Tally {
    /// The reason code, as in the dead letter's `flotilla.dlq.code` header.
    pub reason: String,
    pub count: i64,
    pub last_at: DateTime<Utc>,
}

/// Counts one dead letter per entry of `codes`, in one statement.
///
/// # Errors
/// Database errors.
pub async fn record(conn: &mut PgConnection, codes: &[&str]) -> Result<(), sqlx::Error> {
    if codes.is_empty() {
        return Ok(());
    }
    crate::sql::query(
        "INSERT INTO dead_letter_tally (code, count, last_at)
         SELECT code, count(*), now() FROM unnest($1::text[]) AS letters(code) GROUP BY code
         ON CONFLICT (code) DO UPDATE
         SET count = dead_letter_tally.count + EXCLUDED.count, last_at = EXCLUDED.last_at",
    )
    .bind(codes)
    .execute(conn)
    .await?;
    Ok(())
}

/// Every reason seen, most frequent first.
///
/// # Errors
/// Database errors.
pub async fn list(conn: &mut PgConnection) -> Result<Vec<Tally>, sqlx::Error> {
    crate::sql::query_as(
        "SELECT code AS reason, count, last_at FROM dead_letter_tally ORDER BY count DESC, code",
    )
    .fetch_all(conn)
    .await
}
