//! One process's engine from start to stop: its claim loops (`run/`) and
//! its background services (`services/`) under one shutdown, then the
//! hand-back of what is still running and leaving the fleet.

use std::time::Duration;

use flotilla_store::runs::lease;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::Engine;

impl Engine {
    /// Runs `claim_loops` claim loops and the background services until `shutdown`, then
    /// lets in-flight segments finish within `grace`. Segments still running
    /// after that are handed back in one statement (their leases lapse if
    /// the database does not answer) and another worker resumes them from
    /// their checkpoints; then this worker leaves the fleet. Takes at most
    /// `grace` plus [`Engine::wind_down`] after `shutdown`.
    pub async fn run(&self, shutdown: CancellationToken, grace: Duration) {
        let mut tasks = JoinSet::new();
        self.start_claim_loops(&mut tasks, &shutdown);
        crate::services::start(self, &mut tasks, &shutdown);

        shutdown.cancelled().await;
        tracing::info!(?grace, "stopping claims; waiting for in-flight segments");
        let drained =
            tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
        let mut held = Vec::new();
        if drained.is_err() {
            held = self.inner.in_flight.held();
            tasks.shutdown().await;
        }
        // Jobs a submission wrote claimed for a loop that stopped before
        // taking them: back to the queue now, not at their lease's lapse.
        held.extend(self.inner.seats.close());
        self.hand_back(&held, "at the end of its shutdown grace")
            .await;
        // Only now: until its jobs are handed back, a lapse of one of them
        // must find this worker alive.
        let left = tokio::time::timeout(self.settings().lease / 4, self.leave_fleet()).await;
        if !matches!(left, Ok(Ok(()))) {
            tracing::warn!("leaving the fleet failed; the row ages out");
        }
    }

    /// How long [`Engine::run`] may take after its grace: the hand-back of
    /// what is still running and leaving the fleet, each bounded by a
    /// quarter of the lease.
    #[must_use]
    pub fn wind_down(&self) -> Duration {
        self.settings().lease / 2 + Duration::from_secs(1)
    }

    /// Gives back, in one statement, jobs this worker holds and will not
    /// run (`held`: job and lease token; the segments a shutdown's grace
    /// did not see finish, or jobs handed over already claimed that no
    /// loop took in time): fenced on their tokens, no attempt spent, no
    /// lapse counted. If the database cannot be reached, their leases
    /// lapse and the sweeper requeues them.
    pub(crate) async fn hand_back(&self, held: &[(uuid::Uuid, uuid::Uuid)], when: &str) {
        if held.is_empty() {
            return;
        }
        let reason = format!("handed back by worker {} {when}", self.settings().worker_id);
        let now = self.now();
        let handed =
            self.on_reserved(async |conn| lease::hand_back_all(conn, held, now, &reason).await);
        // A database that does not answer must not hold the exit up.
        let bound = self.settings().lease / 4;
        let handed = tokio::time::timeout(bound, handed)
            .await
            .unwrap_or(Err(sqlx::Error::PoolTimedOut));
        match handed {
            Ok(count) => {
                tracing::warn!(jobs = count, when, "jobs handed back");
                self.wake();
            }
            Err(e) => tracing::warn!(jobs = held.len(), when, error = %e,
                "handing jobs back failed; their leases will lapse"),
        }
    }
}
