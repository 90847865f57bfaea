//! Every SQL statement Flotilla runs, one module per table. Functions take a
//! connection (`&mut PgConnection`, which a transaction derefs to) so that
//! callers choose the transaction boundary.

pub mod definitions;
pub mod outbox;
pub mod runs;

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
