//! Schedules: a workflow started with a given input at every tick of a
//! cron expression in a time zone (`croner`, `chrono-tz`), or of an
//! interval (docs/architecture.md, "Schedules").
//!
//! Every worker looks for due schedules once a second; one takes a due
//! schedule under its row lock (`FOR UPDATE SKIP LOCKED`), submits the
//! tick's job and moves the schedule to its next tick in the same
//! transaction. The tick's job id is derived from the schedule and the
//! tick's instant, so a tick started twice (a crash between submit and
//! commit cannot happen, but a replaced or raced schedule might) is still
//! one job: the submit is idempotent on the id.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value as Json;
use uuid::Uuid;

use flotilla_store::StoreError;
use flotilla_store::definitions;
use flotilla_store::schedules::{self, NewSchedule, ScheduleRow};
use flotilla_store::sql::session;

use crate::Engine;
use crate::support::cadence::Every;
use crate::support::storable::{self, Unstorable};

pub use crate::support::cadence::{MAX_INTERVAL, MIN_INTERVAL, tick_job_id};

/// The longest schedule name, in bytes.
pub const MAX_NAME_BYTES: usize = 128;
/// What a schedule says, as a client sends it.
#[derive(Debug, Clone)]
pub struct ScheduleSpec {
    pub name: String,
    pub workflow_name: String,
    pub input: Json,
    /// A cron expression (5 fields, or 6 with seconds first).
    pub cron: Option<String>,
    /// The IANA time zone the cron expression is read in (default UTC).
    pub time_zone: Option<String>,
    /// An interval (`30s`, `15m`, `1h`), instead of a cron expression.
    pub interval: Option<String>,
    /// `skip` (default) or `run_once`.
    pub missed: Option<String>,
}

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    Created,
    Replaced,
    /// The schedule said this already: nothing changed.
    Unchanged,
}

#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error("schedule {0:?} not found")]
    NotFound(String),
    /// What the schedule says cannot work: named.
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Unstorable(#[from] Unstorable),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ScheduleError {
    /// Whether the error is about one schedule (its job refused, a value
    /// the store cannot hold) rather than the database as a service.
    pub(crate) fn is_about_the_schedule(&self) -> bool {
        match self {
            Self::Invalid(_) | Self::Unstorable(_) => true,
            Self::Store(e) => e.is_about_the_data(),
            Self::NotFound(_) => false,
        }
    }
}

impl From<sqlx::Error> for ScheduleError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

/// A schedule as the API shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ScheduleView {
    pub name: String,
    pub workflow_name: String,
    #[schema(value_type = Object)]
    pub input: Json,
    pub cron: Option<String>,
    pub time_zone: String,
    /// The interval, as `15m`.
    pub interval: Option<String>,
    /// `skip` or `run_once`.
    pub missed: String,
    pub paused: bool,
    /// When it next ticks (while not paused).
    pub next_run_at: DateTime<Utc>,
    pub last_tick_at: Option<DateTime<Utc>>,
    /// The job the last tick started.
    pub last_job_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<ScheduleRow> for ScheduleView {
    fn from(row: ScheduleRow) -> Self {
        Self {
            interval: row.interval_ms.map(|ms| {
                humantime::format_duration(Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
                    .to_string()
            }),
            name: row.name,
            workflow_name: row.workflow_name,
            input: row.input.0,
            cron: row.cron,
            time_zone: row.time_zone,
            missed: row.missed,
            paused: row.paused,
            next_run_at: row.next_run_at,
            last_tick_at: row.last_tick_at,
            last_job_id: row.last_job_id,
            created_at: row.created_at,
            updated_at: row.updated_at,
        }
    }
}

impl Engine {
    /// Creates or replaces the schedule `spec.name`. Its first tick is the
    /// first after now; a replaced schedule's ticks are new jobs.
    ///
    /// # Errors
    /// An invalid schedule (named), an unknown workflow or an input its
    /// schema refuses; store errors.
    pub async fn put_schedule(
        &self,
        spec: &ScheduleSpec,
    ) -> Result<(Put, ScheduleView), ScheduleError> {
        let invalid = |why: String| ScheduleError::Invalid(why);
        if spec.name.trim().is_empty() || spec.name.len() > MAX_NAME_BYTES {
            return Err(invalid(format!("name must be 1 to {MAX_NAME_BYTES} bytes")));
        }
        storable::check_text("name", &spec.name)?;
        storable::check_workflow_name(&spec.workflow_name)?;
        storable::check_json("input", &spec.input)?;
        let zone = spec.time_zone.as_deref().unwrap_or("UTC");
        storable::check_text("time_zone", zone)?;
        let interval = spec
            .interval
            .as_deref()
            .map(|text| {
                humantime::parse_duration(text)
                    .map_err(|e| invalid(format!("interval {text:?} is no duration: {e}")))
            })
            .transpose()?;
        let every = Every::parse(spec.cron.as_deref(), zone, interval).map_err(invalid)?;
        let missed = spec.missed.as_deref().unwrap_or("skip");
        if !["skip", "run_once"].contains(&missed) {
            return Err(invalid(format!(
                "missed must be skip or run_once, not {missed:?}"
            )));
        }
        self.check_startable(&spec.workflow_name, &spec.input)
            .await?;
        let interval_ms = interval.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let mut tx = self.pool().begin().await?;
        let before = schedules::get(&mut tx, &spec.name, true).await?;
        // Under the schedule's lock, so a pass that started a tick
        // meanwhile is seen (review L2): a tick due and not yet started is
        // kept, and one started already is not due again.
        let now = self.now();
        let mut next_run_at = every
            .next_after(now)
            .ok_or_else(|| invalid("the schedule never ticks".into()))?;
        if let Some(before) = before.as_ref().filter(|before| !before.paused) {
            if before.next_run_at <= now {
                next_run_at = before.next_run_at;
            }
            if let Some(last) = before.last_tick_at
                && next_run_at <= last
            {
                next_run_at = every
                    .next_after(last)
                    .ok_or_else(|| invalid("the schedule never ticks".into()))?;
            }
        }
        let new = NewSchedule {
            name: &spec.name,
            workflow_name: &spec.workflow_name,
            input: &spec.input,
            cron: spec.cron.as_deref(),
            time_zone: zone,
            interval_ms,
            missed,
            next_run_at,
        };
        if let Some(before) = before.as_ref().filter(|before| new.matches(before)) {
            let unchanged = before.clone();
            tx.rollback().await?;
            return Ok((Put::Unchanged, unchanged.into()));
        }
        let row = schedules::put(&mut tx, &new, now).await?;
        tx.commit().await?;
        let put = if before.is_some() {
            Put::Replaced
        } else {
            Put::Created
        };
        Ok((put, row.into()))
    }

    /// Refuses a schedule whose ticks would all fail: an unknown workflow,
    /// an input its schema refuses.
    async fn check_startable(&self, workflow: &str, input: &Json) -> Result<(), ScheduleError> {
        let stored = {
            session(self.pool(), async |conn| {
                definitions::newest(conn, workflow).await
            })
            .await?
        };
        let Some(stored) = stored else {
            return Err(ScheduleError::Invalid(format!(
                "unknown workflow {workflow:?}: a schedule starts a stored workflow"
            )));
        };
        // As a submission of it compiles it: stored, so held to this
        // release's bounds rather than refused by them.
        let compiled = self
            .compile_stored(&stored.definition.0)
            .await
            .map_err(|e| ScheduleError::Invalid(e.to_string()))?;
        compiled.check_input(input).map_err(|violations| {
            ScheduleError::Invalid(format!(
                "the input does not fit workflow {workflow}: {}",
                violations.join("; ")
            ))
        })
    }

    /// Every schedule, by name.
    ///
    /// # Errors
    /// Store errors.
    pub async fn schedules(&self) -> Result<Vec<ScheduleView>, ScheduleError> {
        let rows = session(self.pool(), async |conn| schedules::list(conn).await).await?;
        Ok(rows.into_iter().map(ScheduleView::from).collect())
    }

    /// The schedule `name`.
    ///
    /// # Errors
    /// Unknown schedule; store errors.
    pub async fn schedule(&self, name: &str) -> Result<ScheduleView, ScheduleError> {
        storable::check_text("name", name)?;
        session(self.pool(), async |conn| {
            schedules::get(conn, name, false).await
        })
        .await?
        .map(ScheduleView::from)
        .ok_or_else(|| ScheduleError::NotFound(name.to_owned()))
    }

    /// Pauses (no tick starts a job) or resumes `name`; a resumed schedule
    /// ticks next at its first tick after now (the ticks while it was
    /// paused are not started).
    ///
    /// # Errors
    /// Unknown schedule; store errors.
    pub async fn pause_schedule(
        &self,
        name: &str,
        paused: bool,
    ) -> Result<ScheduleView, ScheduleError> {
        storable::check_text("name", name)?;
        let now = self.now();
        session(self.pool(), async |conn| {
            let next = if paused {
                None
            } else {
                let row = schedules::get(conn, name, false)
                    .await?
                    .ok_or_else(|| ScheduleError::NotFound(name.to_owned()))?;
                Every::of(&row).ok().and_then(|every| every.next_after(now))
            };
            schedules::set_paused(conn, name, paused, next, now)
                .await?
                .map(ScheduleView::from)
                .ok_or_else(|| ScheduleError::NotFound(name.to_owned()))
        })
        .await
    }

    /// Deletes `name` (the jobs it started stay).
    ///
    /// # Errors
    /// Unknown schedule; store errors.
    pub async fn delete_schedule(&self, name: &str) -> Result<(), ScheduleError> {
        storable::check_text("name", name)?;
        if session(self.pool(), async |conn| {
            schedules::delete(conn, name).await
        })
        .await?
        {
            Ok(())
        } else {
            Err(ScheduleError::NotFound(name.to_owned()))
        }
    }
}
