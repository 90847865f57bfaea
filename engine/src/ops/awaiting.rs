//! Waiting for a job to finish, for the API's long polls (`Prefer: wait`
//! on a submission, `?wait=` on a job's view).
//!
//! A wait is answered by the commit that finishes the job, not by reading
//! its row in a loop: every commit point rings the outbox channel after it
//! commits (the relays' wake-up), and one task per process listens there.
//! On a ring it asks, in one statement, which of the jobs waited on have
//! finished, and wakes their waiters. Rings that come while it asks fold
//! into the next question, so a busy fleet costs one statement per
//! [`CHECK_SPACING`] per process, and only while someone waits. A ring can
//! be lost (a listener reconnecting, a transaction-mode pooler without
//! `--db-listen-url`), so the task also asks every [`FALLBACK`]: a lost
//! ring delays an answer by that much, never loses it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use flotilla_store::StoreError;
use flotilla_store::runs::{self, RunRow};
use flotilla_store::sql::session;
use flotilla_store::wake::{self, Channel};
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::Engine;

/// The longest wait a caller may ask for: below the idle timeout of the
/// load balancers an API usually sits behind (60 s on the common ones).
pub const MAX_WAIT: Duration = Duration::from_secs(50);

/// The most waits one process holds at once; past it a wait is answered
/// at once with the job as it is, and the caller asks again.
pub const MAX_WAITERS: usize = 10_000;

/// The shortest time between two questions to the database.
pub const CHECK_SPACING: Duration = Duration::from_millis(10);

/// How often the waits are checked with no ring at all.
pub const FALLBACK: Duration = Duration::from_secs(1);

/// The waits of one process and the task that answers them.
#[derive(Debug, Default)]
pub(crate) struct EndWatch {
    shared: Arc<Shared>,
    started: OnceLock<()>,
    stop: CancellationToken,
}

#[derive(Debug, Default)]
struct Shared {
    waiters: Mutex<Waiters>,
    /// Rung by the listener for every outbox ring.
    rung: Notify,
}

#[derive(Debug, Default)]
struct Waiters {
    next_id: u64,
    count: usize,
    by_job: HashMap<Uuid, Vec<(u64, Arc<Notify>)>>,
}

impl Drop for EndWatch {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// One wait, given up when dropped (a caller that hung up, a timeout).
pub(crate) struct Waiting {
    shared: Arc<Shared>,
    job_id: Uuid,
    id: u64,
    finished: Arc<Notify>,
}

impl Waiting {
    /// Returns once the job may have finished (read its row to know).
    pub(crate) async fn finished(&self) {
        self.finished.notified().await;
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut waiters = self.shared.lock();
        if let Some(list) = waiters.by_job.get_mut(&self.job_id) {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                waiters.by_job.remove(&self.job_id);
            }
        }
        waiters.count -= 1;
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Waiters> {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn waited_on(&self) -> Vec<Uuid> {
        self.lock().by_job.keys().copied().collect()
    }

    fn wake(&self, finished: &[Uuid]) {
        let waiters = self.lock();
        for job_id in finished {
            for (_, notify) in waiters.by_job.get(job_id).into_iter().flatten() {
                // A permit: a waiter between its registration and its
                // await still hears it.
                notify.notify_one();
            }
        }
    }
}

impl EndWatch {
    /// Registers a wait on `job_id`, starting the task on the first one;
    /// `None` when the process holds [`MAX_WAITERS`] already.
    fn register(&self, pool: &PgPool, job_id: Uuid) -> Option<Waiting> {
        self.started.get_or_init(|| {
            let (shared, stop) = (self.shared.clone(), self.stop.clone());
            let listening = shared.clone();
            let (listen_pool, listen_stop) = (pool.clone(), stop.clone());
            tokio::spawn(async move {
                wake::listen(
                    listen_pool,
                    Channel::Outbox,
                    || listening.rung.notify_one(),
                    listen_stop,
                )
                .await;
            });
            tokio::spawn(answer(pool.clone(), shared, stop));
        });
        let mut waiters = self.shared.lock();
        if waiters.count >= MAX_WAITERS {
            return None;
        }
        waiters.count += 1;
        waiters.next_id += 1;
        let (id, finished) = (waiters.next_id, Arc::new(Notify::new()));
        waiters
            .by_job
            .entry(job_id)
            .or_default()
            .push((id, finished.clone()));
        Some(Waiting {
            shared: self.shared.clone(),
            job_id,
            id,
            finished,
        })
    }
}

/// Asks which waited-on jobs finished at every ring (and every
/// [`FALLBACK`]), and wakes their waiters.
async fn answer(pool: PgPool, shared: Arc<Shared>, stop: CancellationToken) {
    let mut failing = false;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = shared.rung.notified() => {}
            () = tokio::time::sleep(FALLBACK) => {}
        }
        let waited_on = shared.waited_on();
        if !waited_on.is_empty() {
            let asked = session(&pool, async |conn| {
                runs::finished_among(conn, &waited_on).await
            })
            .await;
            match asked {
                Ok(finished) => {
                    failing = false;
                    shared.wake(&finished);
                }
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e,
                        "waits for jobs to finish cannot be checked; they are answered when their time is up");
                }
                Err(_) => {}
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(CHECK_SPACING) => {}
        }
    }
}

impl Engine {
    /// The waits for a job to finish this process holds now.
    #[must_use]
    pub fn waits_held(&self) -> usize {
        self.inner.end_watch.shared.lock().count
    }

    /// The job's row once it has finished, or as it is when `wait` (at most
    /// [`MAX_WAIT`]) runs out first; `None` for an unknown job. Answered at
    /// once for a finished job, and when the process holds [`MAX_WAITERS`].
    ///
    /// # Errors
    /// Database errors.
    pub async fn job_when_finished(
        &self,
        job_id: Uuid,
        wait: Duration,
    ) -> Result<Option<RunRow>, StoreError> {
        // Registered before the first read: a finish committed in between
        // still wakes this wait.
        let waiting = self.inner.end_watch.register(self.pool(), job_id);
        let row = self.job(job_id).await?;
        let Some(waiting) = waiting else {
            return Ok(row);
        };
        match &row {
            Some(row) if !row.status.is_finished() => {}
            _ => return Ok(row),
        }
        let deadline = tokio::time::Instant::now() + wait.min(MAX_WAIT);
        loop {
            if tokio::time::timeout_at(deadline, waiting.finished())
                .await
                .is_err()
            {
                return self.job(job_id).await;
            }
            let row = self.job(job_id).await?;
            // A job retried meanwhile may be woken for a finish it left.
            if row.as_ref().is_none_or(|row| row.status.is_finished()) {
                return Ok(row);
            }
        }
    }
}
