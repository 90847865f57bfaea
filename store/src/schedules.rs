//! `workflow_schedule`: every statement on schedules. What a tick is and
//! when the next one comes is the engine's (`support/cadence.rs`,
//! `services/scheduler.rs`); here are the rows, and the lock by which one
//! worker at a time takes a due schedule.

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgTransaction};
use uuid::Uuid;

/// A schedule as stored.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ScheduleRow {
    pub name: String,
    pub schedule_id: Uuid,
    pub workflow_name: String,
    pub input: Json<serde_json::Value>,
    pub cron: Option<String>,
    pub time_zone: String,
    pub interval_ms: Option<i64>,
    /// `skip` or `run_once`.
    pub missed: String,
    pub paused: bool,
    pub next_run_at: DateTime<Utc>,
    pub last_tick_at: Option<DateTime<Utc>>,
    pub last_job_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

const COLUMNS: &str = "name, schedule_id, workflow_name, input, cron, time_zone, interval_ms, missed, \
     paused, next_run_at, last_tick_at, last_job_id, created_at, updated_at";

/// What a create or replace writes.
#[derive(Debug, Clone)]
pub struct NewSchedule<'a> {
    pub name: &'a str,
    pub workflow_name: &'a str,
    pub input: &'a serde_json::Value,
    pub cron: Option<&'a str>,
    pub time_zone: &'a str,
    pub interval_ms: Option<i64>,
    pub missed: &'a str,
    pub next_run_at: DateTime<Utc>,
}

impl NewSchedule<'_> {
    /// Whether `row` already says the same (a repeat of the same put).
    #[must_use]
    pub fn matches(&self, row: &ScheduleRow) -> bool {
        row.workflow_name == self.workflow_name
            && row.input.0 == *self.input
            && row.cron.as_deref() == self.cron
            && row.time_zone == self.time_zone
            && row.interval_ms == self.interval_ms
            && row.missed == self.missed
    }
}

/// Creates the schedule `name`, or replaces what it says (a fresh
/// `schedule_id`, so the new ticks are new jobs; paused stays as it was).
///
/// # Errors
/// Database errors.
pub async fn put(
    tx: &mut PgTransaction<'_>,
    schedule: &NewSchedule<'_>,
    now: DateTime<Utc>,
) -> Result<ScheduleRow, sqlx::Error> {
    crate::sql::query_as(&format!(
        "INSERT INTO workflow_schedule (name, schedule_id, workflow_name, input, cron, time_zone,
             interval_ms, missed, next_run_at, created_at, updated_at)
         VALUES ($1, gen_random_uuid(), $2, $3, $4, $5, $6, $7, $8, $9, $9)
         ON CONFLICT (name) DO UPDATE SET schedule_id = gen_random_uuid(),
             workflow_name = EXCLUDED.workflow_name, input = EXCLUDED.input, cron = EXCLUDED.cron,
             time_zone = EXCLUDED.time_zone, interval_ms = EXCLUDED.interval_ms,
             missed = EXCLUDED.missed, next_run_at = EXCLUDED.next_run_at, updated_at = $9
         RETURNING {COLUMNS}"
    ))
    .bind(schedule.name)
    .bind(schedule.workflow_name)
    .bind(Json(schedule.input))
    .bind(schedule.cron)
    .bind(schedule.time_zone)
    .bind(schedule.interval_ms)
    .bind(schedule.missed)
    .bind(schedule.next_run_at)
    .bind(now)
    .fetch_one(&mut **tx)
    .await
}

/// The schedule `name`, locked until the transaction ends when `lock`.
///
/// # Errors
/// Database errors.
pub async fn get(
    conn: &mut PgConnection,
    name: &str,
    lock: bool,
) -> Result<Option<ScheduleRow>, sqlx::Error> {
    let lock = if lock { " FOR UPDATE" } else { "" };
    crate::sql::query_as(&format!(
        "SELECT {COLUMNS} FROM workflow_schedule WHERE name = $1{lock}"
    ))
    .bind(name)
    .fetch_optional(conn)
    .await
}

/// Every schedule, by name.
///
/// # Errors
/// Database errors.
pub async fn list(conn: &mut PgConnection) -> Result<Vec<ScheduleRow>, sqlx::Error> {
    crate::sql::query_as(&format!(
        "SELECT {COLUMNS} FROM workflow_schedule ORDER BY name"
    ))
    .fetch_all(conn)
    .await
}

/// Pauses or resumes `name`; a schedule resumed from a pause runs next
/// at `next_run_at` (one not paused keeps its next run). `None`: no such
/// schedule.
///
/// # Errors
/// Database errors.
pub async fn set_paused(
    conn: &mut PgConnection,
    name: &str,
    paused: bool,
    next_run_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Result<Option<ScheduleRow>, sqlx::Error> {
    crate::sql::query_as(&format!(
        "UPDATE workflow_schedule SET paused = $2, updated_at = $4,
             next_run_at = CASE WHEN paused AND NOT $2 THEN coalesce($3, next_run_at) ELSE next_run_at END
         WHERE name = $1 RETURNING {COLUMNS}"
    ))
    .bind(name)
    .bind(paused)
    .bind(next_run_at)
    .bind(now)
    .fetch_optional(conn)
    .await
}

/// Deletes `name`; `false` when there was none. Its jobs stay.
///
/// # Errors
/// Database errors.
pub async fn delete(conn: &mut PgConnection, name: &str) -> Result<bool, sqlx::Error> {
    let deleted = crate::sql::query("DELETE FROM workflow_schedule WHERE name = $1")
        .bind(name)
        .execute(conn)
        .await?;
    Ok(deleted.rows_affected() > 0)
}

/// The running schedule due longest at `now`, locked until the
/// transaction ends; those another worker holds are skipped (it is
/// starting their tick), and so are those `passed_over` (refused in this
/// pass), so one bad row never holds up the schedules due after it.
///
/// # Errors
/// Database errors.
pub async fn take_due(
    tx: &mut PgTransaction<'_>,
    now: DateTime<Utc>,
    passed_over: &[String],
) -> Result<Option<ScheduleRow>, sqlx::Error> {
    crate::sql::query_as(&format!(
        "SELECT {COLUMNS} FROM workflow_schedule
         WHERE NOT paused AND next_run_at <= $1 AND name <> ALL($2)
         ORDER BY next_run_at LIMIT 1 FOR UPDATE SKIP LOCKED"
    ))
    .bind(now)
    .bind(passed_over)
    .fetch_optional(&mut **tx)
    .await
}

/// Moves a taken schedule on: its next run, and the tick it started a job
/// for (if it started one).
///
/// # Errors
/// Database errors.
pub async fn advance(
    tx: &mut PgTransaction<'_>,
    name: &str,
    next_run_at: DateTime<Utc>,
    started: Option<(DateTime<Utc>, Uuid)>,
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    crate::sql::query(
        "UPDATE workflow_schedule SET next_run_at = $2,
             last_tick_at = coalesce($3, last_tick_at), last_job_id = coalesce($4, last_job_id),
             updated_at = $5
         WHERE name = $1",
    )
    .bind(name)
    .bind(next_run_at)
    .bind(started.map(|(tick, _)| tick))
    .bind(started.map(|(_, job)| job))
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
