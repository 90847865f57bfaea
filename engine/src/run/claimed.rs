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

use crate::Engine;
use crate::run::SegmentStop;
use crate::run::lease::{Fence, Heartbeat, JobFacts, Lease};
use crate::support::sanitize;
use flotilla_targets::RetryClass;

/// A job claimed by this worker, with the token that fences its writes.
#[derive(Debug)]
pub struct ClaimedRun {
    lease: Lease,
    row: RunRow,
}

impl ClaimedRun {
    pub(crate) fn new(engine: Engine, row: RunRow) -> Option<Self> {
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
    pub(crate) fn engine(&self) -> &Engine {
        &self.lease.engine
    }

    /// Writes `checkpoint` fenced on this lease, in the caller's
    /// transaction (a write that must commit with others of its own, unlike
    /// the group-committed ones); [`Self::advance_fence`] once committed.
    /// `false`: the lease is gone, nothing written.
    pub(crate) async fn fenced_checkpoint(
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
    pub(crate) fn advance_fence(&self, events: i64) {
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
    pub(crate) fn token(&self) -> Uuid {
        self.lease.token
    }

    pub(crate) fn fence(&self) -> Fence {
        Fence(self.lease.clone())
    }

    /// What a write of this claim is fenced on, as the store takes it.
    pub(crate) fn store_fence(&self) -> flotilla_store::runs::lease::Fence {
        self.lease.store_fence()
    }

    /// Starts renewing the lease every quarter of its term. A renewal that
    /// fails for another reason than a lost lease is retried at the next
    /// tick: the term leaves room for three misses.
    pub(crate) fn heartbeat(&self) -> Heartbeat {
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

    /// Counts the job as ended `state` (also by a write made outside the
    /// lease's writer: a hold that found a cancel asked).
    pub(crate) fn finished(&self, state: &'static str) {
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

    /// Back to the queue until `run_after`, its attempt given back: a limit
    /// of the fleet's (a target's rate) put the job off, not a failure.
    ///
    /// # Errors
    /// Lease lost, or the store failed.
    pub async fn hold(self, reason: &str, run_after: DateTime<Utc>) -> Result<(), SegmentStop> {
        self.lease
            .write(Transition::Hold {
                reason: sanitize::error_text(reason),
                run_after,
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
    /// again at `run_after`; `step`, the step that failed, counts one
    /// failed attempt more.
    ///
    /// # Errors
    /// Lease lost, or the store failed.
    pub async fn requeue(
        self,
        error: &str,
        run_after: DateTime<Utc>,
        class: RetryClass,
        step: Option<&str>,
    ) -> Result<(), SegmentStop> {
        self.lease
            .write(Transition::Requeue {
                error: sanitize::error_text(error),
                run_after,
                step: step.map(str::to_owned),
            })
            .await?;
        crate::support::telemetry::retry(class);
        Ok(())
    }
}
