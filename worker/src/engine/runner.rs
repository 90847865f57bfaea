//! The claim loops and the sweeper of one process.
//!
//! Wake-ups: a claim loop that found nothing waits for an in-process signal
//! (a submission, a completed step, a retry in this process) or a poll timer
//! that doubles from 10 ms up to `idle_poll_max`. Work submitted through
//! another process is therefore seen within `idle_poll_max`. LISTEN/NOTIFY
//! was left out: NOTIFY takes a global lock at commit, on the hot path.

use std::time::Duration;

use flotilla_runtime::backoff::Doubling;
use flotilla_runtime::supervise::restart_on_panic;
use flotilla_store::StoreError;
use flotilla_store::runs::lease::{self, Swept};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{Engine, Outcome};

const IDLE_POLL_MIN: Duration = Duration::from_millis(10);
/// How far back a lapsed lease the sweeper cannot settle is put.
const SWEEP_DEFER: Duration = Duration::from_secs(60);
/// Pause after a failed claim (the database is unreachable).
const CLAIM_ERROR_PAUSE: Duration = Duration::from_secs(1);

impl Engine {
    /// Runs `worker_count` claim loops and the sweeper until `shutdown`, then
    /// lets in-flight segments finish within `grace`. Segments still running
    /// after that are abandoned: their leases lapse and another worker resumes
    /// them from their checkpoints.
    pub async fn run(&self, shutdown: CancellationToken, grace: Duration) {
        let mut tasks = JoinSet::new();
        for index in 0..self.settings().worker_count {
            let (engine, shutdown) = (self.clone(), shutdown.clone());
            let health = self.health().clone();
            tasks.spawn(restart_on_panic(
                health,
                format!("claim loop {index}"),
                move || {
                    let (engine, shutdown) = (engine.clone(), shutdown.clone());
                    async move { engine.claim_loop(index, shutdown).await }
                },
            ));
        }
        let (engine, shutdown_sweeper) = (self.clone(), shutdown.clone());
        let health = self.health().clone();
        tasks.spawn(restart_on_panic(health, "sweeper".into(), move || {
            let (engine, shutdown) = (engine.clone(), shutdown_sweeper.clone());
            async move { engine.sweeper(shutdown).await }
        }));

        shutdown.cancelled().await;
        tracing::info!(?grace, "stopping claims; waiting for in-flight segments");
        let drained =
            tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            tracing::warn!("grace period over; abandoning in-flight segments to their leases");
            tasks.shutdown().await;
        }
    }

    async fn claim_loop(&self, index: usize, shutdown: CancellationToken) {
        let mut idle = Doubling::new(IDLE_POLL_MIN, self.settings().idle_poll_max);
        while !shutdown.is_cancelled() {
            let pause = match self.run_once().await {
                Ok(Outcome::Idle) => idle.next_pause(),
                Ok(outcome) => {
                    tracing::debug!(loop_index = index, ?outcome, "segment done");
                    idle.reset();
                    continue;
                }
                Err(e) => {
                    tracing::warn!(loop_index = index, error = %e, "claim failed");
                    CLAIM_ERROR_PAUSE
                }
            };
            tokio::select! {
                () = self.inner.work_available.notified() => idle.reset(),
                () = tokio::time::sleep(pause) => {}
                () = shutdown.cancelled() => {}
            }
        }
    }

    async fn sweeper(&self, shutdown: CancellationToken) {
        let mut ticks = tokio::time::interval(self.settings().sweep_interval);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = shutdown.cancelled() => return,
            }
            if let Err(e) = self.sweep().await {
                tracing::warn!(error = %e, "sweep failed");
            }
        }
    }

    /// One sweeper pass: requeues up to `sweep_batch` RUNNING jobs whose
    /// lease lapsed (DEAD, with its event, when that was the last attempt),
    /// each in a transaction of its own. A job that cannot be settled is
    /// logged and put behind the others. Returns how many jobs it settled.
    ///
    /// # Errors
    /// The database cannot be reached.
    pub async fn sweep(&self) -> Result<u64, StoreError> {
        let now = self.now();
        let lapsed = {
            let mut conn = self.pool().acquire().await?;
            lease::lapsed(&mut conn, now, self.settings().sweep_batch).await?
        };
        let (mut requeued, mut dead) = (0u64, 0u64);
        for job_id in lapsed {
            match self.sweep_one(job_id).await {
                Ok(Some(Swept::Requeued)) => {
                    requeued += 1;
                    super::telemetry::lease_lost_requeued();
                    self.wake();
                }
                Ok(Some(Swept::Dead)) => {
                    dead += 1;
                    metrics::counter!("flotilla_lease_losses_total").increment(1);
                }
                Ok(None) => {}
                Err(e) if e.is_about_the_data() => {
                    tracing::error!(%job_id, error = %e, "a lapsed lease cannot be settled; it waits behind the others");
                    let until = now + SWEEP_DEFER;
                    let mut conn = self.pool().acquire().await?;
                    lease::defer_sweep(&mut conn, job_id, until).await?;
                }
                Err(e) => return Err(e),
            }
        }
        if requeued + dead > 0 {
            tracing::info!(requeued, dead, "swept expired leases");
        }
        Ok(requeued + dead)
    }

    async fn sweep_one(&self, job_id: uuid::Uuid) -> Result<Option<Swept>, StoreError> {
        let mut tx = self.pool().begin().await?;
        let losses = self.settings().max_lease_losses;
        match lease::sweep_one(&mut tx, job_id, self.now(), losses).await {
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
