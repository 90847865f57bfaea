//! The scheduler: every worker looks for due schedules once a second; one
//! takes a due schedule under its row lock (`FOR UPDATE SKIP LOCKED`),
//! submits the tick's job and moves the schedule to its next tick in the
//! same transaction (the CRUD is `ops/schedules.rs`, when a schedule ticks
//! `support/cadence.rs`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use flotilla_store::RunStatus;
use flotilla_store::schedules::{self, ScheduleRow};
use flotilla_store::sql::session;

use crate::ops::schedules::ScheduleError;
use crate::support::cadence::{Every, tick_job_id};
use crate::{Engine, Submission, SubmitError, Submitted, WorkflowRef};

/// How often every worker looks for due schedules.
pub const SCHEDULE_POLL: Duration = Duration::from_secs(1);
/// How late a tick may be and still start its job under `missed: skip`.
pub const GRACE: Duration = Duration::from_secs(60);
/// Due schedules one pass starts at most (the rest wait for the next).
const PER_PASS: usize = 64;
impl Engine {
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
                metadata: None,
                job_id,
                workflow: WorkflowRef::Stored(row.workflow_name.clone()),
                input: row.input.0.clone(),
                traceparent: None,
                tracestate: None,
                priority: 0,
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
    pub(crate) async fn scheduler(&self, shutdown: CancellationToken) {
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
