//! Concurrency keys: a workflow's `concurrency: {key, limit}` lets at most
//! `limit` jobs of one key hold a slot at once. A job takes its slot when
//! its first segment begins ([`enter`]) and keeps it until it ends, through
//! its waits and retries; a job that finds every slot held goes back to the
//! queue, its attempt given back, and is woken when a holder ends
//! ([`wake`], [`keys_to_wake`]). Within a key slots go in order of arrival: a
//! job does not take a slot while an older job of its key waits for one.
//!
//! Every take, hold and wake of a key runs under one advisory lock on the
//! key, held for its short transaction, so a holder that ends while a job
//! is being held cannot miss it: either the hold sees the slot free, or the
//! wake sees the held job.

use chrono::{DateTime, Utc};
use sqlx::{PgPool, PgTransaction};
use uuid::Uuid;

use super::lease::{Fence, Transition, Written, transition};
use super::{RunStatus, idle};
use crate::StoreError;

/// The statuses of a job that has not ended: its slot, if it holds one, is taken.
const ACTIVE: &str = "status IN ('QUEUED', 'RUNNING', 'WAITING')";

/// A claimed job asking for a slot of its key.
#[derive(Debug, Clone, Copy)]
pub struct Entrant<'a> {
    pub job_id: Uuid,
    /// When the job was accepted: its place in its key's line.
    pub created_at: DateTime<Utc>,
    pub fence: Fence,
    pub key: &'a str,
    pub limit: i32,
}

/// What asking for a slot came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// The slot is the job's until it ends.
    Entered,
    /// Every slot is held, or older jobs of the key wait for the free
    /// ones: the job went back to the queue with this reason.
    Held(String),
    /// Someone asked to cancel the job while it was claimed: it was
    /// written CANCELLED instead of held.
    Cancelled,
    /// The lease is gone; nothing was written.
    Lost,
}

/// Takes a slot of `entrant.key` for `entrant.job_id` when fewer than
/// `limit` other jobs of the key hold one and no older job of the key is
/// waiting for those free; otherwise writes the job back to the queue
/// (attempt given back, no event), eligible again at `hold_until` or
/// sooner when a slot frees.
///
/// # Errors
/// Database errors (the transaction is rolled back).
pub async fn enter(
    pool: &PgPool,
    entrant: Entrant<'_>,
    now: DateTime<Utc>,
    hold_until: DateTime<Utc>,
) -> Result<Entry, StoreError> {
    let mut tx = pool.begin().await?;
    let entry = enter_in(&mut tx, entrant, now, hold_until).await;
    crate::sql::end_transaction(tx, entry).await
}

async fn enter_in(
    tx: &mut PgTransaction<'_>,
    entrant: Entrant<'_>,
    now: DateTime<Utc>,
    hold_until: DateTime<Utc>,
) -> Result<Entry, StoreError> {
    lock(tx, entrant.key).await?;
    let (holders, ahead): (i64, i64) = crate::sql::query_as(&format!(
        "SELECT count(*) FILTER (WHERE holds_slot),
                count(*) FILTER (WHERE NOT holds_slot AND status = 'QUEUED'
                                   AND (created_at, job_id) < ($3, $2))
         FROM workflow_run
         WHERE concurrency_key = $1 AND job_id <> $2 AND {ACTIVE}"
    ))
    .bind(entrant.key)
    .bind(entrant.job_id)
    .bind(entrant.created_at)
    .fetch_one(&mut **tx)
    .await?;
    let limit = i64::from(entrant.limit.max(1));
    let free = (limit - holders).max(0);
    if ahead < free {
        let taken = crate::sql::query(
            "UPDATE workflow_run
             SET holds_slot = true,
                 error = CASE WHEN starts_with(error, $3) THEN NULL ELSE error END
             WHERE job_id = $1 AND lease_token = $2 AND status = 'RUNNING'",
        )
        .bind(entrant.job_id)
        .bind(entrant.fence.token)
        .bind(HELD)
        .execute(&mut **tx)
        .await?;
        return Ok(if taken.rows_affected() == 1 {
            Entry::Entered
        } else {
            Entry::Lost
        });
    }
    let reason = if free == 0 {
        format!(
            "{HELD} {}: {holders} of {limit} slots taken; woken when one is given back",
            entrant.key
        )
    } else {
        format!(
            "{HELD} {}: {ahead} older job(s) of the key wait for its {free} free slot(s)",
            entrant.key
        )
    };
    let hold = Transition::Hold {
        reason: reason.clone(),
        run_after: hold_until,
    };
    let entry = match transition(tx, entrant.job_id, entrant.fence, now, &hold).await? {
        Written::Done => Entry::Held(reason),
        Written::Cancelled => Entry::Cancelled,
        Written::Lost => Entry::Lost,
    };
    // The free slots are for the older jobs: wake the held ones now (not
    // this one, nor a younger one).
    if free > 0 {
        let older = (entrant.created_at, entrant.job_id);
        wake_in(tx, entrant.key, free, now, Some(older)).await?;
    }
    Ok(entry)
}

/// Wakes as many of `key`'s waiting jobs as it has free slots, oldest
/// first (their `run_after` brought to `now`). Returns how many.
///
/// # Errors
/// Database errors.
pub async fn wake(pool: &PgPool, key: &str, now: DateTime<Utc>) -> Result<u64, StoreError> {
    let mut tx = pool.begin().await?;
    let woken = async {
        lock(&mut tx, key).await?;
        let free: i64 = crate::sql::query_scalar(&format!(
            "SELECT greatest(coalesce(max(concurrency_limit), 0)
                             - count(*) FILTER (WHERE holds_slot), 0)
             FROM workflow_run WHERE concurrency_key = $1 AND {ACTIVE}"
        ))
        .bind(key)
        .fetch_one(&mut *tx)
        .await?;
        if free == 0 {
            return Ok(0);
        }
        wake_in(&mut tx, key, free, now, None).await
    }
    .await;
    crate::sql::end_transaction(tx, woken).await
}

/// The keys (at most `batch`) with a job waiting for a slot that is free:
/// a holder ended without waking it (cancelled while QUEUED or WAITING,
/// settled by an operator, its worker gone before the wake).
///
/// # Errors
/// Database errors.
pub async fn keys_to_wake(
    pool: &PgPool,
    now: DateTime<Utc>,
    batch: i64,
) -> Result<Vec<String>, StoreError> {
    let keys = crate::sql::session(pool, async |conn| {
        crate::sql::query_scalar(&format!(
            "SELECT w.concurrency_key FROM workflow_run w
             WHERE w.concurrency_key IS NOT NULL AND w.status = 'QUEUED'
               AND NOT w.holds_slot AND w.run_after > $1 AND starts_with(w.error, $3)
             GROUP BY w.concurrency_key
             HAVING (SELECT count(*) FROM workflow_run h
                     WHERE h.concurrency_key = w.concurrency_key AND h.holds_slot AND h.{ACTIVE})
                    < max(w.concurrency_limit)
             ORDER BY min(w.created_at)
             LIMIT $2"
        ))
        .bind(now)
        .bind(batch)
        .bind(HELD)
        .fetch_all(conn)
        .await
    })
    .await?;
    Ok(keys)
}

/// After new rows were inserted (`batch`, every new row in order): for each
/// of `arrivals` (in order) whose key then had more than `limit` jobs that
/// had not ended (the rows after it in the batch not counted yet: they
/// arrived later), cancels the newest (the arrival itself) or the oldest
/// (QUEUED and WAITING ones at once, with their events; a RUNNING one is
/// asked to cancel, as an operator would), oldest by acceptance and then
/// by place in the batch. The keys are locked first, in order, so two
/// batches never wait on each other. Returns the jobs cancelled or asked to.
///
/// # Errors
/// Database errors; an event the contract refuses.
pub async fn cancel_excess(
    tx: &mut PgTransaction<'_>,
    arrivals: &[Arrival<'_>],
    batch: &[Uuid],
    now: DateTime<Utc>,
) -> Result<Vec<Uuid>, StoreError> {
    let mut keys: Vec<&str> = arrivals.iter().map(|arrival| arrival.key).collect();
    keys.sort_unstable();
    keys.dedup();
    for key in keys {
        lock(tx, key).await?;
    }
    let mut cancelled = Vec::new();
    for arrival in arrivals {
        let later = batch
            .iter()
            .position(|job| *job == arrival.job_id)
            .map_or(&[][..], |at| &batch[at + 1..]);
        let active: Vec<(Uuid, RunStatus)> = crate::sql::query_as(&format!(
            "SELECT job_id, status FROM workflow_run
             WHERE concurrency_key = $1 AND {ACTIVE} AND job_id <> ALL($2)
             ORDER BY created_at, array_position($3, job_id) NULLS FIRST, job_id"
        ))
        .bind(arrival.key)
        .bind(later)
        .bind(batch)
        .fetch_all(&mut **tx)
        .await?;
        let limit = usize::try_from(arrival.limit.max(1)).unwrap_or(1);
        let Some(excess) = active.len().checked_sub(limit).filter(|n| *n > 0) else {
            continue;
        };
        let victims: Vec<(Uuid, RunStatus)> = if arrival.cancel_oldest {
            active
                .into_iter()
                .filter(|(job, _)| *job != arrival.job_id)
                .take(excess)
                .collect()
        } else {
            active
                .into_iter()
                .filter(|(job, _)| *job == arrival.job_id)
                .collect()
        };
        let reason = format!(
            "cancelled by its concurrency key {}: job {} arrived with {} jobs of the key not ended (limit {limit}, on_excess {})",
            arrival.key,
            arrival.job_id,
            limit + excess,
            if arrival.cancel_oldest {
                "cancel_oldest"
            } else {
                "cancel_newest"
            }
        );
        for (job_id, status) in victims {
            let done = if status == RunStatus::Running {
                super::lease::request_cancel(tx, job_id, &reason)
                    .await?
                    .is_some()
            } else {
                idle::settle_idle(
                    tx,
                    job_id,
                    idle::IdleSettle::Cancel { reason: &reason },
                    now,
                )
                .await?
            };
            if done {
                cancelled.push(job_id);
            }
        }
    }
    Ok(cancelled)
}

/// A new job of a key whose policy cancels past the limit.
#[derive(Debug, Clone, Copy)]
pub struct Arrival<'a> {
    pub job_id: Uuid,
    pub key: &'a str,
    pub limit: i32,
    /// `true`: the oldest jobs of the key give way; `false`: the arrival does.
    pub cancel_oldest: bool,
}

/// How a held job's `error` begins: the wake finds held jobs by it, and
/// leaves alone a job of the key waiting for another reason (a debounce
/// window).
pub const HELD: &str = "held by its concurrency key";

/// Wakes up to `free` of `key`'s held jobs, oldest first, in `tx`; with
/// `older_than`, only jobs accepted before that (instant, job).
async fn wake_in(
    tx: &mut PgTransaction<'_>,
    key: &str,
    free: i64,
    now: DateTime<Utc>,
    older_than: Option<(DateTime<Utc>, Uuid)>,
) -> Result<u64, StoreError> {
    let woken = crate::sql::query(
        "UPDATE workflow_run SET run_after = $3
         WHERE job_id IN (SELECT job_id FROM workflow_run
                          WHERE concurrency_key = $1 AND status = 'QUEUED' AND NOT holds_slot
                            AND starts_with(error, $4)
                            AND ($5::timestamptz IS NULL OR (created_at, job_id) < ($5, $6))
                          ORDER BY created_at, job_id LIMIT $2)
           AND run_after > $3",
    )
    .bind(key)
    .bind(free)
    .bind(now)
    .bind(HELD)
    .bind(older_than.map(|(at, _)| at))
    .bind(older_than.map(|(_, job)| job))
    .execute(&mut **tx)
    .await?;
    Ok(woken.rows_affected())
}

/// The key's advisory lock, until the transaction ends.
async fn lock(tx: &mut PgTransaction<'_>, key: &str) -> Result<(), StoreError> {
    crate::sql::query(
        "SELECT pg_advisory_xact_lock(hashtextextended('flotilla.concurrency:' || $1, 0))",
    )
    .bind(key)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
