//! Submission: the one way a job comes to exist, shared by the API and the
//! request consumer. Everything is validated before anything is written;
//! the row and its first event commit together; a repeat of the same
//! `job_id` is idempotent.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use flotilla_store::runs::{self, NewRun, Refusal, RunRow, concurrency};
use flotilla_store::{RunStatus, StoreError, definitions};
use serde_json::Value as Json;
use sqlx::{PgConnection, PgTransaction};
use uuid::Uuid;

use crate::submission::{admit, request_digest};
use crate::{Engine, Feature, RefusalMode, Submission, SubmitError, Submitted, WorkflowRef};
use flotilla_workflow::expr::Scope;
use flotilla_workflow::{CompiledWorkflow, OnExcess};

/// A validated submission, ready to insert.
pub(crate) struct Resolved {
    workflow_name: String,
    workflow_version: Option<i32>,
    /// The definition the row keeps; `None` when it points at its stored
    /// version instead (the definition-by-reference switch).
    copy: Option<Json>,
    max_attempts: i32,
    execution_timeout_ms: Option<i64>,
    /// The debounce key the input gave, and the window in milliseconds.
    debounce: Option<(String, i64)>,
    /// The concurrency key the input gave, its limit, and its policy past it.
    concurrency: Option<(String, i32, OnExcess)>,
    /// The run layout a worker must read to run it (`runs::READER_LEVEL`).
    reader_level: i16,
    /// Every target its steps call is one this worker has: it may be
    /// written claimed by this worker (eager start).
    runs_here: bool,
}

impl Engine {
    /// Submits a job.
    ///
    /// # Errors
    /// [`SubmitError::Conflict`] for a `job_id` with other content; with
    /// [`RefusalMode::Refuse`], an unknown workflow, an invalid definition or
    /// input; store errors.
    pub async fn submit(
        &self,
        submission: Submission,
        mode: RefusalMode,
    ) -> Result<Submitted, SubmitError> {
        let submission = admit(submission)?;
        let seats = self.inner.seats.reserve(self.eager_seats(1));
        let now = self.now();
        let lease = self.eager_lease(now);
        let mut tx = self.pool().begin().await?;
        let submitted = self
            .submit_in(
                &mut tx,
                &submission,
                mode,
                now,
                &mut HashMap::new(),
                lease.filter(|_| seats.count() > 0),
            )
            .await
            .map_err(SubmitError::data_to_unstorable);
        // Only a submission that went through commits: an error part-way
        // must not leave a row without its event.
        match &submitted {
            Ok(_) => tx.commit().await?,
            Err(_) => tx.rollback().await?,
        }
        if let Ok(submitted) = &submitted {
            self.hand_claimed(seats, std::iter::once(submitted)).await;
            self.created(submitted);
        }
        submitted
    }

    /// After a submission commits: a new QUEUED job wakes a claim loop, a
    /// refusal recorded as a FAILED row counts as a finish.
    pub(crate) fn created(&self, submitted: &Submitted) {
        if let Submitted::Created(row) = submitted {
            match row.status {
                RunStatus::Queued => self.wake(),
                RunStatus::Failed => self.job_finished(
                    (&row.workflow_name, row.workflow_version),
                    "FAILED",
                    row.created_at,
                ),
                _ => {}
            }
        }
    }

    /// A submission the engine makes itself (a schedule's tick, a child
    /// job) inside the caller's transaction: a refusal is recorded as a
    /// FAILED job, as one from the topic is.
    pub(crate) async fn submit_recorded(
        &self,
        tx: &mut PgTransaction<'_>,
        submission: &Submission,
        now: DateTime<Utc>,
    ) -> Result<Submitted, SubmitError> {
        self.submit_in(
            tx,
            submission,
            RefusalMode::Record,
            now,
            &mut HashMap::new(),
            None,
        )
        .await
    }

    /// The submission inside the caller's transaction; the caller commits.
    /// With `lease`, a run that may start at once is written claimed by
    /// this worker (`run/claiming/eager.rs`).
    pub(crate) async fn submit_in(
        &self,
        tx: &mut PgTransaction<'_>,
        submission: &Submission,
        mode: RefusalMode,
        now: DateTime<Utc>,
        newest: &mut NewestDefinitions,
        lease: Option<runs::EagerLease<'_>>,
    ) -> Result<Submitted, SubmitError> {
        let prepared = match self.prepare(tx, submission, mode, newest).await? {
            Prepared::Done(submitted) => return Ok(*submitted),
            insert @ Prepared::Insert { .. } => insert,
        };
        let mut new_run = prepared.new_run(submission, now).expect("an insert");
        new_run.lease = lease.filter(|_| prepared.runs_here());
        let row = runs::insert(tx, &new_run).await?;
        let policies: HashMap<Uuid, OnExcess> = prepared
            .on_excess()
            .map(|policy| (submission.job_id, policy))
            .into_iter()
            .collect();
        let submitted = prepared.inserted(tx, submission, row).await?;
        let mut results = [Ok(submitted)];
        if let Ok(Submitted::Created(row)) = &results[0] {
            let cancelled = supersede(tx, [row], &policies, now).await?;
            reread_cancelled(tx, &mut results, &cancelled).await?;
        }
        let [submitted] = results;
        submitted
    }

    /// Checks and resolves a submission against the stored definitions,
    /// writing nothing: what to insert, or the existing job it repeats.
    pub(crate) async fn prepare(
        &self,
        conn: &mut PgConnection,
        submission: &Submission,
        mode: RefusalMode,
        newest: &mut NewestDefinitions,
    ) -> Result<Prepared, SubmitError> {
        let digest = request_digest(submission);
        let (resolved, refusal) = match self.resolve(conn, submission, newest).await {
            Ok(resolved) => (resolved, None),
            Err(refused) if refused.is_refusal() && mode == RefusalMode::Record => {
                let resolved = Resolved {
                    workflow_name: refused_name(submission),
                    workflow_version: None,
                    copy: Some(Json::Null),
                    max_attempts: 1,
                    execution_timeout_ms: None,
                    debounce: None,
                    concurrency: None,
                    reader_level: 0,
                    runs_here: false,
                };
                (resolved, Some(refused.to_string()))
            }
            Err(refused) => {
                // A repeat of an accepted job is still recognised after its
                // workflow changed; only a new job_id gets the refusal.
                return match existing(conn, submission.job_id, &digest).await? {
                    Some(existing) => Ok(Prepared::Done(Box::new(existing))),
                    None => Err(refused),
                };
            }
        };
        Ok(Prepared::Insert {
            digest,
            resolved,
            refusal,
        })
    }

    async fn resolve(
        &self,
        conn: &mut PgConnection,
        submission: &Submission,
        newest: &mut NewestDefinitions,
    ) -> Result<Resolved, SubmitError> {
        let (document, stored_as) = match &submission.workflow {
            WorkflowRef::Inline(document) => (document.clone(), None),
            WorkflowRef::Stored(name) => {
                if !newest.contains_key(name) {
                    let stored = definitions::newest(conn, name).await?;
                    newest.insert(name.clone(), stored);
                }
                let stored = newest[name]
                    .as_ref()
                    .ok_or_else(|| SubmitError::UnknownWorkflow(name.clone()))?;
                (
                    stored.definition.0.clone(),
                    Some((stored.name.clone(), stored.version)),
                )
            }
            WorkflowRef::Version(name, version) => {
                let stored = definitions::version(conn, name, *version)
                    .await?
                    .ok_or_else(|| SubmitError::UnknownVersion {
                        name: name.clone(),
                        version: *version,
                    })?;
                (stored.definition.0, Some((stored.name, stored.version)))
            }
        };
        let compiled = match &submission.workflow {
            WorkflowRef::Stored(_) | WorkflowRef::Version(..) => {
                self.compile_stored(&document).await?
            }
            WorkflowRef::Inline(_) => self.compile(&document).await?,
        };
        // Schema validation runs off the runtime (`support/eval_pool.rs`).
        let checked = {
            let (compiled, input) = (compiled.clone(), submission.input.clone());
            self.off_runtime(move || compiled.check_input(&input)).await
        };
        let violations = match checked {
            Ok(Ok(())) => None,
            Ok(Err(violations)) => Some(violations),
            Err(exhausted) => Some(vec![exhausted.to_string()]),
        };
        if let Some(violations) = violations {
            return Err(SubmitError::InvalidInput {
                workflow: compiled.definition.name.clone(),
                violations,
            });
        }
        let debounce = debounce_of(&compiled, &submission.input)?;
        let concurrency = concurrency_of(&compiled, &submission.input)?;
        // A stored workflow's row carries the key of its version, so a row
        // that points at the version instead of copying it finds it; with
        // `definition_by_reference` it keeps no copy. An inline definition
        // has nothing to point at and is always copied.
        let runs_here = self.missing_targets(&document).is_empty();
        let (workflow_name, workflow_version, copy) = match stored_as {
            Some((name, version)) => {
                let copy = (!self.uses(Feature::DefinitionByReference)).then_some(document);
                (name, Some(version), copy)
            }
            None => (compiled.definition.name.clone(), None, Some(document)),
        };
        Ok(Resolved {
            workflow_name,
            workflow_version,
            copy,
            max_attempts: compiled.definition.max_attempts,
            execution_timeout_ms: compiled
                .definition
                .execution_timeout_ms
                .and_then(|ms| i64::try_from(ms).ok()),
            debounce,
            concurrency,
            reader_level: self.reader_level_of(&compiled),
            runs_here,
        })
    }
}

/// A submission checked and resolved, before anything is written.
pub(crate) enum Prepared {
    /// A row to insert: QUEUED, or FAILED with the refusal recorded.
    Insert {
        digest: String,
        resolved: Resolved,
        refusal: Option<String>,
    },
    /// A repeat of an existing job: nothing to write.
    Done(Box<Submitted>),
}

impl Prepared {
    /// Whether the row to insert may be written claimed by this worker:
    /// it has every target the workflow's steps call.
    pub(crate) fn runs_here(&self) -> bool {
        matches!(self, Self::Insert { resolved, .. } if resolved.runs_here)
    }

    /// The concurrency policy of the row to insert, if its workflow has a key.
    pub(crate) fn on_excess(&self) -> Option<OnExcess> {
        match self {
            Self::Insert { resolved, .. } => resolved.concurrency.as_ref().map(|(_, _, p)| *p),
            Self::Done(_) => None,
        }
    }

    /// The row to insert for `submission`, unless it is a repeat.
    pub(crate) fn new_run<'a>(
        &'a self,
        submission: &'a Submission,
        now: DateTime<Utc>,
    ) -> Option<NewRun<'a>> {
        let Self::Insert {
            digest,
            resolved,
            refusal,
        } = self
        else {
            return None;
        };
        Some(NewRun {
            job_id: submission.job_id,
            workflow_name: &resolved.workflow_name,
            workflow_version: resolved.workflow_version,
            definition: resolved.copy.as_ref(),
            input: &submission.input,
            request_digest: digest,
            max_attempts: resolved.max_attempts,
            execution_timeout_ms: resolved.execution_timeout_ms,
            reader_level: resolved.reader_level,
            refusal: refusal.as_deref().map(|error| Refusal {
                error,
                verdict: REFUSED_VERDICT,
            }),
            traceparent: submission.traceparent.as_deref(),
            tracestate: submission.tracestate.as_deref(),
            priority: submission.priority,
            metadata: submission
                .metadata
                .as_ref()
                .filter(|m| !m.is_empty())
                .map(|m| serde_json::json!(m)),
            debounce: resolved.debounce.clone(),
            lease: None,
            concurrency: resolved
                .concurrency
                .as_ref()
                .map(|(key, limit, _)| (key.clone(), *limit)),
            now,
        })
    }

    /// What inserting `submission` came to: its new `row`, or, when the
    /// insert found its job id taken, the existing job or a conflict.
    pub(crate) async fn inserted(
        self,
        conn: &mut PgConnection,
        submission: &Submission,
        row: Option<RunRow>,
    ) -> Result<Submitted, SubmitError> {
        let digest = match self {
            Self::Done(submitted) => return Ok(*submitted),
            Self::Insert { digest, .. } => digest,
        };
        match row {
            Some(row) => {
                crate::support::telemetry::job_submitted(&row.workflow_name, row.workflow_version);
                Ok(Submitted::Created(row))
            }
            None => existing(conn, submission.job_id, &digest)
                .await?
                .ok_or(SubmitError::Conflict(submission.job_id)),
        }
    }
}

/// Newest stored definitions looked up so far in one transaction, by name.
pub(crate) type NewestDefinitions = HashMap<String, Option<definitions::StoredDefinition>>;

/// The verdict of a job refused at submission.
const REFUSED_VERDICT: &str = "rejected at submission";

/// The existing row of `job_id`, or the record of its removed run:
/// `Existing` or `Removed` when its digest matches, `Conflict` when it does
/// not, `None` when there is neither.
async fn existing(
    conn: &mut PgConnection,
    job_id: Uuid,
    digest: &str,
) -> Result<Option<Submitted>, SubmitError> {
    match runs::get(conn, job_id).await? {
        Some(row) if row.request_digest == digest => Ok(Some(Submitted::Existing(row))),
        Some(_) => Err(SubmitError::Conflict(job_id)),
        None => match flotilla_store::retention::removed(conn, job_id)
            .await
            .map_err(StoreError::from)?
        {
            Some(removed) if removed.request_digest == digest => {
                Ok(Some(Submitted::Removed(removed)))
            }
            Some(_) => Err(SubmitError::Conflict(job_id)),
            None => Ok(None),
        },
    }
}

/// The name a refused submission is recorded under.
fn refused_name(submission: &Submission) -> String {
    match &submission.workflow {
        WorkflowRef::Stored(name) | WorkflowRef::Version(name, _) => name.clone(),
        WorkflowRef::Inline(document) => document
            .get("name")
            .and_then(Json::as_str)
            .filter(|n| !n.trim().is_empty())
            .unwrap_or("(unnamed inline workflow)")
            .to_owned(),
    }
}

/// The debounce key `input` gives under `compiled`'s `debounce` (prefixed
/// with the workflow's name), and its window.
fn debounce_of(
    compiled: &CompiledWorkflow,
    input: &Json,
) -> Result<Option<(String, i64)>, SubmitError> {
    let (Some(expression), Some(debounce)) =
        (&compiled.debounce_key, &compiled.definition.debounce)
    else {
        return Ok(None);
    };
    let key = key_of(compiled, expression, "debounce.key", input)?;
    let window = i64::try_from(debounce.window_ms).unwrap_or(i64::MAX);
    Ok(Some((key, window)))
}

/// The concurrency key `input` gives under `compiled`'s `concurrency`
/// (prefixed with the workflow's name), its limit and its policy.
pub(crate) fn concurrency_of(
    compiled: &CompiledWorkflow,
    input: &Json,
) -> Result<Option<(String, i32, OnExcess)>, SubmitError> {
    let (Some(expression), Some(concurrency)) =
        (&compiled.concurrency_key, &compiled.definition.concurrency)
    else {
        return Ok(None);
    };
    let key = key_of(compiled, expression, "concurrency.key", input)?;
    let limit = i32::try_from(concurrency.limit).unwrap_or(i32::MAX);
    Ok(Some((key, limit, concurrency.on_excess)))
}

/// The key `expression` (the field `field`) gives over `input`, prefixed
/// with the workflow's name; one that does not evaluate to a string or a
/// number refuses the input.
fn key_of(
    compiled: &CompiledWorkflow,
    expression: &flotilla_workflow::expr::Expression,
    field: &str,
    input: &Json,
) -> Result<String, SubmitError> {
    let refused = |why: String| SubmitError::InvalidInput {
        workflow: compiled.definition.name.clone(),
        violations: vec![format!("{field}: {why}")],
    };
    let key = match expression.evaluate(&Scope::default().with("input", input)) {
        Ok(Json::String(text)) => text,
        Ok(number @ Json::Number(_)) => number.to_string(),
        Ok(other) => return Err(refused(format!("gave {other}, not a string or a number"))),
        Err(e) => return Err(refused(e)),
    };
    Ok(format!("{}/{key}", compiled.definition.name))
}

/// The new rows among `results` that [`supersede`] cancelled at once, read
/// again, so the answer to their submission says CANCELLED and why.
pub(crate) async fn reread_cancelled(
    conn: &mut PgConnection,
    results: &mut [Result<Submitted, SubmitError>],
    cancelled: &[Uuid],
) -> Result<(), StoreError> {
    for result in results {
        if let Ok(Submitted::Created(row)) = result
            && cancelled.contains(&row.job_id)
            && let Some(now) = runs::get(conn, row.job_id).await?
        {
            *row = now;
        }
    }
    Ok(())
}

/// After new rows were inserted (in the order given): each debounce key's
/// last new QUEUED job cancels the jobs of its key that have not started,
/// earlier rows of the same batch among them; then each new job of a
/// concurrency key that cancels past its limit cancels the newest or the
/// oldest. `policies`: the concurrency policy of each new job that has one.
/// Returns the jobs cancelled (or, RUNNING, asked to cancel).
pub(crate) async fn supersede<'a>(
    tx: &mut PgTransaction<'_>,
    created: impl IntoIterator<Item = &'a RunRow>,
    policies: &HashMap<Uuid, OnExcess>,
    now: DateTime<Utc>,
) -> Result<Vec<Uuid>, StoreError> {
    let created: Vec<&RunRow> = created.into_iter().collect();
    let mut cancelled = Vec::new();
    let mut last: Vec<(&str, Uuid)> = Vec::new();
    for row in created.iter().copied() {
        if let (Some(key), RunStatus::Queued) = (row.debounce_key.as_deref(), row.status) {
            last.retain(|(k, _)| *k != key);
            last.push((key, row.job_id));
        }
    }
    for (key, survivor) in last {
        let superseded = flotilla_store::runs::debounce::supersede(tx, key, survivor, now).await?;
        if !superseded.is_empty() {
            tracing::info!(key, %survivor, cancelled = superseded.len(), "debounced: earlier requests of the key cancelled");
        }
        cancelled.extend(superseded);
    }
    let arrivals: Vec<concurrency::Arrival<'_>> = created
        .iter()
        .filter(|row| row.status == RunStatus::Queued && !cancelled.contains(&row.job_id))
        .filter_map(|row| {
            let cancel_oldest = match policies.get(&row.job_id)? {
                OnExcess::Queue => return None,
                OnExcess::CancelNewest => false,
                OnExcess::CancelOldest => true,
            };
            Some(concurrency::Arrival {
                job_id: row.job_id,
                key: row.concurrency_key.as_deref()?,
                limit: row.concurrency_limit?,
                cancel_oldest,
            })
        })
        .collect();
    if !arrivals.is_empty() {
        let batch: Vec<Uuid> = created.iter().map(|row| row.job_id).collect();
        let excess = concurrency::cancel_excess(tx, &arrivals, &batch, now).await?;
        if !excess.is_empty() {
            tracing::info!(
                cancelled = excess.len(),
                "jobs cancelled past their concurrency key's limit"
            );
        }
        cancelled.extend(excess);
    }
    Ok(cancelled)
}
