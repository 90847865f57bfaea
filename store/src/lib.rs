//! `flotilla-store`: every SQL statement Flotilla runs, one module per table,
//! plus the migrator, the pool and the clock.
//!
//! Functions take a connection (`&mut PgConnection`, which a transaction
//! derefs to) so callers choose the transaction boundary, except where a
//! change and its outbox row must commit together: those take a
//! `&mut PgTransaction`, so a commit point without its event cannot be
//! written. The schema itself lives in `migrations/` only.

pub mod clock;
pub mod consumer_offsets;
pub mod definitions;
mod fleet;
pub mod outbox;
pub mod pool;
pub mod retention;
pub mod runs;
pub mod schedules;
pub mod sql;
mod status;
pub mod target_rates;
pub mod topics;
pub mod wake;

pub use fleet::{buckets, dead_letters, features, finished, workers};

pub use clock::{Clock, ManualClock, SystemClock};
pub use pool::{DatabaseConfig, MIGRATOR, Pooler, connect, migrate};
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
    /// One failure of the database shared by every write it stopped (a
    /// batch that could not begin, say): nothing of theirs was written.
    #[error("database: {0}")]
    Shared(std::sync::Arc<sqlx::Error>),
    /// The commit was sent but its answer never came back: the writes may
    /// or may not be durable. Never redone blindly; the job resumes from
    /// what the database holds.
    #[error("commit outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// The row is held by another session (an operator's open `SELECT …
    /// FOR UPDATE`): nothing of this write was tried.
    #[error("the row is locked by another session")]
    RowHeld,
}

impl StoreError {
    /// Whether the store refused *this data* (a value it cannot hold, a
    /// broken constraint, an event the contract refuses) rather than failed
    /// as a service: retrying the same data will fail the same way.
    #[must_use]
    pub fn is_about_the_data(&self) -> bool {
        match self {
            Self::Database(sqlx::Error::Database(e)) => e.code().is_some_and(|code| {
                // 22: data exception (NUL in text or JSON, bad encoding, out
                // of range); 54: program limit (an index entry too large);
                // 23514: a CHECK constraint.
                code.starts_with("22") || code.starts_with("54") || code == "23514"
            }),
            Self::Database(_) | Self::Shared(_) | Self::OutcomeUnknown(_) | Self::RowHeld => false,
            Self::Corrupt { .. } | Self::Event(_) => true,
        }
    }

    /// Whether this write waited too long for a row lock another session
    /// holds, or ran past its statement timeout: about the row it touched
    /// (an operator's open `SELECT … FOR UPDATE`, say), not the database.
    #[must_use]
    pub fn is_a_blocked_row(&self) -> bool {
        // 55P03: lock_not_available (lock_timeout); 57014: query_canceled
        // (statement_timeout).
        matches!(self, Self::RowHeld)
            || matches!(self, Self::Database(sqlx::Error::Database(e))
                if e.code().is_some_and(|code| code == "55P03" || code == "57014"))
    }
}
