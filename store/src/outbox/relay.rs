//! The relay's statements on the outbox: pending rows of its buckets,
//! marking, failure backoff, retention and the operator's replay.

use chrono::{DateTime, Utc};
use flotilla_contracts::{DecodeError, WorkflowRunEvent};
use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

/// An outbox row's key: its job and its place in the job's events. The
/// relay's writes reach a row by it (the table has no other key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventKey {
    pub job_id: Uuid,
    pub sequence: i64,
}

/// A PENDING row as the relay publishes it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PendingEvent {
    pub event_id: Uuid,
    pub job_id: Uuid,
    pub sequence: i64,
    pub event_type: String,
    /// The row's bucket (of job ids), which a relay must hold to publish it.
    pub bucket: i16,
    /// The stored event as its JSON text, decoded only when sent ([`PendingEvent::event`]):
    /// one row a newer or broken writer left must not fail the whole read.
    /// The whole event, from a writer before compact bodies.
    pub payload: Option<Json<Box<serde_json::value::RawValue>>>,
    /// The event without what the columns hold ([`super::stored`]).
    pub body: Option<Json<Box<serde_json::value::RawValue>>>,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    pub attempts: i32,
}

/// The statement under [`publishable`]: `$1` the buckets, `$2` the most
/// rows read per bucket, `$3` in all. Public so tests can look at its plan.
pub const PENDING_IN_ID_ORDER: &str =
    "SELECT pending.* FROM unnest($1::smallint[]) AS owned(bucket)
         CROSS JOIN LATERAL (
             SELECT o.event_id, o.job_id, o.sequence, o.event_type, o.bucket, o.payload, o.body,
                    o.traceparent, o.tracestate, o.attempts, o.next_attempt_at
             FROM workflow_run_outbox o
             WHERE o.status = 'PENDING' AND o.bucket = owned.bucket
             ORDER BY o.id
             LIMIT $2) pending
         LIMIT $3";

impl PendingEvent {
    /// The row's key.
    #[must_use]
    pub fn key(&self) -> EventKey {
        EventKey {
            job_id: self.job_id,
            sequence: self.sequence,
        }
    }

    /// The row's event, decoded and checked as the contract's message.
    ///
    /// # Errors
    /// The stored event does not decode.
    pub fn event(&self) -> Result<WorkflowRunEvent, DecodeError> {
        let columns = super::stored::Columns {
            event_id: self.event_id,
            job_id: self.job_id,
            sequence: self.sequence,
            event_type: &self.event_type,
        };
        super::stored::event(
            self.payload.as_ref().map(|p| p.0.get()),
            self.body.as_ref().map(|b| b.0.get()),
            columns,
        )
    }
}

#[derive(sqlx::FromRow)]
struct PendingRow {
    #[sqlx(flatten)]
    event: PendingEvent,
    next_attempt_at: DateTime<Utc>,
}

/// What one read of pending rows found.
#[derive(Debug, Default)]
pub struct Heads {
    /// The head of each job, at most the limit asked for.
    pub rows: Vec<PendingEvent>,
    /// The read stopped at its row cap: more may be waiting right now.
    pub truncated: bool,
}

/// The head of each job in `buckets`, up to `limit`: per job, its oldest
/// PENDING row, when it is due. A job's next row is never among them while
/// an earlier one is PENDING (being sent, awaiting its acknowledgement or
/// backing off), so a relay that sends only what this returns, and reads a
/// bucket again only after marking what it sent, has at most one event of
/// a job in flight and cannot put a later one ahead of it. FAILED rows do
/// not hold later ones back.
///
/// The statement is one ordered scan of the `(bucket, id)` index of PENDING
/// rows per bucket (at most `limit` rows each, a quarter more than `limit` in all), in the
/// order given (callers rotate it, so no bucket starves), and nothing else:
/// no join, no probe per row, so no plan can make it read the backlog
/// behind what it returns or the published history, even on a table the
/// planner has no statistics for yet. The heads are picked here: within a
/// job, ids grow with the sequence, so the first PENDING row of a job in id
/// order is its oldest.
///
/// # Errors
/// Database errors.
pub async fn publishable(
    conn: &mut PgConnection,
    buckets: &[i16],
    now: DateTime<Utc>,
    limit: i64,
) -> Result<Heads, sqlx::Error> {
    // Later rows of a job come along and are dropped: read a quarter more
    // than the heads wanted. Where a job has many rows waiting the read
    // ends early and says so (`truncated`), and the caller reads again at
    // once; every row read costs its payload's decoding, so reading four
    // times what is sent made the read the relay's largest cost.
    let cap = limit.saturating_add(limit / 4).max(limit.saturating_add(1));
    let mut tx = sqlx::Connection::begin(conn).await?;
    prefer_indexes(&mut tx).await?;
    let rows: Vec<PendingRow> = crate::sql::query_as(PENDING_IN_ID_ORDER)
        .bind(buckets)
        .bind(limit)
        .bind(cap)
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    let truncated = i64::try_from(rows.len()).unwrap_or(i64::MAX) >= cap;
    let limit = usize::try_from(limit).unwrap_or(0);
    let mut seen = std::collections::HashSet::with_capacity(rows.len());
    let mut heads = Vec::with_capacity(limit.min(rows.len()));
    for row in rows {
        if heads.len() >= limit {
            return Ok(Heads {
                rows: heads,
                truncated: true,
            });
        }
        // The first row of a job is its head; a head still backing off
        // holds the job's later rows back with it.
        if seen.insert(row.event.job_id) && row.next_attempt_at <= now {
            heads.push(row.event);
        }
    }
    Ok(Heads {
        rows: heads,
        truncated,
    })
}

/// Tells the planner, for the rest of the transaction on `conn`, to reach
/// the outbox through its indexes. Every relay statement is built on one
/// (the PENDING rows by bucket, the rows' key), but on a table whose
/// statistics lag behind its size (a fresh database, the first minute of a
/// burst, before autovacuum analyzes it) the planner takes the indexes for
/// empty and may scan the whole outbox instead: a mark of 500 rows took
/// 150 ms instead of 7 with 100,000 rows in the table.
///
/// # Errors
/// Database errors.
pub async fn prefer_indexes(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    crate::sql::query("SET LOCAL enable_seqscan = off")
        .execute(conn)
        .await?;
    Ok(())
}

/// Takes the transaction-scoped advisory lock `name`, if no one holds it:
/// the maintenance only one relay at a time does (retention, statistics).
async fn try_lock(tx: &mut sqlx::PgTransaction<'_>, name: &str) -> Result<bool, sqlx::Error> {
    crate::sql::query_scalar("SELECT pg_try_advisory_xact_lock(hashtext($1))")
        .bind(name)
        .fetch_one(&mut **tx)
        .await
}

/// Analyzes the outbox when the planner's idea of its size is far behind
/// the truth (fewer than half the live rows, and at least 1,000 missing):
/// indexes built on an empty table count as empty until the table is
/// analyzed, and the plans made meanwhile read every PENDING row per mark.
/// Autovacuum gets there within a minute or so; a relay catching up on a
/// fresh database gets there first. One relay at a time (an advisory
/// lock): `None` when another holds it, else whether it analyzed.
///
/// # Errors
/// Database errors.
pub async fn analyze_if_stale(
    tx: &mut sqlx::PgTransaction<'_>,
) -> Result<Option<bool>, sqlx::Error> {
    if !try_lock(tx, "flotilla:outbox-statistics").await? {
        return Ok(None);
    }
    let stale: bool = crate::sql::query_scalar(
        "SELECT coalesce(s.n_live_tup > 2 * greatest(c.reltuples, 0) + 1000, false)
         FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
         WHERE c.oid = 'workflow_run_outbox'::regclass",
    )
    .fetch_optional(&mut **tx)
    .await?
    .unwrap_or(false);
    if stale {
        crate::sql::query("ANALYZE workflow_run_outbox")
            .execute(&mut **tx)
            .await?;
    }
    Ok(Some(stale))
}

/// The fence of every relay write: the row's bucket is leased to this
/// relay, checked against the database's clock (not the relay's).
const HOLDS_BUCKET: &str = "EXISTS (SELECT 1 FROM relay_bucket b
    WHERE b.bucket = o.bucket AND b.owner = $9 AND b.lease_until > now())";

/// The statement of [`mark_published`]: `$1` the rows' jobs and `$2` their
/// sequences (their keys, pairwise), `$3` now, `$4` the relay. Public so
/// tests can look at its plan.
///
/// "Still PENDING" is written as neither PUBLISHED nor FAILED (the same
/// rows, by the table's CHECK) so that the planner cannot prove the
/// predicate of the index of PENDING rows and use it: on a table not yet
/// analyzed it takes that index for empty and walked the whole backlog,
/// bucket by bucket, for every mark. The only way left is the key.
#[must_use]
pub fn mark_published_statement() -> String {
    format!(
        "UPDATE workflow_run_outbox o SET status = 'PUBLISHED', published_at = $3, last_error = NULL
         FROM unnest($1::uuid[], $2::bigint[]) AS acked(job_id, sequence)
         WHERE o.job_id = acked.job_id AND o.sequence = acked.sequence
           AND o.status NOT IN ('PUBLISHED', 'FAILED') AND {}",
        HOLDS_BUCKET.replace("$9", "$4")
    )
}

/// Marks rows PUBLISHED (the broker acknowledged them), only those of
/// buckets `relay_id` still holds; returns how many. Run it in a
/// transaction that called [`prefer_indexes`].
///
/// # Errors
/// Database errors.
pub async fn mark_published(
    conn: &mut PgConnection,
    relay_id: &str,
    rows: &[EventKey],
    now: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let (jobs, sequences): (Vec<Uuid>, Vec<i64>) =
        rows.iter().map(|key| (key.job_id, key.sequence)).unzip();
    let done = crate::sql::query(&mark_published_statement())
        .bind(jobs)
        .bind(sequences)
        .bind(now)
        .bind(relay_id)
        .execute(conn)
        .await?;
    Ok(done.rows_affected())
}

/// Publish attempts a row gets before it lands FAILED.
pub const MAX_PUBLISH_ATTEMPTS: i32 = 10;

/// Counts a failed publish of `row`: backs it off (`base × 2^(attempts−1)`)
/// or, at the tenth attempt, lands it FAILED with the error.
///
/// # Errors
/// Database errors.
pub async fn record_failure(
    conn: &mut PgConnection,
    relay_id: &str,
    row: EventKey,
    error: &str,
    next_attempt_at: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    crate::sql::query(&format!(
        "UPDATE workflow_run_outbox o SET attempts = attempts + 1, last_error = $3, next_attempt_at = $4,
             status = CASE WHEN attempts + 1 >= $5 THEN 'FAILED' ELSE 'PENDING' END
         WHERE o.job_id = $1 AND o.sequence = $2 AND o.status = 'PENDING' AND {}",
        HOLDS_BUCKET.replace("$9", "$6")
    ))
    .bind(row.job_id)
    .bind(row.sequence)
    .bind(error)
    .bind(next_attempt_at)
    .bind(MAX_PUBLISH_ATTEMPTS)
    .bind(relay_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Lands `row` FAILED at once: it can never be published as it is (its
/// payload does not decode). An operator's replay puts it back.
///
/// # Errors
/// Database errors.
pub async fn fail_now(
    conn: &mut PgConnection,
    relay_id: &str,
    row: EventKey,
    error: &str,
) -> Result<(), sqlx::Error> {
    crate::sql::query(&format!(
        "UPDATE workflow_run_outbox o SET status = 'FAILED', attempts = attempts + 1, last_error = $3
         WHERE o.job_id = $1 AND o.sequence = $2 AND o.status = 'PENDING' AND {}",
        HOLDS_BUCKET.replace("$9", "$4")
    ))
    .bind(row.job_id)
    .bind(row.sequence)
    .bind(error)
    .bind(relay_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// The statement of [`delete_published_before`]: `$1` the cutoff, `$2` the
/// most rows. The oldest published rows through the index of PUBLISHED
/// rows by age, each deleted through the key. Public so tests can look at
/// its plan.
pub const DELETE_PUBLISHED_BEFORE: &str = "DELETE FROM workflow_run_outbox o
     USING (SELECT job_id, sequence FROM workflow_run_outbox
            WHERE status = 'PUBLISHED' AND published_at < $1
            ORDER BY published_at LIMIT $2) oldest
     WHERE o.job_id = oldest.job_id AND o.sequence = oldest.sequence";

/// Deletes up to `limit` PUBLISHED rows published before `cutoff`, if no
/// other relay is doing so right now (a transaction-scoped advisory lock):
/// `None` when another holds it.
///
/// # Errors
/// Database errors.
pub async fn delete_published_before(
    tx: &mut sqlx::PgTransaction<'_>,
    cutoff: DateTime<Utc>,
    limit: i64,
) -> Result<Option<u64>, sqlx::Error> {
    if !try_lock(tx, "flotilla:outbox-retention").await? {
        return Ok(None);
    }
    let done = crate::sql::query(DELETE_PUBLISHED_BEFORE)
        .bind(cutoff)
        .bind(limit)
        .execute(&mut **tx)
        .await?;
    Ok(Some(done.rows_affected()))
}

/// Operator action: FAILED rows (of one job, or all) back to PENDING with
/// fresh attempts. Returns how many.
///
/// # Errors
/// Database errors.
pub async fn replay_failed(
    conn: &mut PgConnection,
    job_id: Option<Uuid>,
    now: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let done = crate::sql::query(
        "UPDATE workflow_run_outbox SET status = 'PENDING', attempts = 0, next_attempt_at = $2
         WHERE status = 'FAILED' AND ($1::uuid IS NULL OR job_id = $1)",
    )
    .bind(job_id)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}
