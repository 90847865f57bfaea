//! Grafts: ordinary steps appended to a job that has not finished.
//!
//! The caller names the revision it saw; the steps are appended to the
//! job's own copy of its definition (they may need existing steps; nothing
//! existing is replaced, renamed or rewired), the combined definition is
//! compiled as at registration, and the job's revision goes one up with an
//! ACCEPTED event naming the steps. A stale revision is refused; the same
//! graft sent again (every step already there, unchanged) is a repeat.
//!
//! Only plain call steps are grafted: no child, signal, timer, list,
//! pages or external completion, which would add waits the job never had.
//! The combined definition is compiled before the row is locked (its
//! revision, checked under the lock, says it is the one compiled), so a
//! large definition does not hold the lock the job's holder writes under.
//! A job that is not running (WAITING, or asleep on a timer) whose grafted
//! steps are ready now is queued again at once, as a woken park is.

use flotilla_store::runs::{self, READER_LEVEL, RunRow};
use flotilla_store::{RunStatus, StoreError};
use serde_json::Value as Json;
use uuid::Uuid;

use crate::Engine;
use crate::support::storable::{self, Unstorable};
use flotilla_workflow::{CompiledWorkflow, DefinitionProblem, InvalidDefinition, StepDefinition};

/// What a graft came to.
#[derive(Debug)]
pub enum GraftOutcome {
    /// The steps were appended; the job as it is now.
    Grafted(Box<RunRow>),
    /// Every step is there already, as sent: nothing was written.
    Repeat(Box<RunRow>),
}

#[derive(Debug, thiserror::Error)]
pub enum GraftError {
    #[error("job {0} not found")]
    NotFound(Uuid),
    #[error("job {job_id} is {status}: steps are grafted only onto a job that has not finished")]
    Finished { job_id: Uuid, status: RunStatus },
    #[error("job {job_id} is at revision {current}, not {sent}: read it again and graft onto that")]
    Stale {
        job_id: Uuid,
        sent: i32,
        current: i32,
    },
    #[error("steps: {0}")]
    Malformed(String),
    #[error(transparent)]
    Invalid(#[from] InvalidDefinition),
    #[error(transparent)]
    Unstorable(#[from] Unstorable),
    #[error("job {job_id} needs a worker of reader level {needs}; this one reads {reads}")]
    TooNew {
        job_id: Uuid,
        needs: i16,
        reads: i16,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for GraftError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

impl Engine {
    /// Appends `steps` (a non-empty list of step definitions) to the
    /// definition of `job_id` at `revision`.
    ///
    /// # Errors
    /// See [`GraftError`]: each is about the request except `Store`.
    pub async fn graft(
        &self,
        job_id: Uuid,
        revision: i32,
        steps: &Json,
    ) -> Result<GraftOutcome, GraftError> {
        storable::check_json("steps", steps)?;
        let grafted = steps
            .as_array()
            .filter(|steps| !steps.is_empty())
            .ok_or_else(|| GraftError::Malformed("a non-empty list of steps".into()))?;
        let plain = plain_call_problems(grafted);
        if !plain.is_empty() {
            return Err(InvalidDefinition { problems: plain }.into());
        }
        // Read and compiled without the lock; the revision checked under
        // it says the definition did not change meanwhile.
        let seen =
            flotilla_store::sql::session(self.pool(), async |conn| runs::get(conn, job_id).await)
                .await?
                .ok_or(GraftError::NotFound(job_id))?;
        let compiling = if seen.revision == revision && !seen.status.is_finished() {
            let mut definition = seen.definition.0.clone();
            if let Some(list) = definition["steps"].as_array_mut() {
                list.extend(grafted.iter().cloned());
            }
            // The combined graph is checked as a registration is.
            let compiled = self.compile(&definition).await;
            Some((definition, compiled))
        } else {
            None
        };
        let mut tx = self.pool().begin().await?;
        let row = runs::get_for_update(&mut tx, job_id)
            .await?
            .ok_or(GraftError::NotFound(job_id))?;
        if row.reader_level > READER_LEVEL {
            return Err(GraftError::TooNew {
                job_id,
                needs: row.reader_level,
                reads: READER_LEVEL,
            });
        }
        let current = row.definition.0["steps"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if grafted.iter().all(|step| current.contains(step)) {
            tx.rollback().await?;
            return Ok(GraftOutcome::Repeat(Box::new(row)));
        }
        if row.status.is_finished() {
            return Err(GraftError::Finished {
                job_id,
                status: row.status,
            });
        }
        let stale = GraftError::Stale {
            job_id,
            sent: revision,
            current: row.revision,
        };
        let Some((definition, compiled)) = compiling.filter(|_| row.revision == revision) else {
            return Err(stale);
        };
        let compiled = compiled?;
        let reader_level = self
            .reader_level_of(&compiled)
            .max(flotilla_store::runs::GRAPH_READER_LEVEL);
        let names: Vec<String> = grafted
            .iter()
            .map(|step| step["name"].as_str().unwrap_or_default().to_owned())
            .collect();
        let wake = row.status != RunStatus::Running && any_ready(&compiled, &row, &names);
        let now = self.now();
        runs::graft(
            &mut tx,
            job_id,
            (revision, reader_level),
            &definition,
            (names, wake),
            now,
        )
        .await?
        .ok_or(stale)?;
        tx.commit().await?;
        if wake {
            self.wake();
        }
        // Its ACCEPTED event waits for the relays.
        self.inner
            .doorbell
            .ring(flotilla_store::wake::Channel::Outbox);
        let row =
            flotilla_store::sql::session(self.pool(), async |conn| runs::get(conn, job_id).await)
                .await?
                .ok_or(GraftError::NotFound(job_id))?;
        Ok(GraftOutcome::Grafted(Box::new(row)))
    }
}

/// Why each grafted step that is not a plain call cannot be grafted (a
/// step that does not parse is left to the compiler to name).
fn plain_call_problems(steps: &[Json]) -> Vec<DefinitionProblem> {
    let mut problems = Vec::new();
    for step in steps {
        let Ok(step) = serde_json::from_value::<StepDefinition>(step.clone()) else {
            continue;
        };
        let waits = [
            ("start", step.start.is_some()),
            ("wait_for", step.wait_for.is_some()),
            ("sleep", step.sleep.is_some()),
            ("until", step.until.is_some()),
            ("for_each", step.for_each.is_some()),
            ("paged", step.paged),
            ("completion", step.completion.is_some()),
        ];
        for (field, present) in waits {
            if present {
                problems.push(DefinitionProblem {
                    step: Some(step.name.clone()),
                    field: field.into(),
                    message: "a grafted step is a plain call (target, method, needs, when, rules, validate, output_schema)".into(),
                });
            }
        }
    }
    problems
}

/// Whether one of the grafted steps `names` has every need ended in the
/// checkpoints of `row`: then it can run now.
fn any_ready(compiled: &CompiledWorkflow, row: &RunRow, names: &[String]) -> bool {
    let ended = row.ended_steps();
    names
        .iter()
        .filter_map(|name| compiled.step_index(name))
        .any(|index| {
            compiled
                .graph
                .needs(index)
                .iter()
                .all(|&need| ended.contains(compiled.steps[need].definition.name.as_str()))
        })
}
