//! Group commit: the fenced writes of many running jobs (checkpoints,
//! completions, parking, failures, requeues) share one transaction.
//!
//! A writer queues its change and waits for its own outcome; concurrent
//! changes gather while a commit is in flight (see `gather.rs`), so one
//! commit carries many, and a lone write commits at once. Each change is
//! written fenced on its own lease token (and, for a commit point, on the
//! event sequence its writer last saw), and each writer still waits for
//! its own write to be durable before its job runs its next step.
//!
//! How a batch fails decides who is told what:
//! - a lease lost for one job answers only that writer (its statement
//!   matched no row);
//! - a statement refused for its own data, or stopped by a row lock it
//!   could not get in time, answers only its writer; the rest of the batch
//!   is written again without it;
//! - a failure of the database before `COMMIT` answers every writer at
//!   once with that failure: nothing was written;
//! - a failure at `COMMIT` is ambiguous (the server may have written the
//!   commit record before the connection broke): every writer is told the
//!   outcome is unknown and nothing is redone, so a checkpoint can never be
//!   written twice; its job resumes from whatever is durable.
//!
//! Writes run on the engine's reserved connections, whose `lock_timeout`
//! and `statement_timeout` (see `Engine::new`) keep a row held by a foreign
//! session from freezing the batch, and each batch is bounded in time and
//! ordered by job id.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use flotilla_store::StoreError;
use flotilla_store::runs::lease::{self, Fence, Transition, Written};
use flotilla_store::wake::{Channel, Doorbell};
use sqlx::PgPool;
use uuid::Uuid;

use crate::run::gather::{Gather, Serve};

/// One fenced write.
#[derive(Debug)]
pub(crate) struct Write {
    job_id: Uuid,
    fence: Fence,
    now: DateTime<Utc>,
    change: Transition,
}

/// The group committer of one engine.
#[derive(Debug, Clone)]
pub(crate) struct GroupCommit(Gather<Committer>);

/// What writes a batch: the reserved pool, the time a batch may take, and
/// a count of commits for tests.
#[derive(Debug, Clone)]
pub(crate) struct Committer {
    pool: PgPool,
    /// Longest one batch (all its attempts) may take.
    bound: Duration,
    /// Rings the relays after every commit that wrote something: a batch's
    /// writes are commit points with their events (a requeue's run waits
    /// out its backoff, so no claim loop needs waking for it).
    doorbell: Doorbell,
    /// Batches committed (or tried), for tests.
    batches: Arc<AtomicU64>,
    /// Behind a transaction-mode pooler: the statement that sets the
    /// reserved connections' timeouts for each transaction (they cannot
    /// stay on a connection there).
    local_timeouts: Option<String>,
    #[cfg(any(test, feature = "test-support"))]
    faults: CommitFaults,
}

/// Commits that report a failure after they committed, for tests of the
/// ambiguous commit (a connection reset after the server wrote the commit
/// record).
#[cfg(any(test, feature = "test-support"))]
#[derive(Debug, Clone, Default)]
pub struct CommitFaults(Arc<std::sync::atomic::AtomicU32>);

#[cfg(any(test, feature = "test-support"))]
impl CommitFaults {
    /// The next `commits` commits are made and then reported failed.
    pub fn fail_after_commit(&self, commits: u32) {
        self.0.store(commits, Ordering::SeqCst);
    }

    fn take(&self) -> bool {
        self.0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

impl GroupCommit {
    /// Writes on `pool`; one batch may take up to `bound`.
    pub(crate) fn new(
        pool: PgPool,
        bound: Duration,
        doorbell: Doorbell,
        local_timeouts: Option<String>,
    ) -> Self {
        Self(Gather::new(Committer {
            pool,
            bound,
            doorbell,
            batches: Arc::default(),
            local_timeouts,
            #[cfg(any(test, feature = "test-support"))]
            faults: CommitFaults::default(),
        }))
    }

    #[cfg(any(test, feature = "test-support"))]
    pub(crate) fn faults(&self) -> &CommitFaults {
        &self.0.server_ref().faults
    }

    /// Writes `change` to `job_id` if `fence` still holds, in a transaction
    /// it may share with other jobs' changes; [`Written::Lost`] when the
    /// lease is lost or the change was already written (nothing written
    /// now).
    ///
    /// # Errors
    /// The database refused this change, failed, or cannot say whether the
    /// commit carrying it happened ([`StoreError::OutcomeUnknown`]).
    pub(crate) async fn write(
        &self,
        job_id: Uuid,
        fence: Fence,
        now: DateTime<Utc>,
        change: Transition,
    ) -> Result<Written, StoreError> {
        let write = Write {
            job_id,
            fence,
            now,
            change,
        };
        self.0.ask(write).await.unwrap_or_else(|| {
            Err(StoreError::OutcomeUnknown(
                "the batch carrying this write was abandoned".into(),
            ))
        })
    }
}

/// How one attempt at a batch failed.
enum Failed {
    /// Statement `index` (of the attempt's writes) failed before `COMMIT`.
    At(usize, StoreError),
    /// The database failed before `COMMIT`, or the attempt ran out of time
    /// before it: nothing was written.
    Before(StoreError),
    /// `COMMIT` was sent and failed, or its answer never came in time.
    AtCommit(String),
}

impl Serve for Committer {
    type Request = Write;
    /// `Ok(Written::Lost)`: the lease is lost and nothing was written.
    type Answer = Result<Written, StoreError>;
    const MAX_BATCH: usize = 64;

    async fn serve(&self, batch: Vec<Write>) -> Vec<Self::Answer> {
        self.batches.fetch_add(1, Ordering::Relaxed);
        metrics::histogram!("flotilla_group_commit_writes").record(batch.len() as f64);
        let deadline = tokio::time::Instant::now() + self.bound;
        let mut answers: Vec<Option<Self::Answer>> = batch.iter().map(|_| None).collect();
        // Rows are locked in job-id order, so two batches never wait on
        // each other's locks in a cycle.
        let mut pending: Vec<usize> = (0..batch.len()).collect();
        pending.sort_by_key(|&i| batch[i].job_id);
        // Once one row turned out held by another session, the next attempts
        // lock the batch's rows first, skipping held ones, so a handful of
        // held rows costs one lock timeout, not one each.
        let mut skip_held = false;
        while !pending.is_empty() {
            let writes: Vec<&Write> = pending.iter().map(|&i| &batch[i]).collect();
            match self.attempt(&writes, deadline, skip_held).await {
                Ok(outcomes) => {
                    if outcomes.iter().flatten().any(|w| w.is_written()) {
                        self.doorbell.ring(Channel::Outbox);
                    }
                    for (&i, written) in pending.iter().zip(outcomes) {
                        answers[i] = Some(written.ok_or(StoreError::RowHeld));
                    }
                    break;
                }
                // A statement the database answered with an error (refused
                // data, a row lock not had in time, a constraint) fails its
                // write alone; the others are tried again without it.
                Err(Failed::At(at, e)) if is_the_statements(&e) => {
                    tracing::debug!(error = %e, job_id = %batch[pending[at]].job_id,
                        "a write of a shared commit failed alone; writing the others again");
                    skip_held |= e.is_a_blocked_row();
                    answers[pending.remove(at)] = Some(Err(e));
                }
                Err(Failed::At(_, e) | Failed::Before(e)) => {
                    let shared = Arc::new(match e {
                        StoreError::Database(e) => e,
                        other => sqlx::Error::Protocol(other.to_string()),
                    });
                    for &i in &pending {
                        answers[i] = Some(Err(StoreError::Shared(shared.clone())));
                    }
                    break;
                }
                Err(Failed::AtCommit(reason)) => {
                    tracing::warn!(writes = pending.len(), %reason,
                        "a shared commit's outcome is unknown; its jobs resume from what is durable");
                    for &i in &pending {
                        answers[i] = Some(Err(StoreError::OutcomeUnknown(reason.clone())));
                    }
                    break;
                }
            }
        }
        answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| Err(StoreError::OutcomeUnknown("unanswered".into())))
            })
            .collect()
    }
}

/// Whether the database answered this statement with an error of its own
/// (not a failure of the connection or the pool).
fn is_the_statements(error: &StoreError) -> bool {
    matches!(error, StoreError::Database(sqlx::Error::Database(_))) || error.is_about_the_data()
}

impl Committer {
    /// One transaction carrying `writes`, in their order, before `deadline`;
    /// with `skip_held`, the rows are locked first and a write whose row
    /// another session holds is not tried (`None`).
    async fn attempt(
        &self,
        writes: &[&Write],
        deadline: tokio::time::Instant,
        skip_held: bool,
    ) -> Result<Vec<Option<Written>>, Failed> {
        let timed_out = || {
            StoreError::Shared(Arc::new(sqlx::Error::Protocol(format!(
                "a shared commit took longer than {:?}",
                self.bound
            ))))
        };
        let statements = async {
            let mut tx = self
                .pool
                .begin()
                .await
                .map_err(|e| Failed::Before(e.into()))?;
            if let Some(set) = &self.local_timeouts {
                flotilla_store::sql::query(set)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| Failed::Before(e.into()))?;
            }
            let held = if skip_held {
                let ids: Vec<Uuid> = writes.iter().map(|w| w.job_id).collect();
                lease::held_elsewhere(&mut tx, &ids)
                    .await
                    .map_err(|e| Failed::Before(e.into()))?
            } else {
                std::collections::HashSet::new()
            };
            let mut outcomes = Vec::with_capacity(writes.len());
            for (index, write) in writes.iter().enumerate() {
                if held.contains(&write.job_id) {
                    outcomes.push(None);
                    continue;
                }
                let written =
                    lease::transition(&mut tx, write.job_id, write.fence, write.now, &write.change)
                        .await
                        .map_err(|e| Failed::At(index, e))?;
                outcomes.push(Some(written));
            }
            Ok((tx, outcomes))
        };
        let (tx, outcomes) = tokio::time::timeout_at(deadline, statements)
            .await
            .map_err(|_| Failed::Before(timed_out()))??;
        if !outcomes.iter().flatten().any(|w| w.is_written()) {
            // Nothing to commit: release the connection clean.
            tx.rollback().await.map_err(|e| Failed::Before(e.into()))?;
            return Ok(outcomes);
        }
        match tokio::time::timeout_at(deadline, tx.commit()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(Failed::AtCommit(e.to_string())),
            Err(_) => {
                return Err(Failed::AtCommit(format!(
                    "no answer to COMMIT within {:?}",
                    self.bound
                )));
            }
        }
        #[cfg(any(test, feature = "test-support"))]
        if self.faults.take() {
            return Err(Failed::AtCommit(
                "injected: connection reset after COMMIT".into(),
            ));
        }
        Ok(outcomes)
    }
}

#[cfg(test)]
mod tests;
