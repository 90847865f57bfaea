//! Reading jobs and stored workflows: what the API shows, through the engine
//! so that handlers never touch the store.

use chrono::{DateTime, Utc};
use flotilla_store::definitions::{self, StoredDefinition};
use flotilla_store::outbox::history::{self, TimelineEntry};
use flotilla_store::runs::{self, ListFilter, RunRow};
use flotilla_store::sql::session;
use flotilla_store::{RunStatus, StoreError};
use uuid::Uuid;

use crate::Engine;
use crate::support::storable::{self, Unstorable};

/// Page size when none (or 0) is asked for.
pub(crate) const DEFAULT_PAGE: i64 = 50;
/// The most one page holds; larger limits are clamped, not refused.
pub(crate) const MAX_PAGE: i64 = 500;

/// Which jobs to list.
#[derive(Debug, Clone, Default)]
pub struct JobQuery {
    pub status: Option<RunStatus>,
    pub workflow_name: Option<String>,
    /// 0 means the default page (50); above the most a page holds (500), that most.
    pub limit: i64,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Only jobs created at or after this time.
    pub created_after: Option<DateTime<Utc>>,
    /// Only jobs created strictly before this time.
    pub created_before: Option<DateTime<Utc>>,
    /// Only jobs whose metadata holds every entry of this object.
    pub metadata: Option<serde_json::Value>,
}

/// One page of jobs, newest first.
#[derive(Debug)]
pub struct JobPage {
    pub jobs: Vec<RunRow>,
    /// Where the next page starts; `None` on the last page.
    pub next_cursor: Option<String>,
}

/// A listing that cannot be answered.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error("limit {0} is negative")]
    NegativeLimit(i64),
    #[error("cursor {0:?} is not one this API handed out")]
    BadCursor(String),
    /// A name the store could never hold (so no job or workflow has it).
    #[error(transparent)]
    Unstorable(#[from] Unstorable),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for ListError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

impl Engine {
    /// The row of `job_id`, if there is one.
    ///
    /// # Errors
    /// Database errors.
    pub async fn job(&self, job_id: Uuid) -> Result<Option<RunRow>, StoreError> {
        session(self.pool(), async |conn| Ok(runs::get(conn, job_id).await?)).await
    }

    /// Jobs asleep on a timer, and how long the oldest whose instant has
    /// come has waited past it.
    ///
    /// # Errors
    /// Database errors.
    pub async fn timer_backlog(&self) -> Result<(i64, Option<std::time::Duration>), StoreError> {
        let now = self.now();
        let (sleeping, oldest_due) = session(self.pool(), async |conn| {
            runs::timer_backlog(conn, now).await
        })
        .await?;
        Ok((
            sleeping,
            oldest_due.map(|due| (now - due).to_std().unwrap_or_default()),
        ))
    }

    /// A page of jobs, newest first.
    ///
    /// # Errors
    /// A negative limit, a cursor this engine did not hand out, database errors.
    pub async fn jobs(&self, query: &JobQuery) -> Result<JobPage, ListError> {
        let limit = match query.limit {
            0 => DEFAULT_PAGE,
            n if n < 0 => return Err(ListError::NegativeLimit(n)),
            n => n.min(MAX_PAGE),
        };
        let before = match query.cursor.as_deref().filter(|c| !c.is_empty()) {
            None => None,
            Some(raw) => Some(parse_cursor(raw).ok_or_else(|| ListError::BadCursor(raw.into()))?),
        };
        if let Some(name) = &query.workflow_name {
            storable::check_workflow_name(name)?;
        }
        let filter = ListFilter {
            status: query.status,
            workflow_name: query.workflow_name.as_deref().filter(|w| !w.is_empty()),
            before,
            created_after: query.created_after,
            created_before: query.created_before,
            metadata: query.metadata.as_ref(),
        };
        // One more than asked says whether a next page exists.
        let mut jobs = session(self.pool(), async |conn| {
            runs::list(conn, &filter, limit + 1).await
        })
        .await?;
        let page = usize::try_from(limit).unwrap_or(usize::MAX);
        let next_cursor = if jobs.len() > page {
            jobs.truncate(page);
            jobs.last().map(cursor_of)
        } else {
            None
        };
        Ok(JobPage { jobs, next_cursor })
    }

    /// The newest version of the stored workflow `name`.
    ///
    /// # Errors
    /// A name the store cannot hold; database errors.
    pub async fn workflow(&self, name: &str) -> Result<Option<StoredDefinition>, ListError> {
        storable::check_workflow_name(name)?;
        Ok(session(self.pool(), async |conn| {
            definitions::newest(conn, name).await
        })
        .await?)
    }

    /// A page of the stored versions of `name` older than `before` (from
    /// the newest when `None`), newest first; `limit` as for [`Self::jobs`].
    /// The second value is where the next page starts (`before`), `None`
    /// on the last page.
    ///
    /// # Errors
    /// A negative limit; a name the store cannot hold; database errors.
    pub async fn workflow_versions(
        &self,
        name: &str,
        before: Option<i32>,
        limit: i64,
    ) -> Result<(Vec<StoredDefinition>, Option<i32>), ListError> {
        let limit = match limit {
            0 => DEFAULT_PAGE,
            n if n < 0 => return Err(ListError::NegativeLimit(n)),
            n => n.min(MAX_PAGE),
        };
        storable::check_workflow_name(name)?;
        // One more than the page says whether another follows.
        let mut versions = session(self.pool(), async |conn| {
            definitions::versions(conn, name, before, limit + 1).await
        })
        .await?;
        let next = if versions.len() > usize::try_from(limit).unwrap_or(usize::MAX) {
            versions.pop();
            versions.last().map(|last| last.version)
        } else {
            None
        };
        Ok((versions, next))
    }

    /// The events of `job_id` still in the outbox, in sequence order, or
    /// `None` when there is no such job.
    ///
    /// # Errors
    /// Database errors.
    pub async fn job_timeline(
        &self,
        job_id: Uuid,
    ) -> Result<Option<Vec<TimelineEntry>>, StoreError> {
        session(self.pool(), async |conn| {
            let timeline = history::timeline(conn, job_id).await?;
            // Only an empty timeline (retention took every event, or no
            // such job) needs the run row to tell the two apart.
            if timeline.is_empty() && runs::get(conn, job_id).await?.is_none() {
                return Ok(None);
            }
            Ok(Some(timeline))
        })
        .await
    }

    /// The newest version of every stored workflow.
    ///
    /// # Errors
    /// Database errors.
    pub async fn workflows(&self) -> Result<Vec<StoredDefinition>, StoreError> {
        Ok(session(self.pool(), async |conn| {
            definitions::list_newest(conn).await
        })
        .await?)
    }

    /// Whether the database answers (for readiness).
    ///
    /// # Errors
    /// Database errors.
    pub async fn ping(&self) -> Result<(), StoreError> {
        session(self.pool(), async |conn| {
            flotilla_store::sql::query("SELECT 1").execute(conn).await
        })
        .await?;
        Ok(())
    }
}

/// `<created_at micros>_<job_id>`: opaque to clients.
fn cursor_of(row: &RunRow) -> String {
    format!("{}_{}", row.created_at.timestamp_micros(), row.job_id)
}

fn parse_cursor(raw: &str) -> Option<(DateTime<Utc>, Uuid)> {
    let (micros, id) = raw.split_once('_')?;
    let at = DateTime::from_timestamp_micros(micros.parse().ok()?)?;
    Some((at, Uuid::parse_str(id).ok()?))
}
