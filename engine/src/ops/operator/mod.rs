//! Operator verbs: retry a finished-for-good job, cancel one that waits;
//! `bulk.rs` does either to every job a filter matches.

pub mod bulk;

use uuid::Uuid;

use flotilla_store::definitions;
use flotilla_store::runs::idle::{self, IdleSettle};
use flotilla_store::runs::moves::{self, Onto};
use flotilla_store::runs::{self, RunRow, lease};
use flotilla_store::{RunStatus, StoreError};
use flotilla_workflow::{WorkflowDefinition, unchanged};

use crate::Engine;
use crate::support::storable::{self, Unstorable};

#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("job {0} not found")]
    NotFound(Uuid),
    #[error("job {job_id} is {status}; {verb} applies to {allowed}")]
    WrongState {
        job_id: Uuid,
        status: RunStatus,
        verb: &'static str,
        allowed: &'static str,
    },
    /// A value the store cannot hold (a NUL in the reason): refused before
    /// anything is written.
    #[error(transparent)]
    Unstorable(#[from] Unstorable),
    /// A retry onto a version that cannot be: a job of an inline
    /// definition, or a version its workflow never had.
    #[error("{0}")]
    NoSuchVersion(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for OperatorError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

/// What a cancellation came to.
#[derive(Debug)]
pub enum Cancelled {
    /// The job is CANCELLED.
    Done(Box<RunRow>),
    /// The job is RUNNING: the request is recorded, and its worker ends it
    /// CANCELLED at its next heartbeat or, sooner, when its segment leaves
    /// RUNNING (parks, sleeps, finishes or queues it again): that write
    /// lands CANCELLED instead, a completion included.
    Asked(Box<RunRow>),
}

impl Engine {
    /// Puts a DEAD, FAILED or CANCELLED job back in the queue with fresh
    /// attempts. Its checkpoints stay, so finished steps are not redone. No
    /// event marks the retry itself; the job's next commit points do.
    ///
    /// # Errors
    /// Unknown job, a job in another state, store errors.
    pub async fn retry(&self, job_id: Uuid) -> Result<RunRow, OperatorError> {
        let now = self.now();
        let retried = flotilla_store::sql::session(self.pool(), async |conn| {
            match idle::retry(conn, job_id, now).await? {
                Some(row) => Ok(row),
                None => Err(self
                    .refusal(conn, job_id, "retry", "DEAD, FAILED or CANCELLED jobs")
                    .await),
            }
        })
        .await?;
        tracing::info!(%job_id, workflow_name = %retried.workflow_name, "job retried by an operator");
        self.wake();
        Ok(retried)
    }

    /// An operator's retry that moves a DEAD, FAILED or CANCELLED job to
    /// `version` of its workflow (`None`: the newest), keeping the
    /// checkpoints of the steps that did not change
    /// ([`flotilla_workflow::unchanged`]); the others run again. Returns
    /// the job and the steps that run again.
    ///
    /// # Errors
    /// Unknown job, a job in another state, an inline definition or a
    /// version its workflow never had, store errors.
    pub async fn retry_onto(
        &self,
        job_id: Uuid,
        version: Option<i32>,
    ) -> Result<(RunRow, Vec<String>), OperatorError> {
        let now = self.now();
        let mut tx = self.pool().begin().await?;
        let row = runs::get_for_update(&mut tx, job_id)
            .await?
            .ok_or(OperatorError::NotFound(job_id))?;
        if !matches!(
            row.status,
            RunStatus::Dead | RunStatus::Failed | RunStatus::Cancelled
        ) {
            return Err(OperatorError::WrongState {
                job_id,
                status: row.status,
                verb: "retry",
                allowed: "DEAD, FAILED or CANCELLED jobs",
            });
        }
        if row.workflow_version.is_none() {
            return Err(OperatorError::NoSuchVersion(format!(
                "job {job_id} runs an inline definition, which has no versions to move to"
            )));
        }
        let name = row.workflow_name.clone();
        let stored = match version {
            Some(version) => definitions::version(&mut tx, &name, version).await?,
            None => definitions::newest(&mut tx, &name).await?,
        }
        .ok_or_else(|| {
            OperatorError::NoSuchVersion(format!(
                "workflow {name} has no version {}",
                version.map_or_else(|| "at all".to_owned(), |v| v.to_string())
            ))
        })?;
        let document = stored.definition.0;
        let compiled = self.compile_stored(&document).await.map_err(|invalid| {
            OperatorError::NoSuchVersion(format!(
                "version {} of {name} does not compile here: {invalid}",
                stored.version
            ))
        })?;
        // A definition this release cannot read as a model (one stored by
        // an older release) keeps nothing: every step runs again.
        let old: Option<WorkflowDefinition> = serde_json::from_value(row.definition.0.clone()).ok();
        let run_again = old
            .and_then(|old| unchanged::steps_to_run_again(&old, &compiled.definition))
            .unwrap_or_else(|| {
                row.definition.0["steps"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|step| step["name"].as_str().map(str::to_owned))
                    .collect()
            });
        // The version's concurrency key, from the job's input: a move may
        // add, change or drop it.
        let concurrency =
            super::submit::concurrency_of(&compiled, &row.input.0).map_err(|refused| {
                OperatorError::NoSuchVersion(format!(
                    "version {} of {name} refuses the job's input: {refused}",
                    stored.version
                ))
            })?;
        let onto = Onto {
            concurrency: concurrency
                .as_ref()
                .map(|(key, limit, _)| (key.as_str(), *limit)),
            version: stored.version,
            definition: &document,
            max_attempts: compiled.definition.max_attempts,
            reader_level: self.reader_level_of(&compiled),
            execution_timeout_ms: compiled
                .definition
                .execution_timeout_ms
                .and_then(|ms| i64::try_from(ms).ok()),
            run_again: &run_again,
        };
        let moved = moves::retry_onto(&mut tx, job_id, now, &onto)
            .await?
            .ok_or(OperatorError::NotFound(job_id))?;
        tx.commit().await?;
        tracing::info!(%job_id, workflow_name = %name, version = stored.version, ?run_again, "job retried by an operator onto another version");
        self.wake();
        Ok((moved, run_again))
    }

    /// Cancels a QUEUED or WAITING job, with `reason` as its error; for a
    /// RUNNING one, records the request for the worker holding it, which
    /// ends it CANCELLED at its next heartbeat or when its segment leaves
    /// RUNNING, whichever comes first ([`Cancelled::Asked`]).
    ///
    /// # Errors
    /// Unknown job, a job in another state, store errors.
    pub async fn cancel(&self, job_id: Uuid, reason: &str) -> Result<Cancelled, OperatorError> {
        storable::check_text("reason", reason)?;
        let reason = if reason.trim().is_empty() {
            "cancelled by an operator"
        } else {
            reason
        };
        let now = self.now();
        // Made safe here: the worker's write out of RUNNING stores it as it is.
        let asked = crate::support::sanitize::error_text(&format!("{reason} (asked while it ran)"));
        // A RUNNING job may park, sleep or be queued again between the two
        // tries: it is idle then, and the next round cancels it in place.
        let mut rounds = 0;
        let mut tx = loop {
            rounds += 1;
            let mut tx = self.pool().begin().await?;
            if idle::settle_idle(&mut tx, job_id, IdleSettle::Cancel { reason }, now).await? {
                break tx;
            }
            tx.rollback().await?;
            let answer =
                flotilla_store::sql::session(
                    self.pool(),
                    async |conn| match lease::request_cancel(conn, job_id, &asked).await? {
                        Some(row) => Ok::<_, OperatorError>(Ok(row)),
                        None => Ok(Err(self
                            .refusal(conn, job_id, "cancel", "QUEUED, WAITING or RUNNING jobs")
                            .await)),
                    },
                )
                .await?;
            match answer {
                Ok(row) => {
                    tracing::info!(%job_id, workflow_name = %row.workflow_name, reason, "cancellation asked of a running job");
                    return Ok(Cancelled::Asked(Box::new(row)));
                }
                Err(OperatorError::WrongState {
                    status: RunStatus::Queued | RunStatus::Waiting,
                    ..
                }) if rounds < 3 => {}
                Err(refused) => return Err(refused),
            }
        };
        let row = runs::get(&mut tx, job_id)
            .await?
            .ok_or(OperatorError::NotFound(job_id))?;
        tx.commit().await?;
        self.job_finished(
            (&row.workflow_name, row.workflow_version),
            "CANCELLED",
            row.created_at,
        );
        tracing::info!(%job_id, workflow_name = %row.workflow_name, reason, "job cancelled by an operator");
        // Its children go with it (a running job's go when its worker ends it).
        Box::pin(self.cascade_cancel(job_id)).await;
        Ok(Cancelled::Done(Box::new(row)))
    }

    async fn refusal(
        &self,
        conn: &mut sqlx::PgConnection,
        job_id: Uuid,
        verb: &'static str,
        allowed: &'static str,
    ) -> OperatorError {
        match runs::get(conn, job_id).await {
            Ok(Some(row)) => OperatorError::WrongState {
                job_id,
                status: row.status,
                verb,
                allowed,
            },
            Ok(None) => OperatorError::NotFound(job_id),
            Err(e) => e.into(),
        }
    }
}
