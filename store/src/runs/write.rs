//! New runs (one, or a batch with refusals recorded) and steps grafted
//! onto a running one.

use crate::StoreError;
use crate::outbox::{self, EventKind, EventStamp};
use crate::status::RunStatus;
use chrono::{DateTime, Utc};
use sqlx::PgTransaction;
use sqlx::types::Json;
use uuid::Uuid;

use super::*;

/// Why a submission was recorded as FAILED instead of queued.
#[derive(Debug, Clone, Copy)]
pub struct Refusal<'a> {
    pub error: &'a str,
    pub verdict: &'a str,
}

/// A row to insert at submission.
#[derive(Debug)]
pub struct NewRun<'a> {
    pub job_id: Uuid,
    pub workflow_name: &'a str,
    pub workflow_version: Option<i32>,
    /// The copy the row keeps; `None` points at `workflow_version` instead.
    pub definition: Option<&'a serde_json::Value>,
    pub input: &'a serde_json::Value,
    pub request_digest: &'a str,
    pub max_attempts: i32,
    /// The caller's labels (a JSON object of strings), if any.
    pub metadata: Option<serde_json::Value>,
    /// 0 to 10: the job's first `run_after` is this many minutes before
    /// `now`, ahead of jobs of lower priority that arrived since.
    pub priority: i16,
    /// The workflow's `debounce`: the key, and how long the job waits for
    /// a later request of it before it starts (added to its `run_after`).
    pub debounce: Option<(String, i64)>,
    /// The workflow's `concurrency`: the key, and its limit.
    pub concurrency: Option<(String, i32)>,
    /// The workflow's `execution_timeout_ms`: the job expires this long
    /// after `now`.
    pub execution_timeout_ms: Option<i64>,
    /// The layout a worker must read to run it (at least 1 when
    /// `definition` is `None`).
    pub reader_level: i16,
    /// `None`: QUEUED with an ACCEPTED event; `Some`: FAILED with a FAILED event.
    pub refusal: Option<Refusal<'a>>,
    /// Written already claimed by this worker (eager start): RUNNING under
    /// a fresh lease token until `until`, its first attempt counted, as a
    /// claim would leave it. Ignored where [`NewRun::may_start_at_once`]
    /// says no: those go in as they would without it.
    pub lease: Option<EagerLease<'a>>,
    pub traceparent: Option<&'a str>,
    pub tracestate: Option<&'a str>,
    pub now: DateTime<Utc>,
}

/// The lease a run is written under when the worker that writes it runs
/// it at once.
#[derive(Debug, Clone, Copy)]
pub struct EagerLease<'a> {
    pub owner: &'a str,
    pub until: DateTime<Utc>,
}

/// Inserts a new run with its first event (ACCEPTED, or FAILED for a
/// recorded refusal) and returns it; `None` when a row with that job id
/// exists already (then nothing was written).
///
/// # Errors
/// Database errors; an event the contract refuses.
pub async fn insert(
    tx: &mut PgTransaction<'_>,
    run: &NewRun<'_>,
) -> Result<Option<RunRow>, StoreError> {
    let mut rows = insert_many(tx, std::slice::from_ref(run)).await?;
    Ok(rows.remove(0))
}

/// Inserts many new runs, each with its first event, in two statements (the
/// rows, then their events); one answer per run, in order: `None` when a row
/// with that job id exists already, came earlier in `runs`, or was removed
/// by retention within the horizon (then nothing was written for it). All runs share the first one's `now`.
///
/// # Errors
/// Database errors (then the caller's transaction holds part of the batch
/// and must be rolled back); an event the contract refuses.
pub async fn insert_many<'a>(
    tx: &mut PgTransaction<'_>,
    runs: &[NewRun<'a>],
) -> Result<Vec<Option<RunRow>>, StoreError> {
    let Some(now) = runs.first().map(|run| run.now) else {
        return Ok(Vec::new());
    };
    let text = |f: fn(&NewRun<'a>) -> Option<&'a str>| runs.iter().map(f).collect::<Vec<_>>();
    let json = |f: fn(&NewRun<'a>) -> &'a serde_json::Value| {
        runs.iter().map(|run| Json(f(run))).collect::<Vec<_>>()
    };
    let mut inserted: Vec<RunRow> = crate::sql::query_as(&format!(
        "INSERT INTO workflow_run (job_id, workflow_name, workflow_version, definition, input, request_digest,
             status, max_attempts, run_after, error, verdict, event_sequence, reader_level, traceparent, tracestate, created_at, updated_at,
             expires_at, priority, debounce_key, concurrency_key, concurrency_limit, metadata,
             lease_owner, lease_token, lease_until, attempt)
         SELECT job_id, workflow_name, workflow_version, definition, input, request_digest,
             status, max_attempts, $13 - prio * interval '1 minute' + coalesce(window_ms, 0) * interval '1 millisecond', error, verdict, 1, greatest(CASE WHEN definition IS NULL THEN 1 ELSE 0 END, level),
             traceparent, tracestate, $13, $13, $13 + timeout_ms * interval '1 millisecond', prio, debounce_key, concurrency_key, concurrency_limit, labels,
             owner, CASE WHEN owner IS NOT NULL THEN gen_random_uuid() END, owner_until, CASE WHEN owner IS NOT NULL THEN 1 ELSE 0 END
         FROM UNNEST($1::uuid[], $2::text[], $3::int4[], $4::jsonb[], $5::jsonb[], $6::text[],
                     $7::text[], $8::int4[], $9::text[], $10::text[], $11::text[], $12::text[], $14::int2[], $15::int8[], $16::int2[], $17::text[], $18::int8[], $19::text[], $20::int4[], $21::jsonb[],
                     $22::text[], $23::timestamptz[])
             WITH ORDINALITY AS r(job_id, workflow_name, workflow_version, definition, input, request_digest,
                                  status, max_attempts, error, verdict, traceparent, tracestate, level, timeout_ms, prio, debounce_key, window_ms, concurrency_key, concurrency_limit, labels,
                                  owner, owner_until, position)
         WHERE NOT EXISTS (SELECT 1 FROM workflow_run_removed rm WHERE rm.job_id = r.job_id)
         ORDER BY position
         ON CONFLICT (job_id) DO NOTHING
         RETURNING {COLUMNS}"
    ))
    .bind(runs.iter().map(|run| run.job_id).collect::<Vec<_>>())
    .bind(text(|run| Some(run.workflow_name)))
    .bind(runs.iter().map(|run| run.workflow_version).collect::<Vec<_>>())
    .bind(
        runs.iter()
            .map(|run| run.definition.map(Json))
            .collect::<Vec<_>>(),
    )
    .bind(json(|run| run.input))
    .bind(text(|run| Some(run.request_digest)))
    .bind(text(|run| Some(run.status().as_str())))
    .bind(runs.iter().map(|run| run.max_attempts).collect::<Vec<_>>())
    .bind(text(|run| run.refusal.map(|r| r.error)))
    .bind(text(|run| run.refusal.map(|r| r.verdict)))
    .bind(text(|run| run.traceparent))
    .bind(text(|run| run.tracestate))
    .bind(now)
    .bind(runs.iter().map(|run| run.reader_level).collect::<Vec<_>>())
    .bind(
        runs.iter()
            .map(|run| run.execution_timeout_ms)
            .collect::<Vec<_>>(),
    )
    .bind(runs.iter().map(|run| run.priority).collect::<Vec<_>>())
    .bind(
        runs.iter()
            .map(|run| run.debounce.as_ref().map(|(key, _)| key.as_str()))
            .collect::<Vec<_>>(),
    )
    .bind(
        runs.iter()
            .map(|run| run.debounce.as_ref().map(|(_, window)| *window))
            .collect::<Vec<_>>(),
    )
    .bind(
        runs.iter()
            .map(|run| run.concurrency.as_ref().map(|(key, _)| key.as_str()))
            .collect::<Vec<_>>(),
    )
    .bind(
        runs.iter()
            .map(|run| run.concurrency.as_ref().map(|(_, limit)| *limit))
            .collect::<Vec<_>>(),
    )
    .bind(
        runs.iter()
            .map(|run| run.metadata.as_ref().map(Json))
            .collect::<Vec<_>>(),
    )
    .bind(text(|run| run.eager_lease().map(|lease| lease.owner)))
    .bind(
        runs.iter()
            .map(|run| run.eager_lease().map(|lease| lease.until))
            .collect::<Vec<_>>(),
    )
    .fetch_all(&mut **tx)
    .await?;
    // A run that retention removed while this insert waited on its row:
    // the NOT EXISTS above read the removals as the statement began, but
    // this statement sees the one that committed meanwhile. The new row is
    // taken back, and the id answered from its record.
    if !inserted.is_empty() {
        let ids: Vec<Uuid> = inserted.iter().map(|row| row.job_id).collect();
        let raced: Vec<Uuid> = crate::sql::query_scalar(
            "DELETE FROM workflow_run r WHERE r.job_id = ANY($1)
               AND EXISTS (SELECT 1 FROM workflow_run_removed rm WHERE rm.job_id = r.job_id)
             RETURNING r.job_id",
        )
        .bind(&ids)
        .fetch_all(&mut **tx)
        .await?;
        inserted.retain(|row| !raced.contains(&row.job_id));
    }
    let mut by_job: std::collections::HashMap<Uuid, RunRow> =
        inserted.into_iter().map(|row| (row.job_id, row)).collect();
    // The first of a job id in `runs` is the one inserted; later ones are repeats.
    let rows: Vec<Option<RunRow>> = runs.iter().map(|run| by_job.remove(&run.job_id)).collect();
    let stamps: Vec<(EventStamp, EventKind)> = runs
        .iter()
        .zip(&rows)
        .filter_map(|(run, row)| Some((row.as_ref()?.stamp(), run.first_event())))
        .collect();
    if !stamps.is_empty() {
        let commits = stamps
            .iter()
            .map(|(stamp, kind)| (stamp, kind.clone()))
            .collect();
        outbox::insert_many(tx, commits, now).await?;
    }
    Ok(rows)
}

impl<'a> NewRun<'a> {
    fn status(&self) -> RunStatus {
        match (self.refusal, self.eager_lease()) {
            (Some(_), _) => RunStatus::Failed,
            (None, Some(_)) => RunStatus::Running,
            (None, None) => RunStatus::Queued,
        }
    }

    /// Whether it may be written already claimed: not a refusal (FAILED
    /// at once), not a run that waits out a debounce window, and not one of
    /// a concurrency key, whose policy past the limit is settled among
    /// QUEUED arrivals in the submitting transaction.
    #[must_use]
    pub fn may_start_at_once(&self) -> bool {
        self.refusal.is_none() && self.debounce.is_none() && self.concurrency.is_none()
    }

    /// The lease it is written under, if it may start at once.
    fn eager_lease(&self) -> Option<EagerLease<'a>> {
        self.lease.filter(|_| self.may_start_at_once())
    }

    fn first_event(&self) -> EventKind {
        match self.refusal {
            None => EventKind::Accepted,
            Some(refusal) => EventKind::Failed {
                error: refusal.error.to_owned(),
                verdict: Some(refusal.verdict.to_owned()),
            },
        }
    }
}

/// Grafts steps onto `job_id` at `revision`: its definition becomes
/// `definition` (the job's copy), its revision one more, its reader level
/// at least `reader_level` (that of the combined definition), with an ACCEPTED event naming the steps. Bumps the event
/// sequence and the revision: a worker running the job goes on writing
/// its checkpoints (its fence leaves the graft's event out), but the write
/// that would end its graph is refused, and the job resumes with the new
/// steps. `None`: the job is finished or
/// no longer at `revision` (nothing written).
///
/// # Errors
/// Database errors; an event the contract refuses.
pub async fn graft(
    tx: &mut PgTransaction<'_>,
    job_id: Uuid,
    (revision, reader_level): (i32, i16),
    definition: &serde_json::Value,
    (steps, wake): (Vec<String>, bool),
    now: DateTime<Utc>,
) -> Result<Option<i32>, StoreError> {
    // Woken: a WAITING job goes back to the queue with fresh attempts (as
    // a woken park does), an asleep one (timers set) is due now; a job
    // queued for a retry keeps its backoff.
    let stamp: Option<EventStamp> = crate::sql::query_as(&format!(
        "UPDATE workflow_run SET definition = $3, revision = revision + 1,
             reader_level = greatest(reader_level, $4), event_sequence = event_sequence + 1,
             updated_at = $5,
             attempt = CASE WHEN $6 AND status = 'WAITING' THEN 0 ELSE attempt END,
             outstanding_step = CASE WHEN $6 AND status = 'WAITING' THEN NULL ELSE outstanding_step END,
             run_after = CASE WHEN $6 AND (status = 'WAITING' OR timers IS NOT NULL)
                              THEN least(run_after, $5) ELSE run_after END,
             status = CASE WHEN $6 AND status = 'WAITING' THEN 'QUEUED' ELSE status END
         WHERE job_id = $1 AND revision = $2 AND status IN ('QUEUED', 'RUNNING', 'WAITING')
         RETURNING {STAMP}"
    ))
    .bind(job_id)
    .bind(revision)
    .bind(Json(definition))
    .bind(reader_level)
    .bind(now)
    .bind(wake)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(stamp) = stamp else {
        return Ok(None);
    };
    let revision = revision + 1;
    outbox::insert(tx, &stamp, EventKind::Grafted { revision, steps }, now).await?;
    Ok(Some(revision))
}
