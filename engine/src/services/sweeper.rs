//! The sweeper: on every tick, this worker announces itself, settles the
//! layout switches, requeues jobs whose lease lapsed, cascades cancels,
//! wakes waits that came due and jobs held by a concurrency slot now free,
//! in that order (announced first: after an
//! outage this worker's own lapsed jobs must find it alive, or their lapses
//! would count).

use std::time::Duration;

use chrono::{DateTime, Utc};
use flotilla_store::StoreError;
use flotilla_store::runs::lease::{self, Lapsed, SweepPolicy, Swept, SweptLease};
use flotilla_store::sql::session;
use tokio_util::sync::CancellationToken;

use crate::Engine;

/// How far back a lapsed lease the sweeper cannot settle is put.
const SWEEP_DEFER: Duration = Duration::from_secs(60);

impl Engine {
    /// Sweeps lapsed leases and announces this worker to the fleet on every
    /// tick (`run` leaves the fleet once its jobs are handed back).
    pub(crate) async fn sweeper(&self, shutdown: CancellationToken) {
        let mut ticks = tokio::time::interval(self.settings().sweep_interval);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = shutdown.cancelled() => break,
            }
            // Announced first: after an outage this worker's own lapsed
            // jobs must find it alive, or their lapses would count.
            if let Err(e) = self.announce().await {
                tracing::warn!(error = %e, "announcing this worker to the fleet failed");
            }
            if let Err(e) = self.settle_switches(false).await {
                tracing::warn!(error = %e, "checking the run layout switches failed");
            }
            if let Err(e) = self.sweep().await {
                tracing::warn!(error = %e, "sweep failed");
            }
            if let Err(e) = self.cascade_cancels().await {
                tracing::warn!(error = %e, "cancelling the children of cancelled jobs failed");
            }
            if let Err(e) = self.wake_due_waits().await {
                tracing::warn!(error = %e, "requeueing waiting jobs whose timers or Kafka requests came due failed");
            }
            if let Err(e) = self.wake_held().await {
                tracing::warn!(error = %e, "waking jobs held by their concurrency keys failed");
            }
        }
    }

    /// One sweeper pass: requeues up to `sweep_batch` RUNNING jobs whose
    /// lease lapsed (DEAD, with its event, when that was the last attempt),
    /// each in a transaction of its own and a span of its own that continues
    /// the job's trace. A job that cannot be settled is logged and put
    /// behind the others. Returns how many jobs it settled.
    ///
    /// # Errors
    /// The database cannot be reached.
    pub async fn sweep(&self) -> Result<u64, StoreError> {
        let now = self.now();
        let lapsed = {
            let batch = self.settings().sweep_batch;
            session(self.pool(), async |conn| {
                lease::lapsed(conn, now, batch).await
            })
            .await?
        };
        let (mut requeued, mut dead, mut cancelled) = (0u64, 0u64, 0u64);
        for job in lapsed {
            let span = sweep_span(&job, &self.settings().worker_id);
            match tracing::Instrument::instrument(self.sweep_lapsed(&job, now), span).await? {
                Some(Swept::Requeued) => requeued += 1,
                Some(Swept::Dead | Swept::Compensating) => dead += 1,
                Some(Swept::Cancelled) => cancelled += 1,
                None => {}
            }
        }
        if requeued + dead + cancelled > 0 {
            tracing::info!(requeued, dead, cancelled, "swept expired leases");
        }
        Ok(requeued + dead + cancelled)
    }

    /// Settles one lapsed lease, inside its span (see [`sweep_span`]).
    async fn sweep_lapsed(
        &self,
        job: &Lapsed,
        now: DateTime<Utc>,
    ) -> Result<Option<Swept>, StoreError> {
        let job_id = job.job_id;
        let span = tracing::Span::current();
        let swept = match self.sweep_one(job_id).await {
            Ok(Some(swept)) => swept,
            Ok(None) => return Ok(None),
            Err(e) if e.is_about_the_data() => {
                span.record("flotilla.outcome", "deferred");
                tracing::error!(%job_id, error = %e, "a lapsed lease cannot be settled; it waits behind the others");
                // A row that refuses even the deferral is skipped: the pass
                // goes on to the others.
                let deferred = session(self.pool(), async |conn| {
                    lease::defer_sweep(conn, job_id, now + SWEEP_DEFER).await
                });
                if let Err(e) = deferred.await {
                    tracing::error!(%job_id, error = %e, "a lapsed lease cannot even be deferred; skipped in this pass");
                }
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let (attempt, lease_losses) = (swept.attempt, swept.lease_losses);
        span.record("attempt", attempt);
        match swept.outcome {
            Swept::Requeued => {
                span.record("flotilla.outcome", "requeued");
                crate::support::telemetry::lease_lost_requeued(swept.counted);
                tracing::warn!(%job_id, attempt, lease_losses, counted = swept.counted,
                    "lease lapsed; job requeued without spending the attempt");
                self.wake();
            }
            Swept::Dead => {
                span.record("flotilla.outcome", "dead");
                crate::support::telemetry::lease_lost_dead();
                self.job_finished(
                    (&job.workflow_name, job.workflow_version),
                    "DEAD",
                    job.created_at,
                );
                tracing::warn!(%job_id, attempt, lease_losses, "lease lapsed once too often; job is DEAD");
            }
            Swept::Compensating => {
                span.record("flotilla.outcome", "compensating");
                crate::support::telemetry::lease_lost_dead();
                tracing::warn!(%job_id, attempt, lease_losses,
                    "lease lapsed once too often; job queued to run its on_failure steps, then DEAD");
                self.wake();
            }
            Swept::Cancelled => {
                span.record("flotilla.outcome", "cancelled");
                self.job_finished(
                    (&job.workflow_name, job.workflow_version),
                    "CANCELLED",
                    job.created_at,
                );
                tracing::info!(%job_id, attempt, "lease lapsed after a cancellation was asked; job CANCELLED");
            }
        }
        Ok(Some(swept.outcome))
    }

    async fn sweep_one(&self, job_id: uuid::Uuid) -> Result<Option<SweptLease>, StoreError> {
        let mut tx = self.pool().begin().await?;
        let settings = self.settings();
        let policy = SweepPolicy {
            max_lease_losses: settings.max_lease_losses,
            // A live worker announces itself every sweep interval.
            owner_stale_after: settings.lease.max(settings.sweep_interval * 3),
            owner_grace: settings.sweep_interval * 2,
            backoff_base: settings.backoff_base,
        };
        match lease::sweep_one(&mut tx, job_id, self.now(), policy).await {
            Ok(swept) => {
                tx.commit().await?;
                Ok(swept)
            }
            Err(e) => {
                tx.rollback().await?;
                Err(e)
            }
        }
    }
}

/// The span of sweeping one lapsed lease: a child of the job's trace (when
/// spans are exported), so a lost worker shows in the job's trace between
/// its segments. `attempt` and `flotilla.outcome` (`requeued`, `dead`, or
/// `deferred` when the row could not be settled) are recorded once known.
fn sweep_span(job: &Lapsed, worker_id: &str) -> tracing::Span {
    let span = tracing::info_span!(
        "sweep",
        otel.name = format!("sweep {}", job.workflow_name),
        otel.kind = "internal",
        job_id = %job.job_id,
        workflow_name = %job.workflow_name,
        trace_id = flotilla_runtime::trace::trace_id(job.traceparent.as_deref()),
        attempt = tracing::field::Empty,
        flotilla.outcome = tracing::field::Empty,
        worker_id = %worker_id,
    );
    flotilla_runtime::trace::continue_trace(
        &span,
        job.traceparent.as_deref(),
        job.tracestate.as_deref(),
    );
    span
}
