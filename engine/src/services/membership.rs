//! Membership: this worker announces itself to the fleet on every sweeper
//! tick (with its finishes since the last one), refuses to start beside a
//! live worker of its own id, and leaves the fleet when it stops.

use std::time::Duration;

use flotilla_store::StoreError;
use flotilla_store::sql::session;
use flotilla_store::{finished, workers};

use crate::Engine;

/// Rows of workers gone this long are deleted by the others' sweepers.
const FORGET_AFTER: Duration = Duration::from_secs(24 * 3600);
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Engine {
    /// Records that this worker is alive, adds its finishes since the last
    /// announcement to the fleet's tally, and forgets long-gone workers and
    /// minutes.
    ///
    /// # Errors
    /// Database errors.
    pub async fn announce(&self) -> Result<(), StoreError> {
        let loops = i32::try_from(self.settings().claim_loops).unwrap_or(i32::MAX);
        let started_at = self.inner.started_at;
        let forget = chrono::Duration::from_std(FORGET_AFTER).unwrap_or(chrono::Duration::zero());
        let forget_before = self.now() - forget;
        session(self.pool(), async |conn| {
            workers::heartbeat(conn, &self.settings().worker_id, loops, started_at).await?;
            workers::forget_departed(conn, millis(FORGET_AFTER)).await?;
            finished::forget_before(conn, forget_before).await
        })
        .await?;
        // Alone: the counts it takes are put back only when its own
        // statement fails, so nothing after it may roll it back.
        session(self.pool(), async |conn| {
            self.inner.finishes.flush(conn).await
        })
        .await?;
        Ok(())
    }

    /// Removes this worker's row: it is stopping.
    ///
    /// # Errors
    /// Database errors.
    pub async fn leave_fleet(&self) -> Result<(), StoreError> {
        session(self.pool(), async |conn| {
            workers::leave(conn, &self.settings().worker_id).await
        })
        .await?;
        Ok(())
    }
}

/// Another live worker announces itself under this worker's id.
#[derive(Debug, thiserror::Error)]
pub enum Namesake {
    #[error(
        "worker id {worker_id:?} is in use by another live worker (it announced itself {seconds:.0} s ago and again while this one waited); give every worker its own FLOTILLA_WORKER_ID"
    )]
    Alive { worker_id: String, seconds: f64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Engine {
    /// Refuses to start beside a live worker of the same id (two members
    /// with one `group.instance.id` fence each other, and one lease owner
    /// name would stand for two processes). A row that was fresh may be a
    /// predecessor that died a moment ago: it counts only if it is
    /// announced again within two sweep intervals.
    ///
    /// # Errors
    /// [`Namesake::Alive`]; database errors.
    pub async fn refuse_a_live_namesake(&self) -> Result<(), Namesake> {
        let worker_id = &self.settings().worker_id;
        let every = self.settings().sweep_interval;
        let fresh = (every * 2 + std::time::Duration::from_secs(1)).as_secs_f64();
        let seen = session(self.pool(), async |conn| {
            workers::last_seen(conn, worker_id).await
        });
        let Some((first, seconds)) = seen.await? else {
            return Ok(());
        };
        if seconds > fresh {
            return Ok(());
        }
        tracing::info!(%worker_id, seconds, "a worker of this id announced itself lately; waiting to see whether it is alive");
        tokio::time::sleep(every * 2 + std::time::Duration::from_secs(1)).await;
        let seen = session(self.pool(), async |conn| {
            workers::last_seen(conn, worker_id).await
        });
        match seen.await? {
            Some((again, seconds)) if again > first => Err(Namesake::Alive {
                worker_id: worker_id.clone(),
                seconds,
            }),
            _ => Ok(()),
        }
    }
}

impl From<sqlx::Error> for Namesake {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}
