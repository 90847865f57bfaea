//! `flotilla-store`: every SQL statement Flotilla runs, one module per table,
//! plus the migrator, the pool and the clock.
//!
//! Functions take a connection (`&mut PgConnection`, which a transaction
//! derefs to) so callers choose the transaction boundary, except where a
//! change and its outbox row must commit together: those take a
//! `&mut PgTransaction`, so a commit point without its event cannot be
//! written. The schema itself lives in `migrations/` only.

pub mod buckets;
pub mod clock;
pub mod definitions;
pub mod outbox;
pub mod pool;
pub mod runs;
mod status;

pub use clock::{Clock, ManualClock, SystemClock};
pub use pool::{DatabaseConfig, MIGRATOR, connect, migrate};
pub use status::{OutboxStatus, RunStatus, UnknownStatus};

/// A failure of the store: the database, or a row that breaks an invariant.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("corrupt row for job {job_id}: {reason}")]
    Corrupt { job_id: uuid::Uuid, reason: String },
    #[error("event refused by the contract: {0}")]
    Event(#[from] flotilla_contracts::RuleViolation),
}
