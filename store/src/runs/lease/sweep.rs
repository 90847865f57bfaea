//! Lapsed leases: finding them, settling each (queued again, DEAD, or
//! CANCELLED when a cancel was asked), a shutdown's hand-back of what it
//! still holds, and putting off a row the sweep cannot settle.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgTransaction};
use uuid::Uuid;

use crate::StoreError;
use crate::outbox::{self, EventKind, EventStamp};
use crate::runs::STAMP;

/// What sweeping one lapsed lease did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swept {
    /// Back in the queue, its attempt given back.
    Requeued,
    /// It lost its worker `max_lease_losses` times in a row: DEAD, with its event.
    Dead,
    /// As `Dead`, but its workflow has `on_failure` steps and none have run
    /// yet: queued to run them, headed DEAD (the row's `compensation`, no
    /// event), with a fresh count of lapses. A compensation that loses its
    /// workers as often ends DEAD without a second round.
    Compensating,
    /// A cancellation was asked while it ran and its worker is gone:
    /// CANCELLED with the reason, with its event.
    Cancelled,
}

/// A lapsed lease as the sweep reads it: attempt, lapses in a row, owner,
/// whether the owner is `alive`, `gone` or `unknown`, a cancellation
/// asked of the job, and whether it would compensate before ending (its
/// workflow has `on_failure` steps and no compensation has begun).
#[derive(sqlx::FromRow)]
struct LapsedRow(i32, i32, Option<String>, String, Option<String>, bool);

/// A lapsed lease that was settled: what happened, and during which attempt
/// the lease lapsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweptLease {
    pub outcome: Swept,
    /// The attempt the lost worker was running (given back when requeued).
    pub attempt: i32,
    /// Lapses in a row, this one included if it was counted.
    pub lease_losses: i32,
    /// Whether this lapse counted against the job (its owner was gone).
    pub counted: bool,
}

/// A RUNNING job whose lease lapsed, with what the sweeper's span and
/// counters need before it is settled (its trace, its workflow, its age).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Lapsed {
    pub job_id: Uuid,
    pub workflow_name: String,
    /// The stored workflow's version; `None` for an inline definition.
    pub workflow_version: Option<i32>,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// Up to `limit` RUNNING jobs whose lease passed before `now`, oldest first.
///
/// # Errors
/// Database errors.
pub async fn lapsed(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<Lapsed>, sqlx::Error> {
    crate::sql::query_as(
        "SELECT job_id, workflow_name, workflow_version, traceparent, tracestate, created_at FROM workflow_run
         WHERE status = 'RUNNING' AND lease_until < $1
         ORDER BY lease_until LIMIT $2",
    )
    .bind(now)
    .bind(limit)
    .fetch_all(conn)
    .await
}

/// How the sweeper judges a lapsed lease.
#[derive(Debug, Clone, Copy)]
pub struct SweepPolicy {
    /// Lapses in a row, counted only when the owner is gone, that send a job DEAD.
    pub max_lease_losses: i32,
    /// A worker whose `worker_member` row is older than this is gone.
    pub owner_stale_after: std::time::Duration,
    /// How long a lapse waits for a word from an owner whose row is fresh
    /// but who has not announced itself since its lease lapsed (about two
    /// of its announcements).
    pub owner_grace: std::time::Duration,
    /// A lapsed job waits `backoff_base × 2^(losses−1)` before it can be
    /// claimed again (at least one base), so a job that kills its workers
    /// does not take the next one down at once.
    pub backoff_base: std::time::Duration,
}

/// Settles one lapsed lease. A lapse is not a failure of the work: the job
/// goes back to the queue with its attempt given back, after a backoff.
/// Whether the lapse counts against the job depends on its owner:
/// - alive: it announced itself (`worker_member`) after its lease lapsed,
///   so it could not renew for a reason of the world (the database
///   blinked): requeued, not counted;
/// - gone: no row, a row older than `owner_stale_after`, or a worker that
///   started again after it last touched the job: counted;
/// - not known yet: a fresh row, but no announcement since the lapse (it
///   died a moment ago, or it is alive and about to announce): the lease
///   is moved `owner_grace` on and the job is looked at again then.
///
/// The `max_lease_losses`-th counted lapse in a row sends it DEAD (with its
/// event) instead. `None` when the job is not settled now (no longer
/// lapsed, someone else holds its row lock, or its owner is not known yet).
///
/// # Errors
/// Database errors; an event the contract refuses.
pub async fn sweep_one(
    tx: &mut PgTransaction<'_>,
    job_id: Uuid,
    now: DateTime<Utc>,
    policy: SweepPolicy,
) -> Result<Option<SweptLease>, StoreError> {
    let stale_ms = i64::try_from(policy.owner_stale_after.as_millis()).unwrap_or(i64::MAX);
    // Worker clocks agree with the database's to well within a lease
    // (docs/architecture.md), so `lease_until` and `last_seen` compare.
    let lapsed: Option<LapsedRow> = crate::sql::query_as(
        "SELECT r.attempt, r.lease_losses, r.lease_owner,
                CASE WHEN m.worker_id IS NULL OR m.started_at > r.updated_at THEN 'gone'
                     WHEN m.last_seen >= r.lease_until THEN 'alive'
                     WHEN m.last_seen > now() - $3 * interval '1 millisecond' THEN 'unknown'
                     ELSE 'gone' END,
                r.cancel_requested,
                r.compensation IS NULL AND coalesce((
                    SELECT jsonb_typeof(d -> 'on_failure') = 'array' AND d -> 'on_failure' <> '[]'::jsonb
                    FROM coalesce(r.definition, (SELECT w.definition FROM workflow_definition w
                        WHERE w.name = r.workflow_name AND w.version = r.workflow_version)) AS d), false)
         FROM workflow_run r LEFT JOIN worker_member m ON m.worker_id = r.lease_owner
         WHERE r.job_id = $1 AND r.status = 'RUNNING' AND r.lease_until < $2
         FOR UPDATE OF r SKIP LOCKED",
    )
    .bind(job_id)
    .bind(now)
    .bind(stale_ms)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(LapsedRow(attempt, losses, owner, state, cancel_asked, compensable)) = lapsed else {
        return Ok(None);
    };
    if state == "unknown" {
        let wait = chrono::Duration::from_std(policy.owner_grace).unwrap_or(chrono::Duration::MAX);
        crate::sql::query("UPDATE workflow_run SET lease_until = $2 WHERE job_id = $1")
            .bind(job_id)
            .bind(now + wait)
            .execute(&mut **tx)
            .await?;
        return Ok(None);
    }
    let owner_alive = state == "alive";
    if let Some(reason) = cancel_asked {
        // Cancelled as asked: nobody holds the job to do it.
        let stamp: EventStamp = crate::sql::query_as(&format!(
            "UPDATE workflow_run SET status = 'CANCELLED', error = $3, outstanding_step = NULL,
                 event_sequence = event_sequence + 1, lease_owner = NULL, lease_token = NULL,
                 lease_until = NULL, updated_at = $2
             WHERE job_id = $1 RETURNING {STAMP}"
        ))
        .bind(job_id)
        .bind(now)
        .bind(&reason)
        .fetch_one(&mut **tx)
        .await?;
        outbox::insert(tx, &stamp, EventKind::Cancelled { reason }, now).await?;
        return Ok(Some(SweptLease {
            outcome: Swept::Cancelled,
            attempt,
            lease_losses: losses,
            counted: false,
        }));
    }
    let owner = owner.as_deref().unwrap_or("?");
    let losses = if owner_alive { losses } else { losses + 1 };
    let dead = losses >= policy.max_lease_losses;
    let exponent = u32::try_from(losses.clamp(1, 20) - 1).unwrap_or(0);
    let backoff = policy.backoff_base.saturating_mul(1u32 << exponent);
    let run_after = now + chrono::Duration::from_std(backoff).unwrap_or(chrono::Duration::MAX);
    let compensating = dead && compensable;
    let (set, error) = if dead {
        let error = format!(
            "lost its worker {losses} times in a row (the last, {owner}, stopped renewing its lease during attempt {attempt}); \
             a job that stops its worker every time is not tried again"
        );
        let set = if compensating {
            // Headed DEAD as a retryable failure on the last attempt would
            // be (`compensate.rs`), run by the next claim.
            "status = 'QUEUED', run_after = $5, attempt = greatest(attempt - 1, 0), hand_backs = 0,
             compensation = jsonb_build_object('failure', jsonb_build_object(
                 'step', NULL, 'error', $3::text, 'dead', true), 'done', '[]'::jsonb)"
        } else {
            "status = 'DEAD', event_sequence = event_sequence + 1"
        };
        (set, error)
    } else if owner_alive {
        (
            "status = 'QUEUED', run_after = $5, attempt = greatest(attempt - 1, 0)",
            format!(
                "lease expired: worker {owner} is alive but could not renew during attempt {attempt}; \
                 requeued without spending the attempt or counting a lapse"
            ),
        )
    } else {
        (
            "status = 'QUEUED', run_after = $5, attempt = greatest(attempt - 1, 0)",
            format!(
                "lease expired: worker {owner} stopped renewing during attempt {attempt}; \
                 requeued without spending the attempt ({losses} lapse(s) in a row)"
            ),
        )
    };
    let stamp: EventStamp = crate::sql::query_as(&format!(
        "UPDATE workflow_run SET {set}, error = $3, lease_losses = $4, lease_owner = NULL,
             lease_token = NULL, lease_until = NULL, updated_at = $2
         WHERE job_id = $1 RETURNING {STAMP}"
    ))
    .bind(job_id)
    .bind(now)
    .bind(&error)
    .bind(if compensating { 0 } else { losses })
    .bind(run_after)
    .fetch_one(&mut **tx)
    .await?;
    let outcome = if compensating {
        Swept::Compensating
    } else if dead {
        outbox::insert(tx, &stamp, EventKind::Dead { error }, now).await?;
        Swept::Dead
    } else {
        Swept::Requeued
    };
    Ok(Some(SweptLease {
        outcome,
        attempt,
        lease_losses: losses,
        counted: !owner_alive,
    }))
}

/// Hands every `(job, token)` of `leases` still RUNNING under that token
/// back to the queue in one statement: no attempt spent, no lapse counted,
/// no event. A worker at the end of its shutdown grace gives back the jobs
/// it could not finish. Returns how many were handed back.
///
/// # Errors
/// Database errors.
pub async fn hand_back_all(
    conn: &mut PgConnection,
    leases: &[(Uuid, Uuid)],
    now: DateTime<Utc>,
    reason: &str,
) -> Result<u64, sqlx::Error> {
    let (jobs, tokens): (Vec<Uuid>, Vec<Uuid>) = leases.iter().copied().unzip();
    // Rows are locked in job-id order, as group commit locks them, so the
    // two never wait on each other in a cycle.
    let done = crate::sql::query(
        "WITH held AS (
             SELECT r.job_id FROM workflow_run r
             JOIN unnest($1::uuid[], $2::uuid[]) AS h(job_id, token)
               ON r.job_id = h.job_id AND r.lease_token = h.token
             WHERE r.status = 'RUNNING'
             ORDER BY r.job_id
             FOR UPDATE OF r)
         UPDATE workflow_run r SET status = 'QUEUED', error = $4, run_after = $3,
             attempt = greatest(attempt - 1, 0), lease_owner = NULL, lease_token = NULL,
             lease_until = NULL, updated_at = $3
         FROM held WHERE r.job_id = held.job_id",
    )
    .bind(&jobs)
    .bind(&tokens)
    .bind(now)
    .bind(reason)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// Moves a lapsed lease that could not be swept to `until`, behind the
/// others, so one row the sweeper cannot settle never holds the rest back.
///
/// # Errors
/// Database errors.
pub async fn defer_sweep(
    conn: &mut PgConnection,
    job_id: Uuid,
    until: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    crate::sql::query(
        "UPDATE workflow_run SET lease_until = $2
         WHERE job_id = $1 AND status = 'RUNNING' AND lease_until < $2",
    )
    .bind(job_id)
    .bind(until)
    .execute(conn)
    .await?;
    Ok(())
}
