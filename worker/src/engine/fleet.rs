//! The fleet as the console shows it: this worker announces itself on every
//! sweeper tick, and [`Engine::fleet`] reads every worker, relay, the outbox
//! backlog, dead letters by reason and the last hour's finishes.

use std::time::Duration;

use chrono::{DateTime, Utc};
use flotilla_store::StoreError;
use flotilla_store::buckets::{self, RelayMember};
use flotilla_store::dead_letters::{self, Tally};
use flotilla_store::outbox::history::{self, FinishedInMinute, OutboxSummary};
use flotilla_store::workers::{self, WorkerMember};

use super::Engine;

/// A member not seen for this long is left out of the fleet (workers and
/// relays refresh their rows every few seconds).
pub const MEMBER_TTL: Duration = Duration::from_secs(60);
/// Rows of workers gone this long are deleted by the others' sweepers.
const FORGET_AFTER: Duration = Duration::from_secs(24 * 3600);
/// How far back the chart of finished jobs reaches.
pub const FINISHED_WINDOW: Duration = Duration::from_secs(3600);

/// What the database says about the fleet.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FleetSnapshot {
    pub workers: Vec<WorkerMember>,
    pub relays: Vec<RelayMember>,
    pub outbox: OutboxSummary,
    pub dead_letters: Vec<Tally>,
    pub finished_per_minute: Vec<FinishedInMinute>,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Engine {
    /// Records that this worker is alive (and forgets long-gone ones).
    ///
    /// # Errors
    /// Database errors.
    pub async fn announce(&self, started_at: DateTime<Utc>) -> Result<(), StoreError> {
        let mut conn = self.pool().acquire().await?;
        let loops = i32::try_from(self.settings().worker_count).unwrap_or(i32::MAX);
        workers::heartbeat(&mut conn, &self.settings().worker_id, loops, started_at).await?;
        workers::forget_departed(&mut conn, millis(FORGET_AFTER)).await?;
        Ok(())
    }

    /// Removes this worker's row: it is stopping.
    ///
    /// # Errors
    /// Database errors.
    pub async fn leave_fleet(&self) -> Result<(), StoreError> {
        let mut conn = self.pool().acquire().await?;
        workers::leave(&mut conn, &self.settings().worker_id).await?;
        Ok(())
    }

    /// Workers, relays, the outbox, dead letters and the last hour's
    /// finishes, read in one repeatable-read snapshot.
    ///
    /// # Errors
    /// Database errors.
    pub async fn fleet(&self) -> Result<FleetSnapshot, StoreError> {
        let mut tx = self.pool().begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await?;
        let ttl = millis(MEMBER_TTL);
        let since = self.now()
            - chrono::Duration::from_std(FINISHED_WINDOW).unwrap_or(chrono::Duration::zero());
        let snapshot = FleetSnapshot {
            workers: workers::list(&mut tx, ttl).await?,
            relays: buckets::members(&mut tx, ttl).await?,
            outbox: history::summary(&mut tx).await?,
            dead_letters: dead_letters::list(&mut tx).await?,
            finished_per_minute: history::finished_per_minute(&mut tx, since).await?,
        };
        tx.commit().await?;
        Ok(snapshot)
    }

    /// Counts dead letters by reason code.
    ///
    /// # Errors
    /// Database errors.
    pub async fn tally_dead_letters(&self, codes: &[&str]) -> Result<(), StoreError> {
        let mut conn = self.pool().acquire().await?;
        dead_letters::record(&mut conn, codes).await?;
        Ok(())
    }
}
