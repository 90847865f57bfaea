//! Batched claims: the claim loops of one process that look for work at the
//! same moment share one claim statement, which takes up to one job per
//! waiting loop (see `run/gather.rs`). A claim is a commit of its own, so under
//! load this saves one commit per job; an idle loop's poll costs the same.
//!
//! A loop whose task is aborted while its claim is in flight (a shutdown
//! past its grace) may leave a claimed job nobody runs: its lease lapses and
//! the sweeper requeues it, as for any segment abandoned at that moment.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use flotilla_store::Clock;
use flotilla_store::runs::RunRow;
use flotilla_store::runs::lease;
use sqlx::PgPool;

use crate::run::gather::{Gather, Serve};

/// A claim statement that failed, shared by every loop it served.
#[derive(Debug, Clone, thiserror::Error)]
#[error("claim: {0}")]
pub struct ClaimError(Arc<sqlx::Error>);

impl ClaimError {
    /// The database error behind the failed claim.
    #[must_use]
    pub fn database(&self) -> &sqlx::Error {
        &self.0
    }
}

/// The batched claimer of one engine.
#[derive(Debug, Clone)]
pub(crate) struct Claims(Gather<Claimer>);

/// What runs a claim statement for the waiting loops.
#[derive(Clone)]
pub(crate) struct Claimer {
    pool: PgPool,
    clock: Arc<dyn Clock>,
    worker_id: String,
    lease: std::time::Duration,
    /// Claim statements answered (rows or not), for tests.
    statements: Arc<AtomicU64>,
}

impl std::fmt::Debug for Claimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claimer")
            .field("worker_id", &self.worker_id)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl Claims {
    pub(crate) fn new(
        pool: PgPool,
        clock: Arc<dyn Clock>,
        worker_id: String,
        lease: std::time::Duration,
    ) -> Self {
        Self(Gather::new(Claimer {
            pool,
            clock,
            worker_id,
            lease,
            statements: Arc::default(),
        }))
    }

    /// Claim statements answered so far.
    #[cfg(feature = "test-support")]
    pub(crate) fn statements(&self) -> u64 {
        self.0.server_ref().statements.load(Ordering::Relaxed)
    }

    /// Claims the oldest eligible job for one loop, in a statement it may
    /// share with other loops' claims.
    ///
    /// # Errors
    /// The claim statement failed (the database is unreachable).
    pub(crate) async fn claim_one(&self) -> Result<Option<RunRow>, ClaimError> {
        self.0
            .ask(())
            .await
            .unwrap_or_else(|| Err(ClaimError(Arc::new(sqlx::Error::WorkerCrashed))))
    }
}

impl Serve for Claimer {
    type Request = ();
    type Answer = Result<Option<RunRow>, ClaimError>;
    /// The claim loops of a process rarely number more.
    const MAX_BATCH: usize = 64;

    async fn serve(&self, batch: Vec<()>) -> Vec<Self::Answer> {
        let waiting = batch.len();
        let claimed = self.claim(waiting).await;
        self.statements.fetch_add(1, Ordering::Relaxed);
        match claimed {
            Ok(rows) => {
                let mut answers: Vec<_> = rows.into_iter().map(|row| Ok(Some(row))).collect();
                answers.resize_with(waiting, || Ok(None));
                answers
            }
            Err(e) => vec![Err(ClaimError(Arc::new(e))); waiting],
        }
    }
}

impl Claimer {
    async fn claim(&self, limit: usize) -> Result<Vec<RunRow>, sqlx::Error> {
        let now = self.clock.now();
        let lease_until = now + self.lease;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        flotilla_store::sql::session(&self.pool, async |conn| {
            lease::claim(conn, &self.worker_id, now, lease_until, limit).await
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_store::SystemClock;
    use uuid::Uuid;

    async fn queued(pool: &PgPool) -> Uuid {
        let job_id = Uuid::new_v4();
        flotilla_store::sql::query(
            "INSERT INTO workflow_run (job_id, workflow_name, definition, input, request_digest,
                 status, max_attempts)
             VALUES ($1, 'claimed', '{}', '{}', 'd', 'QUEUED', 3)",
        )
        .bind(job_id)
        .execute(pool)
        .await
        .unwrap();
        job_id
    }

    fn claims(pool: &PgPool) -> Claims {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        Claims::new(
            pool.clone(),
            clock,
            "w".into(),
            std::time::Duration::from_secs(20),
        )
    }

    /// Sixteen loops looking for work at once share a few statements; each
    /// gets a job of its own with a token of its own, and the loops beyond
    /// the queue get nothing.
    #[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
    async fn loops_claiming_at_once_share_statements_and_each_get_their_own_job(pool: PgPool) {
        for _ in 0..12 {
            queued(&pool).await;
        }
        let claims = claims(&pool);
        let answers = futures_util::future::join_all((0..16).map(|_| claims.claim_one())).await;
        let rows: Vec<RunRow> = answers.into_iter().filter_map(|a| a.unwrap()).collect();
        assert_eq!(rows.len(), 12, "every queued job claimed once");
        let jobs: std::collections::HashSet<_> = rows.iter().map(|r| r.job_id).collect();
        let tokens: std::collections::HashSet<_> = rows.iter().map(|r| r.lease_token).collect();
        assert_eq!(
            (jobs.len(), tokens.len()),
            (12, 12),
            "distinct jobs and tokens"
        );
        assert!(
            rows.iter()
                .all(|r| r.attempt == 1 && r.lease_owner.as_deref() == Some("w"))
        );
        let statements = claims.0.server_ref().statements.load(Ordering::Relaxed);
        assert!(statements <= 3, "16 claims took {statements} statements");
    }

    /// A claim that fails reaches every loop it was serving.
    #[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
    async fn a_failed_claim_answers_every_loop_with_the_error(pool: PgPool) {
        queued(&pool).await;
        let claims = claims(&pool);
        pool.close().await;
        let answers = futures_util::future::join_all((0..4).map(|_| claims.claim_one())).await;
        assert!(answers.iter().all(Result::is_err), "{answers:?}");
    }
}
