//! A job's children as callers see them, and cancelling them with their
//! parent (the executor of `start` steps is `nodes/child.rs`).

use serde::Serialize;
use uuid::Uuid;

use flotilla_store::RunStatus;
use flotilla_store::runs::RunRow;
use flotilla_store::runs::children;

use crate::{Engine, OperatorError};

/// A child as its parent's view shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ChildLink {
    pub job_id: Uuid,
    /// The parent's step that started it.
    pub step: Option<String>,
    pub workflow_name: String,
    #[schema(value_type = String, example = "RUNNING")]
    pub status: RunStatus,
}

impl From<RunRow> for ChildLink {
    fn from(row: RunRow) -> Self {
        Self {
            job_id: row.job_id,
            step: row.parent_step,
            workflow_name: row.workflow_name,
            status: row.status,
        }
    }
}

impl Engine {
    /// Cancels the unfinished children of `parent` that go with it (their
    /// start step did not say `cancel_children: false`), once `parent`
    /// ended CANCELLED, FAILED or DEAD; returns how many were cancelled
    /// or asked to be. Theirs follow as each is cancelled.
    ///
    /// # Errors
    /// The store failed (the sweeper's cascade finishes the job later).
    pub async fn cancel_children_of(&self, parent: Uuid) -> Result<usize, OperatorError> {
        let (ended, family) = flotilla_store::sql::session(self.pool(), async |conn| {
            let ended = children::status_of(conn, parent).await?;
            let family = match ended {
                Some(RunStatus::Cancelled | RunStatus::Failed | RunStatus::Dead) => {
                    children::children_of(conn, parent).await?
                }
                _ => Vec::new(),
            };
            Ok::<_, sqlx::Error>((ended, family))
        })
        .await?;
        let mut cancelled = 0;
        for child in family {
            if !child.cancel_with_parent || child.status.is_finished() {
                continue;
            }
            let reason = cascade_reason(parent, ended);
            match self.cancel(child.job_id, &reason).await {
                Ok(_) => cancelled += 1,
                // Finished meanwhile.
                Err(OperatorError::WrongState { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(cancelled)
    }

    /// Cancels the children of `parent`, just ended by this worker (a
    /// parent still running or queued has none cancelled); a failure is
    /// logged and left to the sweeper's cascade.
    pub(crate) async fn cascade_cancel(&self, parent: Uuid) {
        if let Err(e) = self.cancel_children_of(parent).await {
            tracing::warn!(%parent, error = %e, "cancelling the children failed; the sweeper retries");
        }
    }

    /// The jobs `parent` started.
    ///
    /// # Errors
    /// Store errors.
    pub async fn children_of(&self, parent: Uuid) -> Result<Vec<ChildLink>, OperatorError> {
        let rows = flotilla_store::sql::session(self.pool(), async |conn| {
            children::children_of(conn, parent).await
        })
        .await?;
        Ok(rows.into_iter().map(ChildLink::from).collect())
    }
}

/// Why the cascade cancels a child of `parent`, which ended `ended`.
pub(crate) fn cascade_reason(parent: Uuid, ended: Option<RunStatus>) -> String {
    match ended {
        Some(RunStatus::Cancelled) | None => format!("its parent {parent} was cancelled"),
        Some(status) => format!("its parent {parent} ended {status}"),
    }
}
