//! `relay_member` and `relay_bucket`: which relay publishes which bucket.
//!
//! Job ids fall into [`BUCKETS`] buckets (a generated column of the outbox);
//! a bucket is leased to one relay at a time, so one job's events are always
//! published by one relay, in order. The fair-share policy that drives these
//! statements lives with the relay.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgTransaction};

/// How many buckets the outbox is split into (the schema's `% 64`).
pub const BUCKETS: i64 = 64;

/// Records that `relay_id` is alive at `now`.
///
/// # Errors
/// Database errors.
pub async fn heartbeat(
    conn: &mut PgConnection,
    relay_id: &str,
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO relay_member (relay_id, last_seen) VALUES ($1, $2)
         ON CONFLICT (relay_id) DO UPDATE SET last_seen = $2",
    )
    .bind(relay_id)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

/// How many relays were seen after `since`.
///
/// # Errors
/// Database errors.
pub async fn count_live(conn: &mut PgConnection, since: DateTime<Utc>) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM relay_member WHERE last_seen > $1")
        .bind(since)
        .fetch_one(conn)
        .await
}

/// Extends to `until` every bucket `relay_id` still holds at `now`; returns them.
///
/// # Errors
/// Database errors.
pub async fn renew_held(
    conn: &mut PgConnection,
    relay_id: &str,
    now: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<Vec<i16>, sqlx::Error> {
    sqlx::query_scalar(
        "UPDATE relay_bucket SET lease_until = $2 WHERE owner = $1 AND lease_until > $3
         RETURNING bucket",
    )
    .bind(relay_id)
    .bind(until)
    .bind(now)
    .fetch_all(conn)
    .await
}

/// Gives back `buckets` held by `relay_id`.
///
/// # Errors
/// Database errors.
pub async fn release(
    conn: &mut PgConnection,
    relay_id: &str,
    buckets: &[i16],
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE relay_bucket SET owner = NULL, lease_until = NULL WHERE bucket = ANY($1) AND owner = $2",
    )
    .bind(buckets)
    .bind(relay_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Leases up to `count` free or expired buckets to `relay_id` until `until`.
///
/// # Errors
/// Database errors.
pub async fn claim_free(
    conn: &mut PgConnection,
    relay_id: &str,
    now: DateTime<Utc>,
    until: DateTime<Utc>,
    count: i64,
) -> Result<Vec<i16>, sqlx::Error> {
    sqlx::query_scalar(
        "UPDATE relay_bucket SET owner = $1, lease_until = $2
         WHERE bucket IN (
             SELECT bucket FROM relay_bucket
             WHERE owner IS NULL OR lease_until <= $3
             ORDER BY bucket LIMIT $4 FOR UPDATE SKIP LOCKED)
         RETURNING bucket",
    )
    .bind(relay_id)
    .bind(until)
    .bind(now)
    .bind(count)
    .fetch_all(conn)
    .await
}

/// Forgets relays last seen before `before`.
///
/// # Errors
/// Database errors.
pub async fn forget_departed(
    conn: &mut PgConnection,
    before: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM relay_member WHERE last_seen < $1")
        .bind(before)
        .execute(conn)
        .await?;
    Ok(())
}

/// Gives back every bucket of `relay_id` and removes its membership, so the
/// others take over at once.
///
/// # Errors
/// Database errors.
pub async fn leave(tx: &mut PgTransaction<'_>, relay_id: &str) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE relay_bucket SET owner = NULL, lease_until = NULL WHERE owner = $1")
        .bind(relay_id)
        .execute(&mut **tx)
        .await?;
    sqlx::query("DELETE FROM relay_member WHERE relay_id = $1")
        .bind(relay_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
