//! Submitting a batch from the request topic: one transaction for the
//! whole batch on the happy path, with every row inserted in one statement
//! and every first event in another. When the database refuses one request's
//! content, the batch is written again with a savepoint around each
//! request, so that request alone becomes [`SubmitError::Unstorable`] and
//! every other one commits. A failure of the database itself fails the
//! batch, which the consumer retries as an outage.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use flotilla_store::StoreError;
use flotilla_store::runs;
use sqlx::PgTransaction;

use crate::Engine;
use crate::ops::submit::Prepared;
use crate::submission::admit;
use crate::support::storable::Unstorable;
use crate::{RefusalMode, Submission, SubmitError, Submitted};

/// One outcome per submission, in order.
pub type BatchOutcome = Vec<Result<Submitted, SubmitError>>;

impl Engine {
    /// Submits many jobs in one transaction: every row and its first event
    /// commit together or not at all. Refusals are recorded as FAILED rows;
    /// a conflict, or content the store cannot hold, is that item's error
    /// and writes nothing for it.
    ///
    /// # Errors
    /// Store errors that are not about one request's data: then nothing of
    /// the batch was written.
    pub async fn submit_batch(
        &self,
        submissions: Vec<Submission>,
    ) -> Result<BatchOutcome, StoreError> {
        let admitted: Vec<Result<Submission, Unstorable>> =
            submissions.into_iter().map(admit).collect();
        let seats = self.inner.seats.reserve(self.eager_seats(admitted.len()));
        let results = match self.write_batch(&admitted, false, seats.count()).await {
            Err(e) if e.is_about_the_data() => {
                tracing::warn!(error = %e, "the database refused a request of the batch; writing each on its own");
                self.write_batch(&admitted, true, 0).await?
            }
            other => other?,
        };
        self.hand_claimed(seats, results.iter().flatten()).await;
        for submitted in results.iter().flatten() {
            self.created(submitted);
        }
        Ok(results)
    }

    /// One attempt at the batch, in one transaction; with `isolated`, each
    /// request in its own savepoint. Up to `eager` runs that may start at
    /// once are written claimed by this worker (`run/claiming/eager.rs`);
    /// the careful path writes none so.
    async fn write_batch(
        &self,
        admitted: &[Result<Submission, Unstorable>],
        isolated: bool,
        eager: usize,
    ) -> Result<BatchOutcome, StoreError> {
        let now = self.now();
        let mut tx = self.pool().begin().await?;
        let written = if isolated {
            self.write_each(&mut tx, admitted, now).await
        } else {
            self.write_together(&mut tx, admitted, now, eager).await
        };
        match written {
            Ok(results) => {
                tx.commit().await?;
                Ok(results)
            }
            Err(e) => {
                tx.rollback().await?;
                Err(e)
            }
        }
    }

    /// The happy path: every request checked and resolved, then all rows in
    /// one statement and all first events in another.
    async fn write_together(
        &self,
        tx: &mut PgTransaction<'_>,
        admitted: &[Result<Submission, Unstorable>],
        now: DateTime<Utc>,
        eager: usize,
    ) -> Result<BatchOutcome, StoreError> {
        let mut newest = HashMap::new();
        let mut prepared = Vec::with_capacity(admitted.len());
        for submission in admitted {
            prepared.push(match submission {
                Ok(submission) => {
                    match self
                        .prepare(tx, submission, RefusalMode::Record, &mut newest)
                        .await
                    {
                        Err(SubmitError::Store(e)) => return Err(e),
                        other => other,
                    }
                }
                Err(unstorable) => Err(SubmitError::Unstorable(unstorable.clone())),
            });
        }
        let lease = self.eager_lease(now);
        let mut seats = eager;
        let new_runs: Vec<_> = prepared
            .iter()
            .zip(admitted)
            .filter_map(|(prepared, submission)| {
                let prepared = prepared.as_ref().ok()?;
                let mut run = prepared.new_run(submission.as_ref().ok()?, now)?;
                if seats > 0 && prepared.runs_here() && run.may_start_at_once() {
                    run.lease = lease;
                    seats -= 1;
                }
                Some(run)
            })
            .collect();
        let mut rows = runs::insert_many(tx, &new_runs).await?.into_iter();
        let mut results = Vec::with_capacity(admitted.len());
        let mut policies = HashMap::new();
        for (prepared, submission) in prepared.into_iter().zip(admitted) {
            // A request that was not admitted has its error in `prepared`.
            let (prepared, submission) = match (prepared, submission) {
                (Ok(prepared), Ok(submission)) => (prepared, submission),
                (Err(e), _) => {
                    results.push(Err(e));
                    continue;
                }
                (Ok(_), Err(_)) => unreachable!("prepared but not admitted"),
            };
            let row = match prepared {
                Prepared::Insert { .. } => rows.next().flatten(),
                Prepared::Done(_) => None,
            };
            if let Some(policy) = prepared.on_excess() {
                policies.insert(submission.job_id, policy);
            }
            match prepared.inserted(tx, submission, row).await {
                Err(SubmitError::Store(e)) => return Err(e),
                result => results.push(result),
            }
        }
        let created = results.iter().filter_map(|result| match result {
            Ok(Submitted::Created(row)) => Some(row),
            _ => None,
        });
        let cancelled = super::submit::supersede(tx, created, &policies, now).await?;
        super::submit::reread_cancelled(tx, &mut results, &cancelled).await?;
        Ok(results)
    }

    /// The careful path: each request written in a savepoint of its own, so
    /// one the database refuses becomes its own error.
    async fn write_each(
        &self,
        tx: &mut PgTransaction<'_>,
        admitted: &[Result<Submission, Unstorable>],
        now: DateTime<Utc>,
    ) -> Result<BatchOutcome, StoreError> {
        let mut results = Vec::with_capacity(admitted.len());
        let mut newest = HashMap::new();
        for submission in admitted {
            let submission = match submission {
                Ok(submission) => submission,
                Err(unstorable) => {
                    results.push(Err(SubmitError::Unstorable(unstorable.clone())));
                    continue;
                }
            };
            let mut savepoint = sqlx::Connection::begin(&mut **tx).await?;
            let result = self
                .submit_in(
                    &mut savepoint,
                    submission,
                    RefusalMode::Record,
                    now,
                    &mut newest,
                    None,
                )
                .await
                .map_err(SubmitError::data_to_unstorable);
            match &result {
                Ok(_) => savepoint.commit().await?,
                Err(_) => savepoint.rollback().await?,
            }
            match result {
                Err(SubmitError::Store(e)) => return Err(e),
                result => results.push(result),
            }
        }
        Ok(results)
    }
}
