//! Retention of finished runs (docs/operations.md, "Retention"): a run is
//! removed once it finished longer ago than its retention (its workflow's
//! for its final state, else the fleet's), leaving a compact record so the
//! same job id submitted again is answered as a repeat; records go after
//! the idempotency horizon. One member of the fleet works at a time
//! (`flotilla_store::retention`), in small batches, on finished rows only.

use std::time::Duration;

use flotilla_store::retention::{self, Removal};
use flotilla_store::{RunStatus, StoreError};
use tokio_util::sync::CancellationToken;

use crate::Engine;

/// Retention of COMPLETED runs, unless configured.
pub const DEFAULT_KEEP_COMPLETED: Duration = Duration::from_secs(7 * 24 * 3600);
/// Retention of FAILED, DEAD and CANCELLED runs, unless configured.
pub const DEFAULT_KEEP_FAILED: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long a removed run's id is remembered, unless configured.
pub const DEFAULT_REMOVED_HORIZON: Duration = Duration::from_secs(90 * 24 * 3600);
/// Runs one batch removes, unless configured.
pub const DEFAULT_BATCH: i64 = 500;
/// How often retention runs, unless configured.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
/// Most batches of one state in one pass: a pass stays short, the next
/// goes on with the backlog.
const BATCHES_PER_PASS: usize = 20;
/// The backlog metric counts up to this many rows per state.
const BACKLOG_CAP: i64 = 100_000;
/// Runs the store refused to remove that one engine remembers to pass
/// over; past it, a refused run costs its batch a retry run by run.
const MAX_REFUSED: usize = 10_000;

/// How long runs of `workflow` that ended `status` are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowRetention {
    pub workflow: String,
    pub status: RunStatus,
    pub keep: Duration,
}

/// Retention's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionSettings {
    /// Off: nothing is ever removed.
    pub enabled: bool,
    pub keep_completed: Duration,
    /// FAILED and DEAD runs.
    pub keep_failed: Duration,
    pub keep_cancelled: Duration,
    /// Per workflow and final state, before the fleet's.
    pub by_workflow: Vec<WorkflowRetention>,
    /// How long a removed run's id is answered as a repeat.
    pub removed_horizon: Duration,
    pub batch: i64,
    pub interval: Duration,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            keep_completed: DEFAULT_KEEP_COMPLETED,
            keep_failed: DEFAULT_KEEP_FAILED,
            keep_cancelled: DEFAULT_KEEP_FAILED,
            by_workflow: Vec::new(),
            removed_horizon: DEFAULT_REMOVED_HORIZON,
            batch: DEFAULT_BATCH,
            interval: DEFAULT_INTERVAL,
        }
    }
}

impl RetentionSettings {
    /// The fleet's retention of runs that ended `status`.
    fn fleet_keep(&self, status: RunStatus) -> Duration {
        match status {
            RunStatus::Completed => self.keep_completed,
            RunStatus::Cancelled => self.keep_cancelled,
            _ => self.keep_failed,
        }
    }
}

/// The shortest and the longest retention (or horizon) one may set.
pub const KEEP_BOUNDS: (Duration, Duration) = (
    Duration::from_secs(60),
    Duration::from_secs(100 * 365 * 24 * 3600),
);

/// Parses `FLOTILLA_RETAIN_BY_WORKFLOW`:
/// `<workflow>:<STATE>=<duration>[,<STATE>=<duration>…][;<workflow>:…]`,
/// states among COMPLETED, FAILED, DEAD, CANCELLED.
///
/// # Errors
/// A part that does not read, naming it.
pub fn parse_by_workflow(text: &str) -> Result<Vec<WorkflowRetention>, String> {
    let mut rules = Vec::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (workflow, states) = part
            .split_once(':')
            .ok_or_else(|| format!("{part:?}: expected <workflow>:<STATE>=<duration>"))?;
        let workflow = workflow.trim();
        if workflow.is_empty() {
            return Err(format!("{part:?}: no workflow name"));
        }
        for rule in states.split(',').map(str::trim) {
            let (state, keep) = rule
                .split_once('=')
                .ok_or_else(|| format!("{rule:?}: expected <STATE>=<duration>"))?;
            let status: RunStatus = state
                .trim()
                .to_ascii_uppercase()
                .parse()
                .map_err(|_| format!("{state:?}: not a run state"))?;
            if !status.is_finished() {
                return Err(format!(
                    "{state:?}: only finished states (COMPLETED, FAILED, DEAD, CANCELLED) are removed"
                ));
            }
            let keep =
                humantime::parse_duration(keep.trim()).map_err(|e| format!("{keep:?}: {e}"))?;
            if !(KEEP_BOUNDS.0..=KEEP_BOUNDS.1).contains(&keep) {
                return Err(format!("{keep:?}: between a minute and 100 years, please"));
            }
            rules.push(WorkflowRetention {
                workflow: workflow.to_owned(),
                status,
                keep,
            });
        }
    }
    Ok(rules)
}

/// What one retention pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionPass {
    /// Runs removed.
    pub removed: u64,
    /// Records of removed runs forgotten (past the horizon).
    pub forgotten: u64,
    /// Another member held retention: this pass did nothing.
    pub yielded: bool,
}

const FINISHED: [RunStatus; 4] = [
    RunStatus::Completed,
    RunStatus::Failed,
    RunStatus::Dead,
    RunStatus::Cancelled,
];

impl Engine {
    /// One retention pass: per final state, the workflows with a retention
    /// of their own, then the rest at the fleet's; then the records past
    /// the horizon. Bounded: at most a few batches per state.
    ///
    /// # Errors
    /// The database failed (what was removed before stays removed).
    pub async fn apply_retention(&self) -> Result<RetentionPass, flotilla_store::StoreError> {
        let settings = &self.settings().retention;
        let now = self.now();
        let mut pass = RetentionPass::default();
        for status in FINISHED {
            let own: Vec<&WorkflowRetention> = settings
                .by_workflow
                .iter()
                .filter(|rule| rule.status == status)
                .collect();
            let except: Vec<String> = own.iter().map(|rule| rule.workflow.clone()).collect();
            let mut removals: Vec<Removal<'_>> = own
                .iter()
                .map(|rule| Removal {
                    status,
                    workflow: Some(rule.workflow.as_str()),
                    except: &[],
                    cutoff: cutoff(now, rule.keep),
                    passed_over: &[],
                })
                .collect();
            let fleet_cutoff = cutoff(now, settings.fleet_keep(status));
            removals.push(Removal {
                status,
                workflow: None,
                except: &except,
                cutoff: fleet_cutoff,
                passed_over: &[],
            });
            for removal in removals {
                let Some(removed) = self.remove_batches(removal, now).await? else {
                    pass.yielded = true;
                    return Ok(pass);
                };
                if removed > 0 {
                    metrics::counter!("flotilla_runs_removed_total", "status" => status.as_str())
                        .increment(removed);
                }
                pass.removed += removed;
            }
            let waiting =
                retention::backlog(self.pool(), status, fleet_cutoff, BACKLOG_CAP).await?;
            #[allow(clippy::cast_precision_loss)]
            metrics::gauge!("flotilla_retention_backlog", "status" => status.as_str())
                .set(waiting as f64);
        }
        let horizon = cutoff(now, settings.removed_horizon);
        for _ in 0..BATCHES_PER_PASS {
            match retention::forget_removed(self.pool(), horizon, settings.batch).await? {
                None => {
                    pass.yielded = true;
                    break;
                }
                Some(forgotten) => {
                    pass.forgotten += forgotten;
                    if forgotten < batch_size(settings.batch) {
                        break;
                    }
                }
            }
        }
        Ok(pass)
    }

    /// Up to [`BATCHES_PER_PASS`] batches of `removal`; `None` when another
    /// member holds retention. A batch the store refuses as data is tried
    /// again run by run, and the runs refused alone are passed over from
    /// then on, so one bad row never holds up those behind it.
    async fn remove_batches(
        &self,
        removal: Removal<'_>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<u64>, flotilla_store::StoreError> {
        let limit = self.settings().retention.batch;
        let mut removed = 0;
        for _ in 0..BATCHES_PER_PASS {
            let passed_over = self.retention_refused().clone();
            let removal = Removal {
                passed_over: &passed_over,
                ..removal
            };
            let batch = retention::remove_finished(self.pool(), removal, limit, now)
                .await
                .map_err(StoreError::from);
            // Runs removed, and runs the batch went through.
            let (count, taken) = match batch {
                Ok(Some(count)) => (count, count),
                Ok(None) => return Ok(None),
                Err(e) if e.is_about_the_data() => {
                    match self.remove_one_by_one(removal, now).await? {
                        Some(counts) => counts,
                        None => return Ok(None),
                    }
                }
                Err(e) => return Err(e),
            };
            removed += count;
            if taken < batch_size(limit) {
                break;
            }
        }
        Ok(Some(removed))
    }

    /// A batch of `removal`, each run in a transaction of its own; a run
    /// the store refuses is logged and passed over from then on. Returns
    /// the runs removed and the runs tried.
    async fn remove_one_by_one(
        &self,
        removal: Removal<'_>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<(u64, u64)>, StoreError> {
        let limit = self.settings().retention.batch;
        let mut removed = 0;
        let candidates = retention::candidates(self.pool(), removal, limit).await?;
        let tried = candidates.len() as u64;
        for job_id in candidates {
            match retention::remove_one(self.pool(), removal, job_id, now).await {
                Ok(Some(count)) => removed += count,
                Ok(None) => return Ok(None),
                Err(e) => {
                    let e = StoreError::from(e);
                    if !e.is_about_the_data() {
                        return Err(e);
                    }
                    tracing::error!(%job_id, error = %e,
                        "the store refused to remove this finished run; it is kept and passed over");
                    metrics::counter!("flotilla_runs_removal_refused_total").increment(1);
                    let mut refused = self.retention_refused();
                    if refused.len() < MAX_REFUSED {
                        refused.push(job_id);
                    }
                }
            }
        }
        Ok(Some((removed, tried)))
    }

    fn retention_refused(&self) -> std::sync::MutexGuard<'_, Vec<uuid::Uuid>> {
        self.inner
            .retention_refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs retention every `interval` until `shutdown`.
    pub(crate) async fn retention(&self, shutdown: CancellationToken) {
        if !self.settings().retention.enabled {
            return;
        }
        let mut ticks = tokio::time::interval(self.settings().retention.interval);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = shutdown.cancelled() => break,
            }
            match self.apply_retention().await {
                Ok(pass) if pass.removed + pass.forgotten > 0 => {
                    tracing::info!(
                        removed = pass.removed,
                        forgotten = pass.forgotten,
                        "retention removed finished runs"
                    );
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "retention failed; trying again at the next tick")
                }
            }
        }
    }
}

/// `now - keep`, or the earliest instant when that is before it (nothing
/// is that old: nothing is removed).
fn cutoff(now: chrono::DateTime<chrono::Utc>, keep: Duration) -> chrono::DateTime<chrono::Utc> {
    chrono::TimeDelta::from_std(keep)
        .ok()
        .and_then(|keep| now.checked_sub_signed(keep))
        .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC)
}

fn batch_size(limit: i64) -> u64 {
    u64::try_from(limit).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_workflow_retention_reads_and_a_wrong_part_is_named() {
        let rules =
            parse_by_workflow("payments:COMPLETED=90d,failed=1y; reports:CANCELLED=1h").unwrap();
        assert_eq!(
            rules,
            vec![
                WorkflowRetention {
                    workflow: "payments".into(),
                    status: RunStatus::Completed,
                    keep: Duration::from_secs(90 * 86_400),
                },
                WorkflowRetention {
                    workflow: "payments".into(),
                    status: RunStatus::Failed,
                    keep: humantime::parse_duration("1y").unwrap(),
                },
                WorkflowRetention {
                    workflow: "reports".into(),
                    status: RunStatus::Cancelled,
                    keep: Duration::from_secs(3600),
                },
            ]
        );
        assert!(parse_by_workflow("").unwrap().is_empty());
        for (bad, named) in [
            ("payments", "expected <workflow>:"),
            (":COMPLETED=1d", "no workflow name"),
            ("payments:COMPLETED", "expected <STATE>=<duration>"),
            ("payments:DONE=1d", "not a run state"),
            ("payments:RUNNING=1d", "only finished states"),
            ("payments:COMPLETED=soon", "soon"),
            ("payments:COMPLETED=0s", "between a minute and 100 years"),
            (
                "payments:COMPLETED=1000000y",
                "between a minute and 100 years",
            ),
        ] {
            let error = parse_by_workflow(bad).unwrap_err();
            assert!(error.contains(named), "{bad}: {error}");
        }
    }
}
