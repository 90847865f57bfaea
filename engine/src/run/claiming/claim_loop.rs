//! The claim loops of one process.
//!
//! Wake-ups: a claim loop that found nothing waits for an in-process signal
//! (a submission, a job handed to it already claimed, a completed step, a
//! retry in this process), a wake-up
//! from another process (`flotilla_store::wake`: a `NOTIFY` sent after that
//! process's commit, never inside it), or a poll timer that doubles from
//! `idle_poll_min` up to `idle_poll_max`, which finds the work when a
//! wake-up is lost.

use std::time::Duration;

use flotilla_runtime::backoff::Doubling;
use flotilla_runtime::supervise::restart_on_panic;
use flotilla_store::wake::{self, Channel};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::{Engine, Outcome};

/// Pause after a failed claim (the database is unreachable).
const CLAIM_ERROR_PAUSE: Duration = Duration::from_secs(1);

impl Engine {
    /// Starts `claim_loops` supervised claim loops on `tasks`, and the
    /// listener for other processes' wake-ups, each until `shutdown`.
    pub(crate) fn start_claim_loops(&self, tasks: &mut JoinSet<()>, shutdown: &CancellationToken) {
        for index in 0..self.settings().claim_loops {
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
        if self.settings().listen_for_work {
            let (engine, stop) = (self.clone(), shutdown.clone());
            tasks.spawn(async move {
                let wake = || engine.inner.work_available.notify_one();
                wake::listen(engine.pool().clone(), Channel::Runs, wake, stop).await;
            });
        }
    }

    async fn claim_loop(&self, index: usize, shutdown: CancellationToken) {
        let settings = self.settings();
        let mut idle = Doubling::new(settings.idle_poll_min, settings.idle_poll_max);
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
            // Waiting, this loop offers a seat to submissions (`eager.rs`).
            let _seat = self
                .settings()
                .eager_start
                .then(|| self.inner.seats.offer());
            tokio::select! {
                () = self.inner.work_available.notified() => idle.reset(),
                () = tokio::time::sleep(pause) => {}
                () = shutdown.cancelled() => {}
            }
        }
    }
}
