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

use std::str::FromStr as _;
use std::time::Duration;

use chrono::{DateTime, DurationRound as _, TimeDelta, Utc};
use serde::Serialize;
use serde_json::Value as Json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use flotilla_store::definitions;
use flotilla_store::schedules::{self, NewSchedule, ScheduleRow};
use flotilla_store::sql::session;
use flotilla_store::{RunStatus, StoreError};

use super::storable::{self, Unstorable};
use super::submit::{Submission, Submitted, WorkflowRef};
use super::{Engine, SubmitError};

/// How often every worker looks for due schedules.
pub const SCHEDULE_POLL: Duration = Duration::from_secs(1);
/// How late a tick may be and still start its job under `missed: skip`.
pub const GRACE: Duration = Duration::from_secs(60);
/// The shortest interval a schedule may have.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// The longest interval a schedule may have.
pub const MAX_INTERVAL: Duration = Duration::from_secs(366 * 24 * 3600);
/// The longest schedule name, in bytes.
pub const MAX_NAME_BYTES: usize = 128;
/// Due schedules one pass starts at most (the rest wait for the next).
const PER_PASS: usize = 64;
/// The namespace of the ticks' job ids (UUID v5).
const TICK_NAMESPACE: Uuid = Uuid::from_u128(0x6f1b_2d3c_9a4e_4b5f_8c7d_0e1f_2a3b_4c5d);

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

/// When a schedule ticks.
#[derive(Debug, Clone)]
enum Every {
    Cron {
        cron: Box<croner::Cron>,
        zone: chrono_tz::Tz,
    },
    Interval(TimeDelta),
}

impl Every {
    fn of(row: &ScheduleRow) -> Result<Self, String> {
        let interval = row
            .interval_ms
            .map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
        Self::parse(row.cron.as_deref(), &row.time_zone, interval)
    }

    fn parse(cron: Option<&str>, zone: &str, interval: Option<Duration>) -> Result<Self, String> {
        match (cron, interval) {
            (Some(cron), None) => {
                let zone = chrono_tz::Tz::from_str(zone)
                    .map_err(|_| format!("time_zone {zone:?} is not an IANA time zone"))?;
                let cron = croner::Cron::from_str(cron)
                    .map_err(|e| format!("cron {cron:?} does not parse: {e}"))?;
                Ok(Self::Cron {
                    cron: Box::new(cron),
                    zone,
                })
            }
            (None, Some(interval)) => {
                if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&interval) {
                    return Err(format!(
                        "interval must be from {} to {}",
                        humantime::format_duration(MIN_INTERVAL),
                        humantime::format_duration(MAX_INTERVAL)
                    ));
                }
                TimeDelta::from_std(interval)
                    .map(Self::Interval)
                    .map_err(|e| e.to_string())
            }
            _ => Err("a schedule has exactly one of cron and interval".into()),
        }
    }

    /// The first tick strictly after `after`.
    fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Self::Cron { cron, zone } => cron
                .find_next_occurrence(&after.with_timezone(zone), false)
                .ok()
                .map(|at| at.with_timezone(&Utc)),
            Self::Interval(every) => after.checked_add_signed(*every),
        }
        .map(millis)
    }

    /// The tick after `now`, on the grid of `latest` (the latest tick at
    /// or before `now`): an interval keeps its phase whatever the delay.
    fn next_after_latest(
        &self,
        latest: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        match self {
            Self::Interval(_) => {
                let mut next = self.next_after(latest)?;
                while next <= now {
                    next = self.next_after(next)?;
                }
                Some(next)
            }
            Self::Cron { .. } => self.next_after(now),
        }
    }

    /// The latest tick at or before `now`, counting from the due tick
    /// `due` (itself at or before `now`), and how many ticks came before it
    /// since `due`.
    fn latest_due(&self, due: DateTime<Utc>, now: DateTime<Utc>) -> (DateTime<Utc>, u64) {
        match self {
            Self::Interval(every) => {
                let every_ms = every.num_milliseconds().max(1);
                let behind = (now - due).num_milliseconds().max(0) / every_ms;
                let latest = due + TimeDelta::milliseconds(behind * every_ms);
                (latest, u64::try_from(behind).unwrap_or(0))
            }
            Self::Cron { cron, zone } => {
                let latest = cron
                    .find_previous_occurrence(&now.with_timezone(zone), true)
                    .ok()
                    .map(|at| millis(at.with_timezone(&Utc)))
                    .filter(|latest| *latest >= due)
                    .unwrap_or(due);
                // Each tick from `due` to `latest`, counted up to a bound
                // (a year of minutes): an outage of a week on an hourly
                // cron missed 167 ticks, not one.
                let mut before = 0;
                let mut at = due;
                while at < latest && before < MAX_COUNTED_TICKS {
                    before += 1;
                    match self.next_after(at) {
                        Some(next) => at = next,
                        None => break,
                    }
                }
                (latest, before)
            }
        }
    }
}

/// The most missed ticks of a cron counted at once (a year of minutes);
/// past it the count stops there.
const MAX_COUNTED_TICKS: u64 = 366 * 24 * 60;

/// Instants are kept to the millisecond (as timers are).
fn millis(at: DateTime<Utc>) -> DateTime<Utc> {
    at.duration_trunc(TimeDelta::milliseconds(1)).unwrap_or(at)
}

/// The job id of `schedule_id`'s tick at `tick`.
#[must_use]
pub fn tick_job_id(schedule_id: Uuid, tick: DateTime<Utc>) -> Uuid {
    let name = format!(
        "{schedule_id}@{}",
        tick.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    );
    Uuid::new_v5(&TICK_NAMESPACE, name.as_bytes())
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
    fn is_about_the_schedule(&self) -> bool {
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

    /// Starts the jobs of the schedules due now, each schedule in a
    /// transaction of its own; returns the jobs started.
    ///
    /// # Errors
    /// The database failed (the schedule stays due for the next pass).
    pub async fn run_schedules(&self) -> Result<Vec<Uuid>, ScheduleError> {
        self.schedules_pass().await.map(|(started, _)| started)
    }

    /// One pass of [`Engine::run_schedules`]; also whether it was full
    /// (more may be due). A tick is judged late against when the burst it
    /// belongs to began: passes that come back full, one after another,
    /// are one burst, so a healthy fleet working through many schedules
    /// due at once does not count the tail as missed.
    async fn schedules_pass(&self) -> Result<(Vec<Uuid>, bool), ScheduleError> {
        let mut started = Vec::new();
        let since = self
            .inner
            .schedule_burst
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .unwrap_or_else(|| self.now());
        let mut taken = 0;
        // Schedules whose rows the store refused in this pass: passed over,
        // so one of them does not hold up the others due after it.
        let mut refused: Vec<String> = Vec::new();
        for _ in 0..PER_PASS {
            let now = self.now();
            let mut tx = self.pool().begin().await?;
            let Some(row) = schedules::take_due(&mut tx, now, &refused).await? else {
                break;
            };
            taken += 1;
            match self.start_tick(&mut tx, &row, since, now).await {
                Ok(job) => {
                    tx.commit().await?;
                    started.extend(job);
                }
                Err(e) if e.is_about_the_schedule() => {
                    // The same at every tick: the schedule is paused, said
                    // loudly, in a transaction of its own.
                    tx.rollback().await?;
                    tracing::error!(schedule = %row.name, error = %e,
                        "a tick of this schedule cannot be started; the schedule is paused");
                    metrics::counter!("flotilla_schedule_ticks_total", "outcome" => "refused")
                        .increment(1);
                    let paused = session(self.pool(), async |conn| {
                        schedules::set_paused(conn, &row.name, true, None, now).await
                    })
                    .await;
                    if let Err(e) = paused {
                        tracing::error!(schedule = %row.name, error = %e,
                            "a refused schedule cannot even be paused; passed over");
                    }
                    refused.push(row.name);
                }
                Err(e) => return Err(e),
            }
        }
        if !started.is_empty() {
            self.wake();
        }
        let full = taken == PER_PASS;
        if full {
            *self
                .inner
                .schedule_burst
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(since);
        }
        Ok((started, full))
    }

    /// Takes one due schedule on in `tx`: starts the job of its latest due
    /// tick (unless missed under `skip`), and moves it to its next tick,
    /// or pauses it when it cannot go on. Returns the job started.
    async fn start_tick(
        &self,
        tx: &mut sqlx::PgTransaction<'_>,
        row: &ScheduleRow,
        since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Option<Uuid>, ScheduleError> {
        let Ok(every) = Every::of(row) else {
            // A row another version wrote: paused, so it stops being due.
            tracing::error!(schedule = %row.name, "a stored schedule does not parse; paused");
            schedules::set_paused(tx, &row.name, true, None, now).await?;
            return Ok(None);
        };
        let (tick, missed_before) = every.latest_due(row.next_run_at, now);
        let late = (since.min(now) - tick).to_std().unwrap_or_default();
        let start = row.missed == "run_once" || late <= GRACE;
        let skipped = missed_before + u64::from(!start);
        if skipped > 0 {
            tracing::warn!(schedule = %row.name, skipped, policy = %row.missed,
                "ticks came while no worker could start them");
            metrics::counter!("flotilla_schedule_ticks_total", "outcome" => "skipped")
                .increment(skipped);
        }
        let mut job = None;
        let mut created = None;
        if start {
            let job_id = tick_job_id(row.schedule_id, tick);
            let submission = Submission {
                job_id,
                workflow: WorkflowRef::Stored(row.workflow_name.clone()),
                input: row.input.0.clone(),
                traceparent: None,
                tracestate: None,
            };
            match self.submit_recorded(tx, &submission, now).await {
                Ok(Submitted::Created(run)) => {
                    if run.status == RunStatus::Failed {
                        tracing::warn!(schedule = %row.name, %job_id, error = ?run.error,
                            "the tick's job was refused and recorded FAILED");
                    }
                    created = Some(job_id);
                }
                Ok(Submitted::Existing(_) | Submitted::Removed(_)) => {}
                Err(SubmitError::Store(e)) => return Err(e.into()),
                // Not the world's fault, and the same at every tick.
                Err(e) => return Err(ScheduleError::Invalid(e.to_string())),
            }
            job = Some((tick, job_id));
        }
        match every.next_after_latest(tick, now) {
            Some(next) => schedules::advance(tx, &row.name, next, job, now).await?,
            None => {
                schedules::set_paused(tx, &row.name, true, None, now).await?;
            }
        }
        if created.is_some() {
            metrics::counter!("flotilla_schedule_ticks_total", "outcome" => "started").increment(1);
        }
        Ok(created)
    }

    /// Starts due schedules every [`SCHEDULE_POLL`] until `shutdown`.
    pub(super) async fn scheduler(&self, shutdown: CancellationToken) {
        let mut ticks = tokio::time::interval(SCHEDULE_POLL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = shutdown.cancelled() => break,
            }
            // A full pass goes on at once: what is due is taken without an
            // idle tick between passes.
            loop {
                match self.schedules_pass().await {
                    Ok((_, true)) if !shutdown.is_cancelled() => {}
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "starting due schedules failed; tried again next pass");
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone as _;

    #[test]
    fn a_cron_ticks_in_its_time_zone() {
        let every = Every::parse(Some("0 9 * * *"), "Europe/Amsterdam", None).unwrap();
        let winter = Utc.with_ymd_and_hms(2026, 1, 15, 12, 0, 0).unwrap();
        assert_eq!(
            every.next_after(winter),
            Some(Utc.with_ymd_and_hms(2026, 1, 16, 8, 0, 0).unwrap()),
            "09:00 in Amsterdam is 08:00 UTC in winter"
        );
        let summer = Utc.with_ymd_and_hms(2026, 7, 15, 12, 0, 0).unwrap();
        assert_eq!(
            every.next_after(summer),
            Some(Utc.with_ymd_and_hms(2026, 7, 16, 7, 0, 0).unwrap()),
            "and 07:00 UTC in summer"
        );
    }

    #[test]
    fn bad_schedules_are_named() {
        let cases = [
            (Some("61 * * * *"), "UTC", None, "cron"),
            (Some("* * * * *"), "Mars/Olympus", None, "time_zone"),
            (None, "UTC", Some(Duration::from_millis(10)), "interval"),
            (None, "UTC", None, "exactly one"),
            (
                Some("* * * * *"),
                "UTC",
                Some(Duration::from_secs(5)),
                "exactly one",
            ),
        ];
        for (cron, zone, interval, named) in cases {
            let why = Every::parse(cron, zone, interval).unwrap_err();
            assert!(why.contains(named), "{why}");
        }
    }

    #[test]
    fn the_latest_due_tick_of_an_interval_counts_those_before_it() {
        let every = Every::parse(None, "UTC", Some(Duration::from_secs(60))).unwrap();
        let due = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let now = due + TimeDelta::seconds(150);
        assert_eq!(
            every.latest_due(due, now),
            (due + TimeDelta::seconds(120), 2)
        );
        assert_eq!(every.latest_due(due, due), (due, 0));
    }

    #[test]
    fn the_latest_due_tick_of_a_cron_counts_every_tick_before_it() {
        // Hourly, a week behind: 168 ticks, the last taken, 167 before it.
        let hourly = Every::parse(Some("0 * * * *"), "UTC", None).unwrap();
        let due = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let now = due + TimeDelta::days(7) - TimeDelta::minutes(30);
        assert_eq!(
            hourly.latest_due(due, now),
            (due + TimeDelta::hours(167), 167)
        );
        assert_eq!(hourly.latest_due(due, due), (due, 0));
    }

    #[test]
    fn a_ticks_job_id_is_the_same_for_the_same_tick_only() {
        let schedule = Uuid::new_v4();
        let tick = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        assert_eq!(tick_job_id(schedule, tick), tick_job_id(schedule, tick));
        assert_ne!(
            tick_job_id(schedule, tick),
            tick_job_id(schedule, tick + TimeDelta::seconds(1))
        );
        assert_ne!(
            tick_job_id(schedule, tick),
            tick_job_id(Uuid::new_v4(), tick)
        );
    }
}
