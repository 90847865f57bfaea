//! The claimed run: the only way to change a RUNNING row. Every write is
//! fenced on the lease token and carries its event (see
//! [`flotilla_store::runs::lease::Transition`]); a write that matches no row
//! means another worker holds the job now, and the holder must stop without
//! writing more. A write that takes the job out of RUNNING lands CANCELLED
//! instead when a cancel was asked meanwhile ([`SegmentStop::Cancelled`]).
//! The heartbeat that keeps the lease alive hangs off the same handle.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use flotilla_runtime::supervise::panic_message;
use flotilla_store::StoreError;
use flotilla_store::runs::lease::{self, Fence as LeaseFence, Transition, Written};
use flotilla_store::runs::{Checkpoint, RunRow};
use futures_util::FutureExt as _;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::compensate::Headed;
use super::{Engine, sanitize};
use crate::target::RetryClass;

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

/// A job claimed by this worker, with the token that fences its writes.
#[derive(Debug)]
pub struct ClaimedRun {
    lease: Lease,
    row: RunRow,
}

/// The job id and token: enough to renew, shared with the heartbeat task;
/// and the event sequence the holder's writes have reached, which fences
/// its commit points.
#[derive(Debug, Clone)]
struct Lease {
    engine: Engine,
    job_id: Uuid,
    token: Uuid,
    sequence: Arc<AtomicI64>,
    /// The definition's revision when claimed (see `lease::Fence`).
    revision: i32,
    job: Arc<JobFacts>,
}

/// What the fenced writer knows of its job from the claim.
#[derive(Debug)]
struct JobFacts {
    workflow_name: String,
    workflow_version: Option<i32>,
    created_at: DateTime<Utc>,
    /// Hand-backs in a row before this claim.
    hand_backs: i32,
    /// Whether the job has `on_failure` steps and has not begun them: an
    /// end for good heads there first.
    compensates: bool,
}

/// Hand-backs in a row, with no progress between them, after which the
/// next one sends the job DEAD instead.
pub const MAX_HAND_BACKS: i32 = 10;

impl Lease {
    /// Extends the lease; `Some(reason)` when someone asked to cancel the
    /// job meanwhile.
    async fn renew(&self) -> Result<Option<String>, SegmentStop> {
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
    async fn write(&self, change: Transition) -> Result<(), SegmentStop> {
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
    async fn end(&self, headed: Headed) -> Result<(), SegmentStop> {
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
    fn finished(&self, state: &'static str) {
        let job = &self.job;
        self.engine.job_finished(
            (&job.workflow_name, job.workflow_version),
            state,
            job.created_at,
        );
    }

    /// Every fenced write shares its commit with other jobs' writes (see
    /// `group_commit`), and still waits for its own to be durable.
    async fn try_write(&self, change: Transition) -> Result<(), SegmentStop> {
        let now = self.engine.now();
        let group = &self.engine.inner.group_commit;
        let fence = LeaseFence {
            token: self.token,
            sequence: self.sequence.load(Ordering::SeqCst),
            revision: self.revision,
        };
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
pub(super) struct Fence(Lease);

impl Fence {
    /// Gives the job back to the queue for a reason of the world (the store
    /// failed mid-segment): fenced on the token only, so it matches whatever
    /// an ambiguous commit left; no attempt spent, no lapse counted, backed
    /// off twice as long for each hand-back in a row. The
    /// [`MAX_HAND_BACKS`]-th in a row with no progress sends the job DEAD
    /// instead: a job whose own data keeps failing the store as an outage
    /// would must not run its steps again forever.
    pub(super) async fn hand_back(&self, reason: &str) -> Result<(), SegmentStop> {
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
    pub(super) async fn yield_changed(&self) -> Result<bool, SegmentStop> {
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
    pub(super) async fn fail_defect(&self, error: &str) -> Result<(), SegmentStop> {
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
pub(super) struct Heartbeat {
    task: tokio::task::JoinHandle<()>,
    lost: CancellationToken,
    /// Cancelled when a renewal finds a cancellation asked of the job.
    cancel: CancellationToken,
    reason: Arc<std::sync::OnceLock<String>>,
}

impl Heartbeat {
    pub(super) fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    /// Cancelled once someone asked to cancel the job while it runs.
    pub(super) fn cancel_asked(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Why the job is to be cancelled, once asked.
    pub(super) fn cancel_reason(&self) -> Option<String> {
        self.reason.get().cloned()
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        // A finished or cancelled segment must not keep its lease alive.
        self.task.abort();
    }
}

impl ClaimedRun {
    pub(super) fn new(engine: Engine, row: RunRow) -> Option<Self> {
        let lease = Lease {
            engine,
            job_id: row.job_id,
            token: row.lease_token?,
            // The fence counts the holder's own events only (see `lease::Fence`).
            sequence: Arc::new(AtomicI64::new(
                row.event_sequence - i64::from(row.foreign_events) - i64::from(row.revision),
            )),
            revision: row.revision,
            job: Arc::new(JobFacts {
                workflow_name: row.workflow_name.clone(),
                workflow_version: row.workflow_version,
                created_at: row.created_at,
                hand_backs: row.hand_backs,
                compensates: row.compensation.is_none()
                    && row.definition.0["on_failure"]
                        .as_array()
                        .is_some_and(|steps| !steps.is_empty()),
            }),
        };
        Some(Self { lease, row })
    }

    /// The engine this run was claimed by.
    pub(super) fn engine(&self) -> &Engine {
        &self.lease.engine
    }

    /// Writes `checkpoint` fenced on this lease, in the caller's
    /// transaction (a write that must commit with others of its own, unlike
    /// the group-committed ones); [`Self::advance_fence`] once committed.
    /// `false`: the lease is gone, nothing written.
    pub(super) async fn fenced_checkpoint(
        &self,
        tx: &mut sqlx::PgTransaction<'_>,
        checkpoint: &Checkpoint,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let fence = LeaseFence {
            token: self.lease.token,
            sequence: self.lease.sequence.load(Ordering::SeqCst),
            revision: self.lease.revision,
        };
        let change = Transition::Checkpoint {
            checkpoint: checkpoint.clone(),
            layout: self.lease.engine.checkpoint_layout(),
        };
        // A checkpoint keeps the job RUNNING: never cancelled instead.
        lease::transition(tx, self.lease.job_id, fence, now, &change)
            .await
            .map(Written::is_written)
    }

    /// Counts `events` the holder committed outside the group commit.
    pub(super) fn advance_fence(&self, events: i64) {
        self.lease.sequence.fetch_add(events, Ordering::SeqCst);
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

    /// The token this claim holds the lease under.
    pub(super) fn token(&self) -> Uuid {
        self.lease.token
    }

    pub(super) fn fence(&self) -> Fence {
        Fence(self.lease.clone())
    }

    /// Starts renewing the lease every quarter of its term. A renewal that
    /// fails for another reason than a lost lease is retried at the next
    /// tick: the term leaves room for three misses.
    pub(super) fn heartbeat(&self) -> Heartbeat {
        let lease = self.lease.clone();
        let every = (lease.engine.settings().lease / 4).max(Duration::from_millis(10));
        let lost = CancellationToken::new();
        let signal = lost.clone();
        let cancel = CancellationToken::new();
        let reason = Arc::new(std::sync::OnceLock::new());
        let (asked, why) = (cancel.clone(), reason.clone());
        let job_id = lease.job_id;
        // The heartbeat runs outside the segment's span: its lines name the job themselves.
        let workflow = self.row.workflow_name.clone();
        let workflow_name = workflow.clone();
        let trace_id =
            flotilla_runtime::trace::trace_id(self.row.traceparent.as_deref()).to_owned();
        let trace = trace_id.clone();
        let renewals = async move {
            let mut ticks = tokio::time::interval(every);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                match lease.renew().await {
                    Ok(None) => {}
                    Ok(Some(reason)) => {
                        let _ = why.set(reason);
                        asked.cancel();
                    }
                    Err(SegmentStop::LeaseLost(_)) => return,
                    Err(SegmentStop::Refused(_) | SegmentStop::Cancelled) => {}
                    Err(SegmentStop::Store(e)) => {
                        tracing::warn!(%job_id, %workflow_name, trace_id = %trace, error = %e, "lease renewal failed; retrying");
                    }
                }
            }
        };
        let task = tokio::spawn(async move {
            // Renewals that stop for any reason, a panic included, mean the
            // lease can no longer be counted on: the segment stops.
            if let Err(panic) = AssertUnwindSafe(renewals).catch_unwind().await {
                tracing::error!(%job_id, workflow_name = %workflow, %trace_id, panic = %panic_message(panic.as_ref()), "heartbeat panicked");
            }
            signal.cancel();
        });
        Heartbeat {
            task,
            lost,
            cancel,
            reason,
        }
    }

    /// Extends the lease.
    ///
    /// # Errors
    /// [`SegmentStop::LeaseLost`] when another worker holds the job.
    pub async fn renew(&self) -> Result<(), SegmentStop> {
        self.lease.renew().await.map(|_| ())
    }

    /// Adds a step's checkpoint with its STEP_CHECKPOINT event.
    ///
    /// # Errors
    /// Lease lost, or the store failed (then nothing was written).
    pub async fn checkpoint(&self, checkpoint: &Checkpoint) -> Result<(), SegmentStop> {
        let span = tracing::info_span!("checkpoint", job_id = %self.job_id());
        let change = Transition::Checkpoint {
            checkpoint: checkpoint.clone(),
            layout: self.lease.engine.checkpoint_layout(),
        };
        tracing::Instrument::instrument(self.lease.write(change), span).await
    }

    /// Parks on the external, `wait_for` or `start` step `step` (WAITING,
    /// with its event); requeued at once instead when one of `signals` (the
    /// names its ready `wait_for` steps wait for) arrived meanwhile, or a
    /// child of one of the steps `children` finished meanwhile. `timers`:
    /// those first reached in this segment, to store, and the earliest of
    /// all still asleep, when the job is queued again whatever it waits for.
    ///
    /// # Errors
    /// Lease lost, or the store failed.
    pub async fn park(
        self,
        step: &str,
        (timers, wakes_at): (
            Option<serde_json::Value>,
            Option<chrono::DateTime<chrono::Utc>>,
        ),
        (signals, children): (Vec<String>, Vec<String>),
        replies: flotilla_store::runs::step_requests::AwaitedReplies,
    ) -> Result<(), SegmentStop> {
        let span = tracing::info_span!("park", job_id = %self.job_id(), flotilla.step = %step);
        let sent = replies.sending.len();
        tracing::Instrument::instrument(
            self.lease.write(Transition::Park {
                step: step.to_owned(),
                timers,
                signals,
                children,
                replies,
                wakes_at,
            }),
            span,
        )
        .await?;
        if sent > 0 {
            metrics::counter!("flotilla_step_requests_total").increment(sent as u64);
            // The relay's idle loop looks for requests when rung.
            self.lease
                .engine
                .inner
                .doorbell
                .ring(flotilla_store::wake::Channel::Outbox);
        }
        Ok(())
    }

    /// Back to the queue until the first timer wakes, with the timers
    /// first reached in this segment (`timers`: step → instant) stored.
    ///
    /// # Errors
    /// Lease lost, or the store failed.
    pub async fn sleep(
        self,
        step: &str,
        timers: serde_json::Value,
        wakes_at: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), SegmentStop> {
        let span = tracing::info_span!("sleep", job_id = %self.job_id(), flotilla.step = %step);
        let change = Transition::Sleep {
            step: step.to_owned(),
            timers,
            wakes_at,
        };
        tracing::Instrument::instrument(self.lease.write(change), span).await
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
        self.lease
            .write(Transition::Complete {
                result: result.clone(),
                verdict: verdict.to_owned(),
            })
            .await?;
        self.finished("COMPLETED");
        Ok(())
    }

    /// The last step's checkpoint and the completion, written together.
    ///
    /// # Errors
    /// Lease lost, or the store failed (then neither was written).
    pub async fn checkpoint_and_complete(
        self,
        checkpoint: &Checkpoint,
        result: &serde_json::Value,
        verdict: &str,
    ) -> Result<(), SegmentStop> {
        let span = tracing::info_span!("checkpoint", job_id = %self.job_id());
        let change = Transition::CheckpointAndComplete {
            checkpoint: checkpoint.clone(),
            result: result.clone(),
            verdict: verdict.to_owned(),
        };
        match tracing::Instrument::instrument(self.lease.write(change), span).await {
            Ok(()) => {
                self.finished("COMPLETED");
                Ok(())
            }
            Err(SegmentStop::LeaseLost(lost)) => {
                // A graft since the claim refuses the completion, not the
                // answer: it is kept (a lease really lost refuses both).
                if let Err(e) = self.checkpoint(checkpoint).await {
                    tracing::debug!(error = %e, "the last answer was not kept either; it is called again");
                }
                Err(SegmentStop::LeaseLost(lost))
            }
            Err(e) => Err(e),
        }
    }

    fn finished(&self, state: &'static str) {
        self.lease.finished(state);
    }

    /// Fails the job for good: a verdict or a defect.
    ///
    /// # Errors
    /// Lease lost, or the store failed.
    pub async fn fail(self, error: &str, verdict: Option<&str>) -> Result<(), SegmentStop> {
        self.lease
            .write(Transition::Fail {
                error: sanitize::error_text(error),
                verdict: verdict.map(sanitize::error_text),
            })
            .await?;
        self.finished("FAILED");
        Ok(())
    }

    /// Starts compensating, the job headed to end with `failure`.
    ///
    /// # Errors
    /// Lease lost, or the store failed.
    pub async fn begin_compensation(&self, failure: serde_json::Value) -> Result<(), SegmentStop> {
        self.lease
            .write(Transition::BeginCompensation { failure })
            .await
    }

    /// Keeps the instant `at` of the timer `step`, just reached, in the
    /// row: a segment that then fails, yields or loses its lease does not
    /// take it with it.
    ///
    /// # Errors
    /// Lease lost, or the store failed.
    pub async fn keep_timer(&self, step: &str, at: &str) -> Result<(), SegmentStop> {
        self.lease
            .write(Transition::KeepTimers {
                timers: serde_json::json!({ step: at }),
            })
            .await
    }

    /// A compensation step answered.
    ///
    /// # Errors
    /// Lease lost, or the store failed.
    pub async fn compensated(&self, checkpoint: &Checkpoint) -> Result<(), SegmentStop> {
        self.lease
            .write(Transition::Compensated {
                checkpoint: checkpoint.clone(),
            })
            .await
    }

    /// Cancelled as someone asked while it ran: CANCELLED with `reason`.
    ///
    /// # Errors
    /// Lease lost, or the store failed.
    pub async fn cancel(self, reason: &str) -> Result<(), SegmentStop> {
        self.lease
            .write(Transition::Cancel {
                reason: sanitize::error_text(reason),
            })
            .await?;
        self.finished("CANCELLED");
        Ok(())
    }

    /// Attempts exhausted: DEAD with the last error verbatim.
    ///
    /// # Errors
    /// Lease lost, or the store failed.
    pub async fn dead(self, error: &str) -> Result<(), SegmentStop> {
        self.lease
            .write(Transition::Dead {
                error: sanitize::error_text(error),
            })
            .await?;
        self.finished("DEAD");
        Ok(())
    }

    /// Hands the job back for a worker that has the targets this one lacks,
    /// spending no attempt; `since` is when that wait began.
    ///
    /// # Errors
    /// Lease lost, or the store failed.
    pub async fn release(
        self,
        reason: &str,
        run_after: DateTime<Utc>,
        since: DateTime<Utc>,
    ) -> Result<(), SegmentStop> {
        self.lease
            .write(Transition::Release {
                reason: sanitize::error_text(reason),
                run_after,
                since,
            })
            .await
    }

    /// Back to the queue at once, its attempt given back: the segment met
    /// its deadline after writing checkpoints, which is progress, not a
    /// failure. Fenced on the lease token only, as it commits no event.
    ///
    /// # Errors
    /// Lease lost, or the store failed.
    pub async fn give_way(self, reason: &str) -> Result<(), SegmentStop> {
        self.lease
            .write(Transition::Yield {
                reason: sanitize::error_text(reason),
            })
            .await
    }

    /// Back to the queue after a retryable failure of `class`, eligible
    /// again at `run_after`.
    ///
    /// # Errors
    /// Lease lost, or the store failed.
    pub async fn requeue(
        self,
        error: &str,
        run_after: DateTime<Utc>,
        class: RetryClass,
    ) -> Result<(), SegmentStop> {
        self.lease
            .write(Transition::Requeue {
                error: sanitize::error_text(error),
                run_after,
            })
            .await?;
        super::telemetry::retry(class);
        Ok(())
    }
}
