//! Bucket ownership: each relay's fair share of the outbox's buckets.
//!
//! Each rebalance a relay heartbeats its membership, counts the live relays, and
//! moves towards its fair share (`ceil(64 / live)`): it renews what it holds,
//! releases what is above its share, and claims free or expired buckets up
//! to it. The relay rebalances every third of the lease's term, and the
//! buckets still held, on this process's clock, for at least the
//! producer's timeout, are what it checks before every send: a bucket lost
//! or possibly lost (this relay stalled past its lease) is published no
//! more, and a record already in the producer fails there before its
//! bucket can change hands. A bucket with rows on their way is given back
//! only once they are marked. Leases are stamped and compared with the
//! database's clock; the statements are in `flotilla_store::buckets`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_store::buckets::{self, BUCKETS};
use sqlx::PgPool;

/// The buckets this relay holds right now, shared with the publisher, and
/// until when by this process's own clock: the instant the renewal that
/// granted them was sent, plus the lease. That is never later than the
/// database's `lease_until`, so a relay that was stalled (paused, starved,
/// cut off) sends nothing once its lease may have passed, even before it
/// learns it lost the buckets.
#[derive(Debug, Clone, Default)]
pub struct HeldBuckets(Arc<Mutex<Held>>);

#[derive(Debug, Default)]
struct Held {
    buckets: HashSet<i16>,
    valid_until: Option<Instant>,
}

impl Held {
    /// Whether the lease is surely valid for `left` more.
    fn valid_for(&self, left: Duration) -> bool {
        self.valid_until
            .is_some_and(|until| Instant::now() + left < until)
    }
}

impl HeldBuckets {
    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set(&self, held: &[i16], valid_until: Instant) {
        let mut state = self.lock();
        state.buckets = held.iter().copied().collect();
        state.valid_until = Some(valid_until);
    }

    /// Keeps only the buckets still held (a renewal never adds any).
    fn retain(&self, still: &[i16], valid_until: Instant) {
        let mut state = self.lock();
        state.buckets.retain(|bucket| still.contains(bucket));
        state.valid_until = Some(valid_until);
    }

    fn clear(&self) {
        let mut state = self.lock();
        state.buckets.clear();
        state.valid_until = None;
    }

    /// Whether `bucket` is held now.
    #[must_use]
    pub fn holds(&self, bucket: i16) -> bool {
        self.holds_for(bucket, Duration::ZERO)
    }

    /// Whether `bucket` is held, surely for `left` more: a row of it may be
    /// handed to a producer whose records expire within `left`, so none of
    /// them can reach the broker after the lease may have passed to
    /// another relay (see [`crate::RelaySettings::send_window`]).
    #[must_use]
    pub fn holds_for(&self, bucket: i16, left: Duration) -> bool {
        let state = self.lock();
        state.valid_for(left) && state.buckets.contains(&bucket)
    }

    /// How many buckets are held (whatever the lease's age).
    #[must_use]
    pub fn count(&self) -> usize {
        self.lock().buckets.len()
    }

    /// The buckets held while the lease is surely valid, sorted.
    #[must_use]
    pub fn current(&self) -> Vec<i16> {
        self.current_for(Duration::ZERO)
    }

    /// The buckets held while the lease is surely valid for `left` more, sorted.
    #[must_use]
    pub fn current_for(&self, left: Duration) -> Vec<i16> {
        let state = self.lock();
        if !state.valid_for(left) {
            return Vec::new();
        }
        let mut held: Vec<i16> = state.buckets.iter().copied().collect();
        held.sort_unstable();
        held
    }
}

#[derive(Debug, Clone)]
pub struct BucketLeases {
    pool: PgPool,
    relay_id: String,
    ttl: Duration,
    held: HeldBuckets,
}

impl BucketLeases {
    #[must_use]
    pub fn new(pool: PgPool, relay_id: String, ttl: Duration) -> Self {
        Self {
            pool,
            relay_id,
            ttl,
            held: HeldBuckets::default(),
        }
    }

    #[must_use]
    pub fn relay_id(&self) -> &str {
        &self.relay_id
    }

    /// The buckets held, as the publisher checks them.
    #[must_use]
    pub fn held(&self) -> &HeldBuckets {
        &self.held
    }

    fn ttl_ms(&self) -> i64 {
        i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX)
    }

    /// One ownership round; returns the buckets this relay holds now.
    ///
    /// # Errors
    /// Database errors.
    pub async fn rebalance(&self) -> Result<Vec<i16>, sqlx::Error> {
        self.rebalance_keeping(&HashSet::new()).await
    }

    /// One ownership round that releases no bucket in `busy` (rows of it
    /// sent and not yet marked): a record still inside the producer could
    /// otherwise reach the broker after the next owner's later events. A
    /// bucket above the share that is busy is kept, renewed, but no longer
    /// sent from (it is not among those returned and held), and released
    /// by a later round once idle. Returns the buckets to send from.
    ///
    /// # Errors
    /// Database errors.
    pub async fn rebalance_keeping(&self, busy: &HashSet<i16>) -> Result<Vec<i16>, sqlx::Error> {
        let (id, ttl) = (self.relay_id.as_str(), self.ttl_ms());
        let sent = Instant::now();
        let mut tx = self.pool.begin().await?;
        crate::bound_transaction(&mut tx, self.ttl).await?;
        buckets::heartbeat(&mut tx, id).await?;
        let live = buckets::count_live(&mut tx, ttl).await?.max(1);
        let share = (BUCKETS + live - 1) / live;
        let mut held = buckets::renew_held(&mut tx, id, ttl).await?;
        held.sort_unstable();
        let held_count = i64::try_from(held.len()).unwrap_or(i64::MAX);
        if held_count > share {
            let excess = usize::try_from(held_count - share).unwrap_or(0);
            // The highest idle ones go now; busy ones stop being sent
            // from and wait until they are idle.
            let extra: Vec<i16> = held
                .iter()
                .rev()
                .filter(|bucket| !busy.contains(bucket))
                .take(excess)
                .copied()
                .collect();
            buckets::release(&mut tx, id, &extra).await?;
            held.retain(|bucket| !extra.contains(bucket));
            let keep = usize::try_from(share).unwrap_or(0);
            held.truncate(keep);
        } else if held_count < share {
            let claimed = buckets::claim_free(&mut tx, id, ttl, share - held_count).await?;
            held.extend(claimed);
            held.sort_unstable();
            held.dedup();
        }
        buckets::forget_departed(&mut tx, ttl.saturating_mul(10)).await?;
        tx.commit().await?;
        self.held.set(&held, sent + self.ttl);
        Ok(held)
    }

    /// Renews what is held without rebalancing (during a pass); a bucket
    /// whose lease ran out is dropped from [`BucketLeases::held`] at once.
    ///
    /// # Errors
    /// Database errors (then nothing is assumed lost or kept: the marks are fenced).
    pub async fn renew(&self) -> Result<(), sqlx::Error> {
        let sent = Instant::now();
        let still = flotilla_store::sql::session(&self.pool, async |conn| {
            buckets::renew_held(conn, &self.relay_id, self.ttl_ms()).await
        })
        .await?;
        let before = self.held.count();
        self.held.retain(&still, sent + self.ttl);
        if self.held.count() < before {
            tracing::warn!(relay = %self.relay_id, lost = before - self.held.count(),
                "bucket leases ran out; their rows are published no more by this relay");
        }
        Ok(())
    }

    /// Renews every third of the lease until dropped (the task is aborted).
    pub(crate) fn keep_renewing(&self) -> RenewalGuard {
        let leases = self.clone();
        let every = (self.ttl / 3).max(Duration::from_millis(10));
        RenewalGuard(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                if let Err(e) = leases.renew().await {
                    tracing::warn!(error = %e, "renewing bucket leases failed");
                }
            }
        }))
    }

    /// Gives every bucket back and leaves (on shutdown), so others take over at once.
    ///
    /// # Errors
    /// Database errors.
    pub async fn release_all(&self) -> Result<(), sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        crate::bound_transaction(&mut tx, self.ttl).await?;
        buckets::leave(&mut tx, &self.relay_id).await?;
        tx.commit().await?;
        self.held.clear();
        Ok(())
    }
}

/// Stops the renewals of a pass when dropped.
#[derive(Debug)]
pub(crate) struct RenewalGuard(tokio::task::JoinHandle<()>);

impl Drop for RenewalGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}
