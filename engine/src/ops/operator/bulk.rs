//! Retrying or cancelling every job a filter matches (status, workflow,
//! time range, metadata): what an operator
//! does after an outage (retry the DEAD jobs of the last hour) or a bad
//! deploy (cancel what a workflow has queued).
//!
//! The matching jobs are listed first, a page at a time, as the job list
//! pages (newest first, by its cursor), up to [`MOST_AT_ONCE`]; then each is
//! retried or cancelled by the same operation as one job is, in its own
//! transaction, with its own event. A job that changed meanwhile (finished,
//! retried by someone else) is refused as one job would be, and counted as
//! passed over with the reason, without stopping the rest. A dry run lists
//! and counts, and changes nothing. More than [`MOST_AT_ONCE`] matching
//! jobs: the first that many are acted on, and `more` says to call again.

use chrono::{DateTime, Utc};
use flotilla_store::RunStatus;
use uuid::Uuid;

use crate::ops::operator::OperatorError;
use crate::ops::queries::{JobQuery, ListError};
use crate::support::storable::{self, Unstorable};
use crate::{Cancelled, Engine};

/// The most jobs one call acts on.
pub const MOST_AT_ONCE: usize = 10_000;

/// How many passed-over jobs an outcome names.
const PASSED_OVER_NAMED: usize = 20;

/// Which jobs: every field given must hold.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub status: Option<RunStatus>,
    pub workflow_name: Option<String>,
    /// Created at or after this time.
    pub created_after: Option<DateTime<Utc>>,
    /// Created strictly before this time.
    pub created_before: Option<DateTime<Utc>>,
    /// Whose metadata holds every entry of this object.
    pub metadata: Option<serde_json::Value>,
}

/// What to do to each job.
#[derive(Debug, Clone)]
pub enum BulkAction {
    /// Run a DEAD, FAILED or CANCELLED job again, on the version it ran.
    Retry,
    /// Cancel a job that has not finished, with this reason.
    Cancel { reason: String },
}

/// What a bulk action did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct BulkOutcome {
    /// Jobs the filter matched (at most [`MOST_AT_ONCE`]).
    pub matched: usize,
    /// Jobs retried or cancelled (cancels of RUNNING jobs asked included);
    /// 0 on a dry run.
    pub changed: usize,
    /// Jobs the action did not apply to (finished, not finished, changed
    /// meanwhile), with the first few named.
    pub passed_over: usize,
    pub passed_over_examples: Vec<PassedOver>,
    /// More jobs match than one call acts on: call again.
    pub more: bool,
    pub dry_run: bool,
}

/// One job the action did not apply to, and why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PassedOver {
    pub job_id: Uuid,
    pub reason: String,
}

/// A bulk action that could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum BulkError {
    /// The filter cannot be listed by (a name no job can have, say).
    #[error(transparent)]
    Filter(#[from] ListError),
    /// A cancel reason the store cannot hold: nothing was done.
    #[error(transparent)]
    Unstorable(#[from] Unstorable),
    /// The database failed part way: what was done stays done, and the
    /// same call again acts on what still matches.
    #[error("after {changed} job(s) changed: {source}")]
    World {
        changed: usize,
        source: OperatorError,
    },
}

impl Engine {
    /// Applies `action` to every job `filter` matches (see the module), or
    /// only counts them with `dry_run`.
    ///
    /// # Errors
    /// [`BulkError::Filter`] for a filter the list refuses;
    /// [`BulkError::World`] when the database fails.
    pub async fn bulk(
        &self,
        filter: &JobFilter,
        action: &BulkAction,
        dry_run: bool,
    ) -> Result<BulkOutcome, BulkError> {
        if let BulkAction::Cancel { reason } = action {
            storable::check_text("reason", reason)?;
        }
        let (matched, more) = self.matching(filter).await?;
        let mut outcome = BulkOutcome {
            matched: matched.len(),
            more,
            dry_run,
            ..BulkOutcome::default()
        };
        if dry_run {
            return Ok(outcome);
        }
        for job_id in matched {
            let applied = match action {
                BulkAction::Retry => self.retry(job_id).await.map(|_| ()),
                BulkAction::Cancel { reason } => {
                    self.cancel(job_id, reason).await.map(|_: Cancelled| ())
                }
            };
            match applied {
                Ok(()) => outcome.changed += 1,
                Err(e) if is_about_the_job(&e) => {
                    outcome.passed_over += 1;
                    if outcome.passed_over_examples.len() < PASSED_OVER_NAMED {
                        outcome.passed_over_examples.push(PassedOver {
                            job_id,
                            reason: e.to_string(),
                        });
                    }
                }
                Err(source) => {
                    return Err(BulkError::World {
                        changed: outcome.changed,
                        source,
                    });
                }
            }
        }
        Ok(outcome)
    }

    /// The ids of the jobs `filter` matches, newest first, at most
    /// [`MOST_AT_ONCE`], and whether more match.
    async fn matching(&self, filter: &JobFilter) -> Result<(Vec<Uuid>, bool), BulkError> {
        let mut ids = Vec::new();
        let mut cursor = None;
        loop {
            let query = JobQuery {
                metadata: filter.metadata.clone(),
                status: filter.status,
                workflow_name: filter.workflow_name.clone(),
                created_after: filter.created_after,
                created_before: filter.created_before,
                limit: 500,
                cursor: cursor.take(),
            };
            let page = self.jobs(&query).await?;
            for row in page.jobs {
                if ids.len() == MOST_AT_ONCE {
                    return Ok((ids, true));
                }
                ids.push(row.job_id);
            }
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return Ok((ids, false)),
            }
        }
    }
}

/// Whether `error` is this job's own answer (its state, a reason it cannot
/// hold), not the database's failure.
fn is_about_the_job(error: &OperatorError) -> bool {
    !matches!(error, OperatorError::Store(_))
}
