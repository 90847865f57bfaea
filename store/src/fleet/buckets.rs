//! `relay_member` and `relay_bucket`: which relay publishes which bucket.
//!
//! Job ids fall into [`BUCKETS`] buckets (a generated column of the outbox);
//! a bucket is leased to one relay at a time, so one job's events are always
//! published by one relay, in order. The fair-share policy that drives these
//! statements lives with the relay. Every lease is stamped and compared with
//! the database's clock, so relays whose clocks disagree still agree on who
//! holds what.

use sqlx::{PgConnection, PgTransaction};

/// How many buckets the outbox is split into (the schema's `% 64`).
pub const BUCKETS: i64 = 64;

/// Records that `relay_id` is alive at `now`.
///
/// # Errors
/// Database errors.
pub async fn heartbeat(conn: &mut PgConnection, relay_id: &str) -> Result<(), sqlx::Error> {
    crate::sql::query(
        "INSERT INTO relay_member (relay_id, last_seen) VALUES ($1, now())
         ON CONFLICT (relay_id) DO UPDATE SET last_seen = now()",
    )
    .bind(relay_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// How many relays were seen within the last `ttl_ms` milliseconds.
///
/// # Errors
/// Database errors.
pub async fn count_live(conn: &mut PgConnection, ttl_ms: i64) -> Result<i64, sqlx::Error> {
    crate::sql::query_scalar(
        "SELECT count(*) FROM relay_member WHERE last_seen > now() - $1 * interval '1 millisecond'",
    )
    .bind(ttl_ms)
    .fetch_one(conn)
    .await
}

/// Extends by `ttl_ms` every bucket `relay_id` still holds; returns them.
/// A bucket whose lease ran out is not renewed: another relay may hold it.
///
/// # Errors
/// Database errors.
pub async fn renew_held(
    conn: &mut PgConnection,
    relay_id: &str,
    ttl_ms: i64,
) -> Result<Vec<i16>, sqlx::Error> {
    crate::sql::query_scalar(
        "UPDATE relay_bucket SET lease_until = now() + $2 * interval '1 millisecond'
         WHERE owner = $1 AND lease_until > now()
         RETURNING bucket",
    )
    .bind(relay_id)
    .bind(ttl_ms)
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
    crate::sql::query(
        "UPDATE relay_bucket SET owner = NULL, lease_until = NULL WHERE bucket = ANY($1) AND owner = $2",
    )
    .bind(buckets)
    .bind(relay_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Leases up to `count` free or expired buckets to `relay_id` for `ttl_ms`.
///
/// # Errors
/// Database errors.
pub async fn claim_free(
    conn: &mut PgConnection,
    relay_id: &str,
    ttl_ms: i64,
    count: i64,
) -> Result<Vec<i16>, sqlx::Error> {
    crate::sql::query_scalar(
        "UPDATE relay_bucket SET owner = $1, lease_until = now() + $2 * interval '1 millisecond'
         WHERE bucket IN (
             SELECT bucket FROM relay_bucket
             WHERE owner IS NULL OR lease_until <= now()
             ORDER BY bucket LIMIT $3 FOR UPDATE SKIP LOCKED)
         RETURNING bucket",
    )
    .bind(relay_id)
    .bind(ttl_ms)
    .bind(count)
    .fetch_all(conn)
    .await
}

/// Forgets relays not seen for `ttl_ms` milliseconds.
///
/// # Errors
/// Database errors.
pub async fn forget_departed(conn: &mut PgConnection, ttl_ms: i64) -> Result<(), sqlx::Error> {
    crate::sql::query(
        "DELETE FROM relay_member WHERE last_seen < now() - $1 * interval '1 millisecond'",
    )
    .bind(ttl_ms)
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
    crate::sql::query("UPDATE relay_bucket SET owner = NULL, lease_until = NULL WHERE owner = $1")
        .bind(relay_id)
        .execute(&mut **tx)
        .await?;
    crate::sql::query("DELETE FROM relay_member WHERE relay_id = $1")
        .bind(relay_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A relay as the fleet view shows it.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub struct RelayMember {
    pub relay_id: String,
    /// Buckets whose lease it holds now.
    pub buckets_held: i64,
    pub last_seen: chrono::DateTime<chrono::Utc>,
}

/// Relays seen within `ttl_ms`, with the buckets each holds.
///
/// # Errors
/// Database errors.
pub async fn members(
    conn: &mut PgConnection,
    ttl_ms: i64,
) -> Result<Vec<RelayMember>, sqlx::Error> {
    crate::sql::query_as(
        "SELECT m.relay_id, count(b.bucket) AS buckets_held, m.last_seen
         FROM relay_member m
         LEFT JOIN relay_bucket b ON b.owner = m.relay_id AND b.lease_until > now()
         WHERE m.last_seen > now() - $1 * interval '1 millisecond'
         GROUP BY m.relay_id, m.last_seen ORDER BY m.relay_id",
    )
    .bind(ttl_ms)
    .fetch_all(conn)
    .await
}
