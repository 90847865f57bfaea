//! The fleet as the console shows it: [`Engine::fleet`] reads every
//! worker, relay, the outbox backlog, dead letters by reason and the last
//! hour's finishes (each worker announces itself: `services/membership.rs`).

use std::time::Duration;

use flotilla_store::StoreError;
use flotilla_store::buckets::{self, RelayMember};
use flotilla_store::dead_letters::{self, Tally};
use flotilla_store::finished::FinishedInMinute;
use flotilla_store::outbox::history::{self, OutboxSummary};
use flotilla_store::sql::session;
use flotilla_store::workers::{self, WorkerMember};

use crate::{Engine, MEMBER_TTL};

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

impl Engine {
    /// Workers, relays, the outbox backlog, dead letters and the last
    /// hour's finishes: each a small read (statements of their own, no
    /// snapshot held open), none of which grows with the history.
    ///
    /// # Errors
    /// Database errors.
    pub async fn fleet(&self) -> Result<FleetSnapshot, StoreError> {
        let ttl = i64::try_from(MEMBER_TTL.as_millis()).unwrap_or(i64::MAX);
        let since = self.now()
            - chrono::Duration::from_std(FINISHED_WINDOW).unwrap_or(chrono::Duration::zero());
        session(self.pool(), async |conn| {
            Ok(FleetSnapshot {
                workers: workers::list(conn, ttl).await?,
                relays: buckets::members(conn, ttl).await?,
                outbox: history::summary(conn).await?,
                dead_letters: dead_letters::list(conn).await?,
                finished_per_minute: self.inner.finishes.since(conn, since).await?,
            })
        })
        .await
    }

    /// Counts dead letters by reason code.
    ///
    /// # Errors
    /// Database errors.
    pub async fn tally_dead_letters(&self, codes: &[&str]) -> Result<(), StoreError> {
        session(self.pool(), async |conn| {
            dead_letters::record(conn, codes).await
        })
        .await?;
        Ok(())
    }
}
