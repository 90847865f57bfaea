//! Group commit: the fenced writes of many running jobs (checkpoints,
//! completions, parking, failures, requeues) share one transaction.
//!
//! A writer queues its change and waits for its own outcome; concurrent
//! changes gather while a commit is in flight (see `gather.rs`), so one
//! commit carries many, and a lone write commits at once. Each change is
//! written fenced on its own lease token, and each writer still waits for
//! its own write to be durable before its job runs its next step.
//!
//! A lease lost for one job answers only that writer (its statement matched
//! no row). When the batch fails (the database refuses one change, or
//! fails as a service), its changes are written again one by one, so a
//! refusal stays with the change it is about and each writer gets its own
//! outcome.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use chrono::{DateTime, Utc};
use flotilla_store::StoreError;
use flotilla_store::runs::lease::{self, Transition};
use sqlx::PgPool;
use uuid::Uuid;

use super::gather::{Gather, Serve};

/// One fenced write.
#[derive(Debug)]
pub(super) struct Write {
    job_id: Uuid,
    token: Uuid,
    now: DateTime<Utc>,
    change: Transition,
}

/// The group committer of one engine.
#[derive(Debug, Clone)]
pub(super) struct GroupCommit(Gather<Committer>);

/// What writes a batch: the pool, and a count of commits for tests.
#[derive(Debug, Clone)]
pub(super) struct Committer {
    pool: PgPool,
    /// Batches committed (or tried), for tests.
    batches: Arc<AtomicU64>,
}

impl GroupCommit {
    pub(super) fn new(pool: PgPool) -> Self {
        Self(Gather::new(Committer {
            pool,
            batches: Arc::default(),
        }))
    }

    /// Writes `change` to `job_id` if `token` still holds its lease, in a
    /// transaction it may share with other jobs' changes; `Ok(false)` when
    /// the lease is lost (nothing written).
    ///
    /// # Errors
    /// The database refused this change, or failed.
    pub(super) async fn write(
        &self,
        job_id: Uuid,
        token: Uuid,
        now: DateTime<Utc>,
        change: Transition,
    ) -> Result<bool, StoreError> {
        let write = Write {
            job_id,
            token,
            now,
            change,
        };
        self.0
            .ask(write)
            .await
            .unwrap_or_else(|| Err(sqlx::Error::WorkerCrashed.into()))
    }
}

impl Serve for Committer {
    type Request = Write;
    /// `Ok(false)`: the lease is lost and nothing was written.
    type Answer = Result<bool, StoreError>;
    const MAX_BATCH: usize = 64;

    async fn serve(&self, batch: Vec<Write>) -> Vec<Self::Answer> {
        self.batches.fetch_add(1, Ordering::Relaxed);
        metrics::histogram!("flotilla_group_commit_writes").record(batch.len() as f64);
        if batch.len() == 1 {
            return vec![self.write_alone(&batch[0]).await];
        }
        match self.write_together(&batch).await {
            Ok(outcomes) => outcomes.into_iter().map(Ok).collect(),
            Err(e) => {
                tracing::debug!(error = %e, writes = batch.len(),
                    "a shared commit failed; writing its changes one by one");
                let mut outcomes = Vec::with_capacity(batch.len());
                for write in &batch {
                    outcomes.push(self.write_alone(write).await);
                }
                outcomes
            }
        }
    }
}

impl Committer {
    async fn write_together(&self, batch: &[Write]) -> Result<Vec<bool>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let mut outcomes = Vec::with_capacity(batch.len());
        for write in batch {
            outcomes.push(
                lease::transition(&mut tx, write.job_id, write.token, write.now, &write.change)
                    .await?,
            );
        }
        tx.commit().await?;
        Ok(outcomes)
    }

    async fn write_alone(&self, write: &Write) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let written =
            lease::transition(&mut tx, write.job_id, write.token, write.now, &write.change).await?;
        if written {
            tx.commit().await?;
        } else {
            // Release the connection clean: a dropped transaction rolls back
            // only when its connection is next used.
            tx.rollback().await?;
        }
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_store::runs::{Checkpoint, CheckpointLayout};

    /// A RUNNING row leased with `token`.
    async fn running(pool: &PgPool, token: Uuid) -> Uuid {
        let job_id = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO workflow_run (job_id, workflow_name, definition, input, request_digest,
                 status, max_attempts, attempt, lease_owner, lease_token, lease_until)
             VALUES ($1, 'shared', '{}', '{}', 'd', 'RUNNING', 3, 1, 'w', $2, now() + interval '1 minute')",
        )
        .bind(job_id)
        .bind(token)
        .execute(pool)
        .await
        .unwrap();
        job_id
    }

    fn checkpoint(response: serde_json::Value, layout: CheckpointLayout) -> Transition {
        Transition::Checkpoint {
            checkpoint: Checkpoint {
                name: "one".into(),
                skipped: false,
                response,
            },
            layout,
        }
    }

    /// The job's rows in `table`.
    async fn count(pool: &PgPool, table: &str, job_id: Uuid) -> i64 {
        sqlx::query_scalar(&format!("SELECT count(*) FROM {table} WHERE job_id = $1"))
            .bind(job_id)
            .fetch_one(pool)
            .await
            .unwrap()
    }

    /// Four writers at once: the first commits alone, the other three share
    /// a transaction; of those, one lost its lease and one carries a value
    /// Postgres refuses. Each gets its own outcome, and the good ones are
    /// written, checkpoint rows included.
    #[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
    async fn writers_sharing_a_commit_each_get_their_own_outcome(pool: PgPool) {
        let group = GroupCommit::new(pool.clone());
        let token = Uuid::new_v4();
        let first = running(&pool, token).await;
        let good = running(&pool, token).await;
        let lost = running(&pool, Uuid::new_v4()).await;
        let refused = running(&pool, token).await;
        let now = Utc::now();
        let ok = serde_json::json!({"ok": true});
        let rows = CheckpointLayout::Rows;
        let (a, b, c, d) = tokio::join!(
            group.write(first, token, now, checkpoint(ok.clone(), rows)),
            group.write(good, token, now, checkpoint(ok.clone(), rows)),
            group.write(lost, token, now, checkpoint(ok.clone(), rows)),
            // JSONB cannot hold a NUL character.
            group.write(
                refused,
                token,
                now,
                checkpoint(serde_json::json!({"bad": "\u{0}"}), rows)
            ),
        );
        assert!(a.unwrap(), "written alone");
        assert!(b.unwrap(), "written beside the others' failures");
        assert!(!c.unwrap(), "the lost lease answers only its writer");
        let refusal = d.expect_err("refused");
        assert!(refusal.is_about_the_data(), "{refusal}");
        for (job, expected) in [(first, 1), (good, 1), (lost, 0), (refused, 0)] {
            assert_eq!(
                count(&pool, "workflow_run_outbox", job).await,
                expected,
                "{job}"
            );
            assert_eq!(
                count(&pool, "workflow_run_checkpoint", job).await,
                expected,
                "{job}"
            );
        }
    }

    /// Under load, many writes share one commit.
    #[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
    async fn concurrent_writes_share_commits(pool: PgPool) {
        let group = GroupCommit::new(pool.clone());
        let token = Uuid::new_v4();
        let mut jobs = Vec::new();
        for _ in 0..40 {
            jobs.push(running(&pool, token).await);
        }
        // Every kind of commit point, side by side.
        let change = |n: usize| match n % 4 {
            0 => checkpoint(serde_json::json!({"n": 1}), CheckpointLayout::Array),
            1 => Transition::Park {
                step: "approve".into(),
            },
            2 => Transition::Fail {
                error: "refused".into(),
                verdict: Some("no".into()),
            },
            _ => Transition::Complete {
                result: serde_json::json!({}),
                verdict: "done".into(),
            },
        };
        let writes = jobs
            .iter()
            .enumerate()
            .map(|(n, job)| group.write(*job, token, Utc::now(), change(n)));
        let outcomes = futures_util::future::join_all(writes).await;
        assert!(outcomes.into_iter().all(|o| o.unwrap()));
        for (n, job) in jobs.iter().enumerate() {
            assert_eq!(count(&pool, "workflow_run_outbox", *job).await, 1);
            let status: String =
                sqlx::query_scalar("SELECT status FROM workflow_run WHERE job_id = $1")
                    .bind(job)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            let expected = ["RUNNING", "WAITING", "FAILED", "COMPLETED"][n % 4];
            assert_eq!(status, expected, "{job}");
        }
        let batches = group.0.server().batches.load(Ordering::Relaxed);
        assert!(batches <= 5, "40 writes took {batches} commits");
    }
}
