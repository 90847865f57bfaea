//! Bucket ownership: every statement on `relay_member` and `relay_bucket`.
//!
//! Job ids fall into 64 buckets (a generated column of the outbox). A relay
//! publishes only rows of buckets it leases, so one job's events are always
//! published by one relay at a time, in order. Each relay heartbeats its
//! membership, counts the live relays, and moves towards its fair share
//! (`ceil(64 / live)`): it renews what it holds, releases what is above its
//! share, and claims free or expired buckets up to it. A relay that dies
//! stops renewing; its buckets expire after the lease and others take them.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

pub const BUCKETS: i64 = 64;

#[derive(Debug, Clone)]
pub struct BucketLeases {
    pool: PgPool,
    relay_id: String,
    ttl: Duration,
}

impl BucketLeases {
    #[must_use]
    pub fn new(pool: PgPool, relay_id: String, ttl: Duration) -> Self {
        Self {
            pool,
            relay_id,
            ttl,
        }
    }

    /// One ownership round; returns the buckets this relay holds now.
    ///
    /// # Errors
    /// Database errors.
    pub async fn rebalance(&self, now: DateTime<Utc>) -> Result<Vec<i16>, sqlx::Error> {
        let until = now + self.ttl;
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO relay_member (relay_id, last_seen) VALUES ($1, $2)
             ON CONFLICT (relay_id) DO UPDATE SET last_seen = $2",
        )
        .bind(&self.relay_id)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let live: i64 =
            sqlx::query_scalar("SELECT count(*) FROM relay_member WHERE last_seen > $1")
                .bind(now - self.ttl)
                .fetch_one(&mut *tx)
                .await?;
        let share = (BUCKETS + live.max(1) - 1) / live.max(1);
        let mut held: Vec<i16> = sqlx::query_scalar(
            "UPDATE relay_bucket SET lease_until = $2 WHERE owner = $1 AND lease_until > $3
             RETURNING bucket",
        )
        .bind(&self.relay_id)
        .bind(until)
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        held.sort_unstable();
        let held_count = i64::try_from(held.len()).unwrap_or(i64::MAX);
        if held_count > share {
            let extra: Vec<i16> = held.split_off(usize::try_from(share).unwrap_or(0));
            sqlx::query("UPDATE relay_bucket SET owner = NULL, lease_until = NULL WHERE bucket = ANY($1) AND owner = $2")
                .bind(&extra)
                .bind(&self.relay_id)
                .execute(&mut *tx)
                .await?;
        } else if held_count < share {
            let claimed: Vec<i16> = sqlx::query_scalar(
                "UPDATE relay_bucket SET owner = $1, lease_until = $2
                 WHERE bucket IN (
                     SELECT bucket FROM relay_bucket
                     WHERE owner IS NULL OR lease_until <= $3
                     ORDER BY bucket LIMIT $4 FOR UPDATE SKIP LOCKED)
                 RETURNING bucket",
            )
            .bind(&self.relay_id)
            .bind(until)
            .bind(now)
            .bind(share - held_count)
            .fetch_all(&mut *tx)
            .await?;
            held.extend(claimed);
            held.sort_unstable();
            held.dedup();
        }
        sqlx::query("DELETE FROM relay_member WHERE last_seen < $1")
            .bind(now - self.ttl * 10)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(held)
    }

    /// Gives every bucket back and leaves (on shutdown), so others take over at once.
    ///
    /// # Errors
    /// Database errors.
    pub async fn release_all(&self) -> Result<(), sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("UPDATE relay_bucket SET owner = NULL, lease_until = NULL WHERE owner = $1")
            .bind(&self.relay_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM relay_member WHERE relay_id = $1")
            .bind(&self.relay_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }
}
