//! Bucket ownership: each relay's fair share of the outbox's buckets.
//!
//! Each round a relay heartbeats its membership, counts the live relays, and
//! moves towards its fair share (`ceil(64 / live)`): it renews what it holds,
//! releases what is above its share, and claims free or expired buckets up
//! to it. A relay that dies stops renewing; its buckets expire after the
//! lease and others take them. The statements are in `flotilla_store::buckets`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use flotilla_store::buckets::{self, BUCKETS};
use sqlx::PgPool;

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
        let id = self.relay_id.as_str();
        let until = now + self.ttl;
        let mut tx = self.pool.begin().await?;
        buckets::heartbeat(&mut tx, id, now).await?;
        let live = buckets::count_live(&mut tx, now - self.ttl).await?.max(1);
        let share = (BUCKETS + live - 1) / live;
        let mut held = buckets::renew_held(&mut tx, id, now, until).await?;
        held.sort_unstable();
        let held_count = i64::try_from(held.len()).unwrap_or(i64::MAX);
        if held_count > share {
            let extra = held.split_off(usize::try_from(share).unwrap_or(0));
            buckets::release(&mut tx, id, &extra).await?;
        } else if held_count < share {
            let claimed = buckets::claim_free(&mut tx, id, now, until, share - held_count).await?;
            held.extend(claimed);
            held.sort_unstable();
            held.dedup();
        }
        buckets::forget_departed(&mut tx, now - self.ttl * 10).await?;
        tx.commit().await?;
        Ok(held)
    }

    /// Gives every bucket back and leaves (on shutdown), so others take over at once.
    ///
    /// # Errors
    /// Database errors.
    pub async fn release_all(&self) -> Result<(), sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        buckets::leave(&mut tx, &self.relay_id).await?;
        tx.commit().await
    }
}
