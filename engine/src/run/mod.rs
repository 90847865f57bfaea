//! Running a claimed job: the claim loops, the claims they share and the
//! jobs handed to them at submission (`claiming/`, batched by `gather.rs`), one segment of a job (`segment.rs`),
//! the claimed-run handle that is the only writer of a RUNNING row
//! (`claimed.rs`) and its lease (`lease.rs`), the fenced writes many jobs
//! commit together (`group_commit.rs`) on connections of their own
//! (`reserved.rs`), how a segment ends (`settle.rs`), compensation
//! (`compensate.rs`), and handing a job back when its targets are missing
//! (`placement.rs`).

pub(crate) mod claimed;
pub(crate) mod claiming;
pub(crate) mod compensate;
pub(crate) mod concurrency;
pub(crate) mod gather;
pub(crate) mod group_commit;
pub(crate) mod in_flight;
pub(crate) mod lease;
pub(crate) mod placement;
pub(crate) mod reserved;
pub(crate) mod retrying;
pub(crate) mod segment;
pub(crate) mod settle;

use flotilla_store::StoreError;
use flotilla_targets::StepFailure;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// What one call of [`Engine::run_once`](crate::Engine::run_once) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing was claimable.
    Idle,
    Completed(Uuid),
    Parked(Uuid),
    /// QUEUED until a timer of the job wakes.
    Sleeping(Uuid),
    /// CANCELLED as someone asked while it ran.
    Cancelled(Uuid),
    /// FAILED: a verdict or a defect.
    Failed(Uuid),
    /// DEAD: attempts exhausted.
    Dead(Uuid),
    /// QUEUED again: after a retryable failure, or at once with the
    /// attempt given back (the job changed under the segment, or its
    /// deadline came after it wrote checkpoints).
    Requeued(Uuid),
    /// Handed back: this worker lacks a target the job needs.
    Released(Uuid),
    /// QUEUED again, no attempt spent: every slot of its concurrency key
    /// is held (or older jobs of the key wait for the free ones), or a
    /// target's rate limit has no permit before the segment's time ends.
    Held(Uuid),
    /// Another worker took the job; this segment wrote nothing more.
    LeaseLost(Uuid),
    /// The store failed mid-segment; the job waits for its lease to lapse.
    StoreFailed(Uuid),
}

impl Outcome {
    /// Whether the job ended for good in this segment.
    #[must_use]
    pub fn ended(&self) -> bool {
        matches!(
            self,
            Self::Completed(_) | Self::Cancelled(_) | Self::Failed(_) | Self::Dead(_)
        )
    }
}

/// The lease is gone: the sweeper requeued the job and maybe another worker claimed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("lease lost: another worker holds this job now")]
pub struct LeaseLost;

/// Why a segment stopped without settling the job.
#[derive(Debug, thiserror::Error)]
pub enum SegmentStop {
    #[error(transparent)]
    LeaseLost(#[from] LeaseLost),
    /// The store failed mid-write: the job is left RUNNING for the lease to
    /// lapse and the sweeper to requeue it; nothing is settled.
    #[error("store failed: {0}")]
    Store(#[from] StoreError),
    /// The store refused a value of this job (a target's response it cannot
    /// hold, say): the job was FAILED as a defect with this reason instead.
    #[error("{0}")]
    Refused(String),
    /// A cancel was asked while the segment ran, and its write out of
    /// RUNNING (park, sleep, completion, failure, requeue, hand-back)
    /// wrote CANCELLED instead, with its event: the segment ends as
    /// cancelled, its children to be cancelled with it.
    #[error("cancelled as asked while the segment ran")]
    Cancelled,
}

impl From<sqlx::Error> for SegmentStop {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

/// The end a job is headed for, as the row keeps it while compensating.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Headed {
    /// The step that failed, when a step did.
    pub(crate) step: Option<String>,
    pub(crate) error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) verdict: Option<String>,
    /// DEAD (attempts exhausted) rather than FAILED.
    pub(crate) dead: bool,
}

impl Headed {
    /// Where `failure` takes a job, `retrying` deciding a retryable one;
    /// `None` when it goes back to the queue for another attempt instead.
    pub(crate) fn of(
        failure: &StepFailure,
        step: Option<String>,
        retrying: Option<&retrying::Retrying>,
    ) -> Option<Self> {
        let (error, verdict, dead) = match (failure, retrying) {
            (StepFailure::Retryable { .. }, Some(retrying::Retrying::Again { .. })) => {
                return None;
            }
            (StepFailure::Retryable { error, .. }, Some(retrying::Retrying::Exhausted(why))) => {
                (format!("{error} ({why})"), None, true)
            }
            (StepFailure::Retryable { error, .. }, None) => (error.clone(), None, true),
            (
                StepFailure::Verdict {
                    message,
                    violations,
                },
                _,
            ) => (message.clone(), Some(violations.join("; ")), false),
            (StepFailure::Defect(error), _) => (error.clone(), None, false),
        };
        Some(Self {
            step,
            error,
            verdict,
            dead,
        })
    }
}
