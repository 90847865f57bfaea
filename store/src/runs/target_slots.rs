//! The slots of capped Kafka targets (`workflow_target_slot`): a request
//! awaiting its reply holds one of its target's. A segment takes the slot
//! before its park sends the request ([`take`]); the reply's transaction
//! gives it back ([`release_in`]); a slot past its deadline, or whose job
//! ended, no longer counts and is deleted by the next [`take`] of its
//! target. Takes of one target are serialised by an advisory lock held for
//! their short transaction, so the count a take reads is the count it
//! leaves.

use chrono::{DateTime, Utc};
use sqlx::{PgPool, PgTransaction};
use uuid::Uuid;

/// What a take came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// The slot is the step's until `expires_at` (or until its reply).
    Taken,
    /// All `cap` slots are held by other requests.
    Full,
}

/// Who asks for a slot, for which request, and until when it is needed.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    pub target: &'a str,
    pub job_id: Uuid,
    pub step: &'a str,
    /// The request's correlation id: its reply gives the slot back.
    pub correlation_id: Uuid,
    /// The request's deadline: past it the slot frees itself.
    pub expires_at: DateTime<Utc>,
}

/// Takes a slot of `claim.target` for `claim.step` of `claim.job_id` when
/// fewer than `cap` other jobs hold one at `now`. A job's own slots never
/// block it (its parallel requests to one target count as one job, so a
/// job waiting for a second slot can never wait on itself); the step's own
/// slot (an earlier attempt's, or a take whose park did not commit) is
/// taken over, not counted twice.
///
/// # Errors
/// Database errors (the transaction is rolled back first).
pub async fn take(
    pool: &PgPool,
    claim: Claim<'_>,
    cap: usize,
    now: DateTime<Utc>,
) -> Result<Take, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let take = take_in(&mut tx, claim, cap, now).await;
    crate::sql::end_transaction(tx, take).await
}

async fn take_in(
    tx: &mut PgTransaction<'_>,
    claim: Claim<'_>,
    cap: usize,
    now: DateTime<Utc>,
) -> Result<Take, sqlx::Error> {
    crate::sql::query(
        "SELECT pg_advisory_xact_lock(hashtextextended('flotilla.target-slot:' || $1, 0))",
    )
    .bind(claim.target)
    .execute(&mut **tx)
    .await?;
    crate::sql::query(
        "DELETE FROM workflow_target_slot s
         WHERE s.target = $1
           AND (s.expires_at <= $2
                OR NOT EXISTS (SELECT 1 FROM workflow_run r
                               WHERE r.job_id = s.job_id
                                 AND r.status IN ('QUEUED', 'RUNNING', 'WAITING')))",
    )
    .bind(claim.target)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    let held: i64 = crate::sql::query_scalar(
        "SELECT count(DISTINCT job_id) FROM workflow_target_slot
         WHERE target = $1 AND job_id <> $2",
    )
    .bind(claim.target)
    .bind(claim.job_id)
    .fetch_one(&mut **tx)
    .await?;
    if usize::try_from(held).unwrap_or(usize::MAX) >= cap {
        return Ok(Take::Full);
    }
    crate::sql::query(
        "INSERT INTO workflow_target_slot (target, job_id, step_name, correlation_id, expires_at)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (job_id, step_name)
         DO UPDATE SET target = excluded.target, correlation_id = excluded.correlation_id,
                       expires_at = excluded.expires_at",
    )
    .bind(claim.target)
    .bind(claim.job_id)
    .bind(claim.step)
    .bind(claim.correlation_id)
    .bind(claim.expires_at)
    .execute(&mut **tx)
    .await?;
    Ok(Take::Taken)
}

/// Gives back the slot of the request `correlation_id` (of `step` of
/// `job_id`), if it holds one, in `tx` (the transaction that records its
/// reply).
///
/// # Errors
/// Database errors.
pub async fn release_in(
    tx: &mut PgTransaction<'_>,
    job_id: Uuid,
    step: &str,
    correlation_id: Uuid,
) -> Result<(), sqlx::Error> {
    crate::sql::query(
        "DELETE FROM workflow_target_slot
         WHERE job_id = $1 AND step_name = $2 AND correlation_id = $3",
    )
    .bind(job_id)
    .bind(step)
    .bind(correlation_id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// How many jobs hold slots of `target` at `now`.
///
/// # Errors
/// Database errors.
pub async fn held(pool: &PgPool, target: &str, now: DateTime<Utc>) -> Result<i64, sqlx::Error> {
    crate::sql::session(pool, async |conn| {
        crate::sql::query_scalar(
            "SELECT count(DISTINCT s.job_id) FROM workflow_target_slot s
             WHERE s.target = $1 AND s.expires_at > $2
               AND EXISTS (SELECT 1 FROM workflow_run r
                           WHERE r.job_id = s.job_id
                             AND r.status IN ('QUEUED', 'RUNNING', 'WAITING'))",
        )
        .bind(target)
        .bind(now)
        .fetch_one(conn)
        .await
    })
    .await
}
