//! What became of a batch's rows, written in one transaction: the rows
//! refused for themselves land FAILED, and each batch sent whole moves its
//! bucket's progress. Nothing is written per row published.

use super::{Class, Outcome, Reason};
use flotilla_store::outbox::relay::{self as outbox, Finished, PendingEvent, Refused, Snapshot};
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::time::Duration;

/// What one marking did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Acknowledged, in buckets still held and not held back by the world
    /// (their batch's progress moved, or a page of a batch under way).
    pub published: usize,
    /// Refused for themselves or unreadable: landed FAILED.
    pub failed: usize,
    /// Not sent or not acknowledged because of the world (broker or
    /// registry unreachable, a queue full, no acknowledgement in time):
    /// nothing written, their batch goes again after a pause.
    pub deferred: usize,
    /// The rows `failed` and `deferred` count, by class and reason.
    pub misses: BTreeMap<(Class, Reason), usize>,
}

/// Rows whose send has ended and batches sent whole, waiting to be
/// written in one transaction.
#[derive(Debug, Default)]
pub struct Marks {
    /// Acknowledged: their buckets.
    acked: Vec<i16>,
    /// Refused for themselves.
    refused: Vec<(PendingEvent, Reason, String)>,
    /// Held back by the world: nothing is written for them; their buckets.
    deferred: Vec<(i16, Reason)>,
    /// Rows whose payload does not decode.
    unreadable: Vec<(PendingEvent, String)>,
    /// Batches every row of which was acknowledged or landed FAILED.
    finished: Vec<Finished>,
}

impl Marks {
    /// Records how `row`'s send ended.
    pub fn record(&mut self, row: PendingEvent, outcome: Outcome) {
        match outcome {
            Outcome::Acked => self.acked.push(row.bucket),
            Outcome::Refused(reason, error) => self.refused.push((row, reason, error)),
            Outcome::Deferred(reason, error) => {
                tracing::debug!(event_id = %row.event_id, reason = reason.label(), %error,
                    "not published; its batch goes again");
                self.deferred.push((row.bucket, reason));
            }
            Outcome::Unreadable(error) => self.unreadable.push((row, error)),
        }
    }

    /// Records that `bucket`'s batch from `from` to `to` was sent whole:
    /// the mark moves its progress.
    pub fn finish(&mut self, bucket: i16, from: Snapshot, to: Snapshot) {
        self.finished.push(Finished { bucket, from, to });
    }

    #[must_use]
    pub fn acked(&self) -> usize {
        self.acked.len()
    }

    /// Rows recorded and batches finished.
    #[must_use]
    pub fn len(&self) -> usize {
        self.acked.len()
            + self.refused.len()
            + self.deferred.len()
            + self.unreadable.len()
            + self.finished.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bucket of every recorded row and finished batch, once each.
    pub fn buckets(&self) -> impl Iterator<Item = i16> + '_ {
        self.acked
            .iter()
            .copied()
            .chain(self.refused.iter().map(|(row, _, _)| row.bucket))
            .chain(self.deferred.iter().map(|(bucket, _)| *bucket))
            .chain(self.unreadable.iter().map(|(row, _)| row.bucket))
            .chain(self.finished.iter().map(|f| f.bucket))
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

    /// Lands the refused and unreadable rows FAILED and moves the finished
    /// batches' buckets, in one transaction, fenced on the buckets still
    /// held (and, for a move, on the progress the batch started from).
    ///
    /// The transaction is bounded by the bucket `lease`
    /// (`bound_transaction` in the crate root): a relay stalled inside it
    /// cannot hold the next owner up for longer.
    ///
    /// # Errors
    /// Database errors: nothing moved, the batches go again (same event ids).
    pub async fn mark(
        self,
        pool: &PgPool,
        relay_id: &str,
        lease: Duration,
    ) -> Result<DrainReport, sqlx::Error> {
        let mut failed: Vec<Refused> = Vec::new();
        for (row, reason, error) in &self.refused {
            tracing::warn!(event_id = %row.event_id, job_id = %row.job_id, sequence = row.sequence,
                reason = reason.label(), %error, "refused for itself; the row is FAILED");
            failed.push(Refused {
                key: row.key(),
                bucket: row.bucket,
                error: error.clone(),
            });
        }
        for (row, error) in &self.unreadable {
            tracing::error!(event_id = %row.event_id, job_id = %row.job_id, sequence = row.sequence, %error,
                "stored event does not decode; the row is FAILED");
            failed.push(Refused {
                key: row.key(),
                bucket: row.bucket,
                error: error.clone(),
            });
        }
        let mut tx = pool.begin().await?;
        crate::bound_transaction(&mut tx, lease).await?;
        if !failed.is_empty() {
            outbox::record_failed(&mut tx, relay_id, &failed).await?;
        }
        let moved = if self.finished.is_empty() {
            Vec::new()
        } else {
            outbox::advance(&mut tx, relay_id, &self.finished).await?
        };
        tx.commit().await?;
        let lost: Vec<i16> = self
            .finished
            .iter()
            .map(|f| f.bucket)
            .filter(|bucket| !moved.contains(bucket))
            .collect();
        if !lost.is_empty() {
            tracing::warn!(
                ?lost,
                "buckets lost before their batch's progress moved: the new owner sends it again"
            );
        }
        let held_back: Vec<i16> = self.deferred_buckets().collect();
        Ok(DrainReport {
            published: self
                .acked
                .iter()
                .filter(|b| !lost.contains(b) && !held_back.contains(b))
                .count(),
            failed: failed.len(),
            deferred: self.deferred.len(),
            misses: self.misses(),
        })
    }
}
