//! The claimed run: the only way to change a RUNNING row. Every write is
//! fenced on the lease token; a write that matches no row means another
//! worker holds the job now, and the holder must stop without writing more.

use sqlx::PgPool;
use uuid::Uuid;

use super::Engine;
use crate::store::StoreError;
use crate::store::outbox::{self, EventKind};
use crate::store::runs::{self, Checkpoint, Fenced, RunRow};

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
}

impl From<sqlx::Error> for SegmentStop {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

/// A job claimed by this worker, with the token that fences its writes.
#[derive(Debug)]
pub struct ClaimedRun {
    engine: Engine,
    row: RunRow,
    token: Uuid,
}

/// The fenced writer alone, for the heartbeat task.
#[derive(Debug, Clone)]
pub(super) struct Lease {
    engine: Engine,
    job_id: Uuid,
    token: Uuid,
}

impl Lease {
    /// Renews the lease for another full term.
    pub(super) async fn renew(&self) -> Result<(), SegmentStop> {
        let lease_until = self.engine.now() + self.engine.settings().lease;
        write(
            &self.engine,
            self.job_id,
            self.token,
            Fenced::Renew { lease_until },
            None,
        )
        .await
    }
}

/// Applies a fenced change and, for a commit point, its outbox row, in one transaction.
async fn write(
    engine: &Engine,
    job_id: Uuid,
    token: Uuid,
    change: Fenced<'_>,
    event: Option<EventKind>,
) -> Result<(), SegmentStop> {
    let pool: &PgPool = engine.pool();
    let now = engine.now();
    let mut tx = pool.begin().await?;
    let Some(stamp) = runs::fenced(&mut tx, job_id, token, now, &change).await? else {
        return Err(LeaseLost.into());
    };
    if let Some(kind) = event {
        outbox::insert(&mut tx, &stamp, kind, now).await?;
    }
    tx.commit().await?;
    Ok(())
}

impl ClaimedRun {
    pub(super) fn new(engine: Engine, row: RunRow) -> Option<Self> {
        let token = row.lease_token?;
        Some(Self { engine, row, token })
    }

    /// The row as it was claimed.
    #[must_use]
    pub fn row(&self) -> &RunRow {
        &self.row
    }

    #[must_use]
    pub fn job_id(&self) -> Uuid {
        self.row.job_id
    }

    pub(super) fn lease(&self) -> Lease {
        Lease {
            engine: self.engine.clone(),
            job_id: self.row.job_id,
            token: self.token,
        }
    }

    /// Extends the lease.
    ///
    /// # Errors
    /// [`SegmentStop::LeaseLost`] when another worker holds the job.
    pub async fn renew(&self) -> Result<(), SegmentStop> {
        self.lease().renew().await
    }

    /// Appends a step's checkpoint with its STEP_CHECKPOINT event.
    ///
    /// # Errors
    /// Lease lost, or the store failed (then nothing was written).
    pub async fn checkpoint(&self, checkpoint: &Checkpoint) -> Result<(), SegmentStop> {
        let event = EventKind::StepCheckpoint {
            step: checkpoint.name.clone(),
        };
        self.write(Fenced::Checkpoint { checkpoint }, Some(event))
            .await
    }

    /// Parks on the external step `step` (WAITING, with its event).
    ///
    /// # Errors
    /// Lease lost, or the store failed.
    pub async fn park(self, step: &str) -> Result<(), SegmentStop> {
        self.write(
            Fenced::Park { step },
            Some(EventKind::Waiting {
                step: step.to_owned(),
            }),
        )
        .await
    }

    /// Completes the job with its result and verdict.
    ///
    /// # Errors
    /// Lease lost, or the store failed.
    pub async fn complete(
        self,
        result: &serde_json::Value,
        verdict: &str,
    ) -> Result<(), SegmentStop> {
        let event = EventKind::Completed {
            verdict: verdict.to_owned(),
            result: result.clone(),
        };
        self.write(Fenced::Complete { result, verdict }, Some(event))
            .await
    }

    /// Fails the job for good: a verdict or a defect.
    ///
    /// # Errors
    /// Lease lost, or the store failed.
    pub async fn fail(self, error: &str, verdict: Option<&str>) -> Result<(), SegmentStop> {
        let event = EventKind::Failed {
            error: error.to_owned(),
            verdict: verdict.map(str::to_owned),
        };
        self.write(Fenced::Fail { error, verdict }, Some(event))
            .await
    }

    /// Attempts exhausted: DEAD with the last error verbatim.
    ///
    /// # Errors
    /// Lease lost, or the store failed.
    pub async fn dead(self, error: &str) -> Result<(), SegmentStop> {
        self.write(
            Fenced::Dead { error },
            Some(EventKind::Dead {
                error: error.to_owned(),
            }),
        )
        .await
    }

    /// Back to the queue after a retryable failure, eligible again at `run_after`.
    ///
    /// # Errors
    /// Lease lost, or the store failed.
    pub async fn requeue(
        self,
        error: &str,
        run_after: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), SegmentStop> {
        self.write(Fenced::Requeue { error, run_after }, None).await
    }

    async fn write(&self, change: Fenced<'_>, event: Option<EventKind>) -> Result<(), SegmentStop> {
        write(&self.engine, self.row.job_id, self.token, change, event).await
    }
}
