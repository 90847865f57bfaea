//! Writing a [`Transition`] under its [`Fence`]: one statement that lands
//! the change and its event, or finds the lease gone.

use chrono::{DateTime, Utc};
use sqlx::PgTransaction;
use sqlx::types::Json;
use uuid::Uuid;

use crate::StoreError;
use crate::outbox::{self, EventKind, EventStamp};
use crate::runs::{STAMP, checkpoint_write};

use super::{Fence, Transition};

/// What a fenced write came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The lease is lost or the change was already written: zero rows
    /// matched and nothing was written.
    Lost,
    /// Written as asked, with its event.
    Done,
    /// A transition out of RUNNING found a cancel asked of the job while
    /// its segment ran, and wrote CANCELLED instead (the reason asked as
    /// its error, one CANCELLED event; a last checkpoint it carried is
    /// kept, requests it would have sent are not).
    Cancelled,
}

impl Written {
    /// Whether something was written.
    #[must_use]
    pub fn is_written(self) -> bool {
        !matches!(self, Self::Lost)
    }
}

/// The stamp of a written row, and whether it landed CANCELLED.
#[derive(sqlx::FromRow)]
struct Landed {
    #[sqlx(flatten)]
    stamp: EventStamp,
    status: crate::RunStatus,
    error: Option<String>,
}

/// Applies `change` if `fence` still holds the lease on `job_id` (and, for
/// a commit point, the row is still at the fence's sequence), with its
/// outbox row in the same transaction. A change that takes the job out of
/// RUNNING writes CANCELLED instead when a cancel was asked meanwhile
/// ([`Written::Cancelled`]).
///
/// # Errors
/// Database errors; an event the contract refuses.
pub async fn transition(
    tx: &mut PgTransaction<'_>,
    job_id: Uuid,
    fence: Fence,
    now: DateTime<Utc>,
    change: &Transition,
) -> Result<Written, StoreError> {
    // A hand-back after an ambiguous commit must match whatever the
    // sequence became: only commit points compare it. Events others wrote
    // meanwhile (signals received) are not the holder's and do not count.
    let sequence = if change.is_commit_point() {
        " AND event_sequence - foreign_events - revision = $4"
    } else {
        ""
    };
    let revision = if change.ends_the_graph() {
        format!(" AND revision = {}", fence.revision)
    } else {
        String::new()
    };
    let update = format!(
        "UPDATE workflow_run SET {}, updated_at = $3
         WHERE job_id = $1 AND lease_token = $2 AND status = 'RUNNING'{sequence}{revision}",
        change.assignments()
    );
    // The event stamp, and the status and error the row landed in.
    let landed = format!("{STAMP}, status, error");
    let sql = match change {
        Transition::Checkpoint { .. } => checkpoint_write(&update, "$5", 0, &landed),
        // The checkpoint row takes the STEP_CHECKPOINT event's sequence,
        // the one before the COMPLETED (or CANCELLED) event's.
        Transition::CheckpointAndComplete { .. } => checkpoint_write(&update, "$5", 1, &landed),
        _ => format!("{update} RETURNING {landed}"),
    };
    let query = crate::sql::query_as(&sql)
        .bind(job_id)
        .bind(fence.token)
        .bind(now)
        .bind(fence.sequence);
    let query = match change {
        Transition::Checkpoint { checkpoint, .. } => query.bind(Json(checkpoint)),
        Transition::Park {
            step,
            timers,
            signals,
            children,
            replies,
            wakes_at,
        } => query
            .bind(step)
            .bind(timers.as_ref().map(Json))
            .bind(signals)
            .bind(children)
            .bind(replies.entries().map(Json))
            .bind(&replies.steps)
            .bind(replies.deadline)
            .bind(*wakes_at),
        Transition::BeginCompensation { failure } => query.bind(Json(failure)),
        Transition::KeepTimers { timers } => query.bind(Json(timers)),
        Transition::Compensated { checkpoint } => query.bind(Json(checkpoint)),
        Transition::Sleep {
            timers, wakes_at, ..
        } => query.bind(Json(timers)).bind(*wakes_at),
        Transition::Complete { result, verdict } => query.bind(Json(result)).bind(verdict),
        Transition::CheckpointAndComplete {
            checkpoint,
            result,
            verdict,
            ..
        } => query
            .bind(Json(checkpoint))
            .bind(Json(result))
            .bind(verdict),
        Transition::Fail { error, verdict } => query.bind(error).bind(verdict),
        Transition::Dead { error } => query.bind(error),
        Transition::Cancel { reason } => query.bind(reason),
        Transition::Requeue {
            error,
            run_after,
            step,
        } => query.bind(error).bind(*run_after).bind(step),
        Transition::Release {
            reason,
            run_after,
            since,
        } => query.bind(reason).bind(*run_after).bind(*since),
        Transition::Hold { reason, run_after } => query.bind(reason).bind(*run_after),
        Transition::Yield { reason } => query.bind(reason),
        Transition::HandBack {
            reason,
            now,
            backoff,
        } => query
            .bind(reason)
            .bind(*now)
            .bind(i64::try_from(backoff.as_millis()).unwrap_or(i64::MAX)),
    };
    let landed: Option<Landed> = query.fetch_optional(&mut **tx).await?;
    let Some(Landed {
        stamp,
        status,
        error,
    }) = landed
    else {
        return Ok(Written::Lost);
    };
    // Cancelled instead of where the segment meant the job to go.
    let instead = (change.leaves_running() && status == crate::RunStatus::Cancelled).then(|| {
        EventKind::Cancelled {
            reason: error.unwrap_or_default(),
        }
    });
    // The pair's checkpoint takes the sequence before the completion's;
    // both rows go in one statement.
    let checkpointed = match change {
        Transition::CheckpointAndComplete { checkpoint, .. } => Some((
            EventStamp {
                event_sequence: stamp.event_sequence - 1,
                ..stamp.clone()
            },
            EventKind::StepCheckpoint {
                step: checkpoint.name.clone(),
                note: checkpoint.note(),
            },
        )),
        _ => None,
    };
    let mut events = Vec::with_capacity(2);
    if let Some((before, kind)) = &checkpointed {
        events.push((before, kind.clone()));
    }
    let cancelled = instead.is_some();
    // A park that found its answer there already queued the job: no wait
    // to tell of (its statement took no sequence for one).
    let woken = matches!(change, Transition::Park { .. }) && status == crate::RunStatus::Queued;
    if let Some(kind) = instead.or_else(|| change.event()).filter(|_| !woken) {
        events.push((&stamp, kind));
    }
    if !events.is_empty() {
        outbox::insert_many(tx, events, now).await?;
    }
    if cancelled {
        // Its requests are not sent: the job will not wait for them.
        return Ok(Written::Cancelled);
    }
    if let Transition::Park { replies, .. } = change {
        crate::runs::step_requests::insert_outgoing(tx, job_id, &replies.sending).await?;
    }
    Ok(Written::Done)
}

/// Locks the rows of `jobs` that no other session holds, in job-id order,
/// and returns those another session holds (an operator's open `SELECT …
/// FOR UPDATE`): the fenced writes to them are not tried in this
/// transaction. A job without a row is not among them (its write finds no
/// row, as a lost lease does).
///
/// # Errors
/// Database errors.
pub async fn held_elsewhere(
    tx: &mut PgTransaction<'_>,
    jobs: &[Uuid],
) -> Result<std::collections::HashSet<Uuid>, sqlx::Error> {
    let locked: Vec<Uuid> = crate::sql::query_scalar(
        "SELECT job_id FROM workflow_run WHERE job_id = ANY($1)
         ORDER BY job_id FOR UPDATE SKIP LOCKED",
    )
    .bind(jobs)
    .fetch_all(&mut **tx)
    .await?;
    let skipped: Vec<Uuid> = jobs
        .iter()
        .filter(|j| !locked.contains(j))
        .copied()
        .collect();
    if skipped.is_empty() {
        return Ok(std::collections::HashSet::new());
    }
    let existing: Vec<Uuid> =
        crate::sql::query_scalar("SELECT job_id FROM workflow_run WHERE job_id = ANY($1)")
            .bind(&skipped)
            .fetch_all(&mut **tx)
            .await?;
    Ok(existing.into_iter().collect())
}
