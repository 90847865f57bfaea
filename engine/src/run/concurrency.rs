//! A job of a workflow with a concurrency key takes a slot of its key
//! before its first step runs, and keeps it until it ends
//! (`store/src/runs/concurrency.rs` holds the rules). A job that finds no
//! slot goes back to the queue with its attempt given back and a reason
//! anyone can read; a holder that ends wakes the next job of its key, and
//! the sweeper wakes any a holder could not (see `services/concurrency.rs`).

use std::time::Duration;

use flotilla_store::runs::concurrency::{self, Entrant, Entry};
use uuid::Uuid;

use crate::run::LeaseLost;
use crate::{ClaimedRun, Engine, Outcome, SegmentStop};

/// The longest a held job waits before it asks for a slot again, if no
/// holder and no sweep woke it first: a safety net only, so long that a
/// key held for hours (a person's step) costs its waiters a claim every
/// five minutes, not a busy loop.
const HOLD_RECHECK: Duration = Duration::from_secs(300);

impl Engine {
    /// Takes a slot of `claimed`'s concurrency key, unless it has none or
    /// holds one already: `Ok(claimed)` to run it, `Err(outcome)` when it
    /// was held (or cancelled as asked meanwhile) instead.
    pub(crate) async fn take_slot(
        &self,
        claimed: ClaimedRun,
    ) -> Result<Result<ClaimedRun, Outcome>, SegmentStop> {
        let row = claimed.row();
        let (Some(key), Some(limit)) = (row.concurrency_key.as_deref(), row.concurrency_limit)
        else {
            return Ok(Ok(claimed));
        };
        // A job that holds its slot goes on; one past its execution timeout
        // goes on to be ended (it calls nothing but its compensation).
        if row.holds_slot || row.expires_at.is_some_and(|at| at <= self.now()) {
            return Ok(Ok(claimed));
        }
        let job_id = claimed.job_id();
        let entrant = Entrant {
            job_id,
            created_at: row.created_at,
            fence: claimed.store_fence(),
            key,
            limit,
        };
        let now = self.now();
        let entry = concurrency::enter(self.pool(), entrant, now, now + HOLD_RECHECK).await?;
        match entry {
            Entry::Entered => Ok(Ok(claimed)),
            Entry::Held(reason) => {
                metrics::counter!("flotilla_jobs_held_by_concurrency_total").increment(1);
                tracing::debug!(%job_id, %reason, "job held by its concurrency key");
                Ok(Err(Outcome::Held(job_id)))
            }
            Entry::Cancelled => {
                claimed.finished("CANCELLED");
                self.cascade_cancel(job_id).await;
                Ok(Err(Outcome::Cancelled(job_id)))
            }
            Entry::Lost => Err(LeaseLost.into()),
        }
    }

    /// After a job of `key` ended: wakes the jobs of the key that wait for
    /// the slot it gave back. A failure is only logged: the sweeper wakes
    /// them in any case.
    pub(crate) async fn slot_given_back(&self, job_id: Uuid, key: &str) {
        match concurrency::wake(self.pool(), key, self.now()).await {
            Ok(0) => {}
            Ok(woken) => {
                tracing::debug!(%job_id, key, woken, "a concurrency slot was given back");
                self.wake();
            }
            Err(e) => {
                tracing::warn!(%job_id, key, error = %e, "waking the jobs waiting for a concurrency slot failed; the sweeper will");
            }
        }
    }
}
