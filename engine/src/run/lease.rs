//! The lease of a claimed run: the token that fences every write, the
//! fenced writer kept aside so a segment that panicked can still settle
//! its job ([`Fence`]), and the heartbeat that renews the lease in the
//! background ([`Heartbeat`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, Utc};
use flotilla_store::runs::lease::{self, Fence as LeaseFence, Transition, Written};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::Engine;
use crate::run::{Headed, LeaseLost, SegmentStop};
use crate::support::sanitize;

/// Hand-backs in a row, with no progress between them, after which the
/// next one sends the job DEAD instead.
pub const MAX_HAND_BACKS: i32 = 10;

/// The job id and token: enough to renew, shared with the heartbeat task;
/// and the event sequence the holder's writes have reached, which fences
/// its commit points.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    pub(crate) engine: Engine,
    pub(crate) job_id: Uuid,
    pub(crate) token: Uuid,
    pub(crate) sequence: Arc<AtomicI64>,
    /// The definition's revision when claimed (see `lease::Fence`).
    pub(crate) revision: i32,
    pub(crate) job: Arc<JobFacts>,
}

/// What the fenced writer knows of its job from the claim.
#[derive(Debug)]
pub(crate) struct JobFacts {
    pub(crate) workflow_name: String,
    pub(crate) workflow_version: Option<i32>,
    pub(crate) created_at: DateTime<Utc>,
    /// Hand-backs in a row before this claim.
    pub(crate) hand_backs: i32,
    /// Whether the job has `on_failure` steps and has not begun them: an
    /// end for good heads there first.
    pub(crate) compensates: bool,
}

impl Lease {
    /// Extends the lease; `Some(reason)` when someone asked to cancel the
    /// job meanwhile.
    pub(crate) async fn renew(&self) -> Result<Option<String>, SegmentStop> {
        let now = self.engine.now();
        let until = now + self.engine.settings().lease;
        let renewal = self
            .engine
            .on_reserved(async |conn| lease::renew(conn, self.job_id, self.token, now, until).await)
            .await?;
        match renewal {
            lease::Renewal::Held => Ok(None),
            lease::Renewal::CancelAsked(reason) => Ok(Some(reason)),
            lease::Renewal::Lost => Err(LeaseLost.into()),
        }
    }

    /// Writes `change`; when the store refuses its values (not a failure of
    /// the store itself), fails the job as a defect with the store's reason,
    /// on this attempt, rather than leave it to lapse and be tried again.
    pub(crate) async fn write(&self, change: Transition) -> Result<(), SegmentStop> {
        let failing = matches!(change, Transition::Fail { .. });
        match self.try_write(change).await {
            Err(SegmentStop::Store(e)) if e.is_about_the_data() && !failing => {
                let error =
                    sanitize::error_text(&format!("the store refused a value of this job: {e}"));
                tracing::error!(job_id = %self.job_id, %error, "job failed: the store refused its data");
                self.end(Headed {
                    step: None,
                    error: error.clone(),
                    verdict: None,
                    dead: false,
                })
                .await?;
                Err(SegmentStop::Refused(error))
            }
            other => other,
        }
    }

    /// Ends the job for good as `headed` says, outside the segment's own
    /// settling (a value the store refused, a panic, the last hand-back):
    /// a job with compensation steps not yet begun is headed there instead
    /// (the failure written as the row's compensation, no event) and given
    /// back at once, so the next claim runs them and then ends it so.
    ///
    /// # Errors
    /// Lease lost, or the store failed.
    pub(crate) async fn end(&self, headed: Headed) -> Result<(), SegmentStop> {
        if self.job.compensates {
            let failure = serde_json::to_value(&headed).unwrap_or(serde_json::Value::Null);
            self.try_write(Transition::BeginCompensation { failure })
                .await?;
            return self
                .try_write(Transition::Yield {
                    reason: format!("headed to end: {}; compensating first", headed.error),
                })
                .await;
        }
        let (change, state) = if headed.dead {
            (
                Transition::Dead {
                    error: headed.error,
                },
                "DEAD",
            )
        } else {
            let error = headed.error;
            let verdict = headed.verdict;
            (Transition::Fail { error, verdict }, "FAILED")
        };
        self.try_write(change).await?;
        self.finished(state);
        Ok(())
    }

    /// Counts the job as finished in `state`.
    pub(crate) fn finished(&self, state: &'static str) {
        let job = &self.job;
        self.engine.job_finished(
            (&job.workflow_name, job.workflow_version),
            state,
            job.created_at,
        );
    }

    /// What a write of this lease is fenced on, as the store takes it.
    pub(crate) fn store_fence(&self) -> LeaseFence {
        LeaseFence {
            token: self.token,
            sequence: self.sequence.load(Ordering::SeqCst),
            revision: self.revision,
        }
    }

    /// Every fenced write shares its commit with other jobs' writes (see
    /// `group_commit`), and still waits for its own to be durable.
    pub(crate) async fn try_write(&self, change: Transition) -> Result<(), SegmentStop> {
        let now = self.engine.now();
        let group = &self.engine.inner.group_commit;
        let fence = self.store_fence();
        let events = change.events_written();
        match group.write(self.job_id, fence, now, change).await? {
            Written::Done => {
                self.sequence.fetch_add(events, Ordering::SeqCst);
                Ok(())
            }
            Written::Cancelled => {
                self.finished("CANCELLED");
                Err(SegmentStop::Cancelled)
            }
            Written::Lost => Err(LeaseLost.into()),
        }
    }
}

/// The fenced writer of a claimed run, kept aside so a segment that
/// panicked can still settle its job.
#[derive(Debug, Clone)]
pub(crate) struct Fence(pub(crate) Lease);

impl Fence {
    /// Gives the job back to the queue for a reason of the world (the store
    /// failed mid-segment): fenced on the token only, so it matches whatever
    /// an ambiguous commit left; no attempt spent, no lapse counted, backed
    /// off twice as long for each hand-back in a row. The
    /// [`MAX_HAND_BACKS`]-th in a row with no progress sends the job DEAD
    /// instead: a job whose own data keeps failing the store as an outage
    /// would must not run its steps again forever.
    pub(crate) async fn hand_back(&self, reason: &str) -> Result<(), SegmentStop> {
        let lease = &self.0;
        let reason = sanitize::error_text(reason);
        metrics::counter!("flotilla_hand_backs_total").increment(1);
        if lease.job.hand_backs + 1 >= MAX_HAND_BACKS {
            let error = sanitize::error_text(&format!(
                "handed back {MAX_HAND_BACKS} times in a row with no progress; the last: {reason}"
            ));
            // Fenced on the sequence: a commit of this segment whose outcome
            // was unknown, and that did commit, was progress.
            let headed = Headed {
                step: None,
                error,
                verdict: None,
                dead: true,
            };
            match lease.end(headed).await {
                Err(SegmentStop::LeaseLost(_)) => {}
                ended => return ended,
            }
        }
        lease
            .try_write(Transition::HandBack {
                reason,
                now: lease.engine.now(),
                backoff: lease.engine.settings().backoff_base,
            })
            .await
    }

    /// Gives the job back at once when this worker still holds its lease
    /// but its next commit point was refused: the job changed under it (a
    /// graft). `Ok(true)`: handed back; `Ok(false)`: the lease was really
    /// lost, nothing written.
    pub(crate) async fn yield_changed(&self) -> Result<bool, SegmentStop> {
        let change = Transition::Yield {
            reason: "the job changed under its segment (a graft); resumed by the next claim"
                .to_owned(),
        };
        match self.0.try_write(change).await {
            Ok(()) => Ok(true),
            Err(SegmentStop::LeaseLost(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Fails the job as a defect, if this worker still holds it (after
    /// its compensation, when it has one: see `Lease::end`).
    pub(crate) async fn fail_defect(&self, error: &str) -> Result<(), SegmentStop> {
        let headed = Headed {
            step: None,
            error: sanitize::error_text(error),
            verdict: None,
            dead: false,
        };
        self.0.end(headed).await
    }
}

/// Renews the lease in the background until dropped; [`Heartbeat::lost`] is
/// cancelled when a renewal finds the lease gone.
#[derive(Debug)]
pub(crate) struct Heartbeat {
    pub(crate) task: tokio::task::JoinHandle<()>,
    pub(crate) lost: CancellationToken,
    /// Cancelled when a renewal finds a cancellation asked of the job.
    pub(crate) cancel: CancellationToken,
    pub(crate) reason: Arc<std::sync::OnceLock<String>>,
}

impl Heartbeat {
    pub(crate) fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    /// Cancelled once someone asked to cancel the job while it runs.
    pub(crate) fn cancel_asked(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Why the job is to be cancelled, once asked.
    pub(crate) fn cancel_reason(&self) -> Option<String> {
        self.reason.get().cloned()
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        // A finished or cancelled segment must not keep its lease alive.
        self.task.abort();
    }
}
