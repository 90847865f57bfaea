//! Rows whose send has ended, marked in one transaction, and what a
//! marking did.

use super::{Class, Outcome, Reason};
use chrono::{DateTime, Utc};
use flotilla_store::outbox::relay::{self as outbox, EventKey, PendingEvent};
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::time::Duration;

/// What one marking did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Acknowledged and marked PUBLISHED.
    pub published: usize,
    /// Refused for themselves (an attempt counted) or unreadable (FAILED).
    pub failed: usize,
    /// Not sent or not acknowledged because of the world (broker or
    /// registry unreachable, a queue full, no acknowledgement in time): no
    /// attempt spent, sent again after a pause.
    pub deferred: usize,
    /// The rows `failed` and `deferred` count, by class and reason.
    pub misses: BTreeMap<(Class, Reason), usize>,
}

/// Rows whose send has ended, waiting to be marked in one transaction.
#[derive(Debug, Default)]
pub struct Marks {
    /// Acknowledged: `(key, bucket)`.
    acked: Vec<(EventKey, i16)>,
    /// Refused for themselves: these count toward FAILED.
    refused: Vec<(PendingEvent, Reason, String)>,
    /// Held back by the world: nothing is written for them; their buckets.
    deferred: Vec<(i16, Reason)>,
    /// Rows whose payload does not decode.
    unreadable: Vec<(PendingEvent, String)>,
}

impl Marks {
    /// Records how `row`'s send ended.
    pub fn record(&mut self, row: PendingEvent, outcome: Outcome) {
        match outcome {
            Outcome::Acked => self.acked.push((row.key(), row.bucket)),
            Outcome::Refused(reason, error) => self.refused.push((row, reason, error)),
            Outcome::Deferred(reason, error) => {
                tracing::debug!(event_id = %row.event_id, reason = reason.label(), %error,
                    "not published; no attempt spent");
                self.deferred.push((row.bucket, reason));
            }
            Outcome::Unreadable(error) => self.unreadable.push((row, error)),
        }
    }

    #[must_use]
    pub fn acked(&self) -> usize {
        self.acked.len()
    }

    #[must_use]
    pub fn len(&self) -> usize {
        self.acked.len() + self.refused.len() + self.deferred.len() + self.unreadable.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bucket of every recorded row, once per row.
    pub fn buckets(&self) -> impl Iterator<Item = i16> + '_ {
        self.acked
            .iter()
            .map(|(_, bucket)| *bucket)
            .chain(self.refused.iter().map(|(row, _, _)| row.bucket))
            .chain(self.deferred.iter().map(|(bucket, _)| *bucket))
            .chain(self.unreadable.iter().map(|(row, _)| row.bucket))
    }

    /// Buckets with a row the world held back.
    pub fn deferred_buckets(&self) -> impl Iterator<Item = i16> + '_ {
        self.deferred.iter().map(|(bucket, _)| *bucket)
    }

    /// The misses recorded, by class and reason.
    fn misses(&self) -> BTreeMap<(Class, Reason), usize> {
        let mut misses = BTreeMap::new();
        let mut count = |class, reason| *misses.entry((class, reason)).or_default() += 1;
        for (_, reason, _) in &self.refused {
            count(Class::Message, *reason);
        }
        for _ in &self.unreadable {
            count(Class::Message, Reason::Invalid);
        }
        for (_, reason) in &self.deferred {
            count(Class::World, *reason);
        }
        misses
    }

    /// Marks acknowledged rows PUBLISHED in one statement and counts the
    /// refusals (backing them off, or landing them FAILED at the tenth
    /// attempt), in one transaction, fenced on the buckets still held.
    ///
    /// The transaction is bounded by the bucket `lease`
    /// (`bound_transaction` in the crate root): a relay stalled inside it cannot hold
    /// the next owner's marks of the same rows up for longer.
    ///
    /// # Errors
    /// Database errors: the rows stay PENDING and are published again (same event ids).
    pub async fn mark(
        self,
        pool: &PgPool,
        relay_id: &str,
        now: DateTime<Utc>,
        backoff_base: Duration,
        lease: Duration,
    ) -> Result<DrainReport, sqlx::Error> {
        let acked: Vec<EventKey> = self.acked.iter().map(|(key, _)| *key).collect();
        let mut tx = pool.begin().await?;
        crate::bound_transaction(&mut tx, lease).await?;
        outbox::prefer_indexes(&mut tx).await?;
        let marked = outbox::mark_published(&mut tx, relay_id, &acked, now).await?;
        if marked < acked.len() as u64 {
            tracing::warn!(
                acked = acked.len(),
                marked,
                "buckets lost before marking: their rows stay PENDING for the new owner"
            );
        }
        for (row, reason, error) in &self.refused {
            // This failure is attempt `attempts + 1`.
            let delay = flotilla_runtime::backoff::exponential(backoff_base, row.attempts + 1);
            let next = now + chrono::TimeDelta::from_std(delay).unwrap_or(chrono::TimeDelta::MAX);
            tracing::warn!(event_id = %row.event_id, job_id = %row.job_id, sequence = row.sequence, attempt = row.attempts + 1, reason = reason.label(), %error, "publish failed");
            outbox::record_failure(&mut tx, relay_id, row.key(), error, next).await?;
        }
        for (row, error) in &self.unreadable {
            tracing::error!(event_id = %row.event_id, job_id = %row.job_id, sequence = row.sequence, %error,
                "stored event does not decode; the row is FAILED");
            outbox::fail_now(&mut tx, relay_id, row.key(), error).await?;
        }
        tx.commit().await?;
        Ok(DrainReport {
            published: usize::try_from(marked).unwrap_or(usize::MAX),
            failed: self.refused.len() + self.unreadable.len(),
            deferred: self.deferred.len(),
            misses: self.misses(),
        })
    }
}
