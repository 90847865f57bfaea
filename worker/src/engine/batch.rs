//! Submitting a batch from the request topic: one transaction for the
//! whole batch on the happy path. When the database refuses one request's
//! content, the batch is written again with a savepoint around each
//! request, so that request alone becomes [`SubmitError::Unstorable`] and
//! every other one commits. A failure of the database itself fails the
//! batch, which the consumer retries as an outage.

use std::collections::HashMap;

use flotilla_store::{RunStatus, StoreError};

use super::Engine;
use super::storable::Unstorable;
use super::submit::{RefusalMode, Submission, SubmitError, Submitted, admit};

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
        let results = match self.write_batch(&admitted, false).await {
            Err(e) if e.is_about_the_data() => {
                tracing::warn!(error = %e, "the database refused a request of the batch; writing each on its own");
                self.write_batch(&admitted, true).await?
            }
            other => other?,
        };
        for result in &results {
            if let Ok(Submitted::Created(row)) = result
                && row.status == RunStatus::Queued
            {
                self.wake();
            }
        }
        Ok(results)
    }

    /// One attempt at the batch; with `isolated`, each request in its own savepoint.
    async fn write_batch(
        &self,
        admitted: &[Result<Submission, Unstorable>],
        isolated: bool,
    ) -> Result<BatchOutcome, StoreError> {
        let now = self.now();
        let mut tx = self.pool().begin().await?;
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
            let result = if isolated {
                let mut savepoint = sqlx::Connection::begin(&mut *tx).await?;
                let result = self
                    .submit_in(
                        &mut savepoint,
                        submission,
                        RefusalMode::Record,
                        now,
                        &mut newest,
                    )
                    .await
                    .map_err(SubmitError::data_to_unstorable);
                match &result {
                    Ok(_) => savepoint.commit().await?,
                    Err(_) => savepoint.rollback().await?,
                }
                result
            } else {
                self.submit_in(&mut tx, submission, RefusalMode::Record, now, &mut newest)
                    .await
            };
            match result {
                Err(SubmitError::Store(e)) => {
                    tx.rollback().await?;
                    return Err(e);
                }
                result => results.push(result),
            }
        }
        tx.commit().await?;
        Ok(results)
    }
}
