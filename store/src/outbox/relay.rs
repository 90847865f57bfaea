//! The relay's statements on the outbox: batches of its buckets, the
//! progress they end at, rows refused for themselves, retention and the
//! operator's replay.
//!
//! Rows are written once and never updated. Each bucket's progress is the
//! snapshot (`pg_current_snapshot()`) its last finished batch ended at: a
//! row is published when its writing transaction (`txid`) is visible in
//! it. A batch is every row whose transaction a fresh snapshot sees and
//! the bucket's did not. Transactions commit out of the order of their
//! ids, which a snapshot accounts for and a "last txid" would not: a row
//! of a transaction still open when the progress was taken is in its
//! snapshot's in-progress list, and comes in the batch after it commits.
//!
//! Per-job order: a job's events are written under its row's lock, so a
//! later event's transaction starts writing after the earlier one's
//! committed. Any snapshot that sees the later one sees the earlier one,
//! so a batch never holds a job's later event without the earlier (in it
//! or in a batch before). Within a batch, rows go in `id` order, drawn from
//! a sequence as they are inserted, so a job's ids grow with its sequence.

use chrono::{DateTime, Utc};
use flotilla_contracts::{DecodeError, WorkflowRunEvent};
use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

/// An outbox row's key: its job and its place in the job's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventKey {
    pub job_id: Uuid,
    pub sequence: i64,
}

/// A row of a batch as the relay publishes it.
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
}

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

/// A snapshot of which transactions had committed, in Postgres's text
/// form (`xmin:xmax:xip,...`): where a bucket's batch ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot(pub String);

/// A row of a batch, named by the `(bucket, txid, id)` index (what a page
/// of the batch is fetched by), and its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    pub bucket: i16,
    pub txid: i64,
    pub id: i64,
    pub job_id: Uuid,
}

/// The next batch of a bucket: every row a fresh snapshot (`to`) sees
/// and its progress (`from`) did not, in `id` order.
#[derive(Debug, Clone)]
pub struct Batch {
    pub bucket: i16,
    pub from: Snapshot,
    pub to: Snapshot,
    pub rows: Vec<Planned>,
}

/// The statement under [`plan`]: `$1` the buckets, `$2` their progress,
/// `$3` the snapshot the batches end at. One range of the
/// `(bucket, txid, id)` index per bucket, from its progress's xmin; no
/// row's payload is read (its job, for the relay that may send only one
/// event of a job at a time, from the heap). Public so tests can look at its plan.
pub const BATCH_ROWS: &str = "SELECT o.bucket, o.txid::text::int8 AS txid, o.id, o.job_id
     FROM unnest($1::smallint[], $2::text[]) AS b(bucket, published)
     CROSS JOIN LATERAL (
         SELECT o.bucket, o.txid, o.id, o.job_id FROM workflow_run_outbox o
         WHERE o.bucket = b.bucket AND o.txid >= pg_snapshot_xmin(b.published::pg_snapshot)
           AND NOT pg_visible_in_snapshot(o.txid, b.published::pg_snapshot)
           AND pg_visible_in_snapshot(o.txid, $3::pg_snapshot)) o
     ORDER BY o.bucket, o.id";

/// The next batch of each of `buckets` that has one: a fresh snapshot,
/// and every row it sees that the bucket's progress did not. Only the
/// rows' names are read (a few bytes each, from the index): a backlog of a
/// million rows is planned in one read and fetched a page at a time
/// ([`fetch`]).
///
/// # Errors
/// Database errors.
pub async fn plan(conn: &mut PgConnection, buckets: &[i16]) -> Result<Vec<Batch>, sqlx::Error> {
    let mut tx = sqlx::Connection::begin(conn).await?;
    prefer_indexes(&mut tx).await?;
    let progress: Vec<(i16, String)> = crate::sql::query_as(
        "SELECT bucket, published::text FROM relay_bucket WHERE bucket = ANY($1) ORDER BY bucket",
    )
    .bind(buckets)
    .fetch_all(&mut *tx)
    .await?;
    let to: String = crate::sql::query_scalar("SELECT pg_current_snapshot()::text")
        .fetch_one(&mut *tx)
        .await?;
    // Rows committed after `to` was taken are seen by this read too; the
    // filter on `to` leaves them to the next batch.
    let rows: Vec<(i16, i64, i64, Uuid)> = crate::sql::query_as(BATCH_ROWS)
        .bind(progress.iter().map(|(b, _)| *b).collect::<Vec<_>>())
        .bind(progress.iter().map(|(_, p)| p.clone()).collect::<Vec<_>>())
        .bind(&to)
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    let mut batches: Vec<Batch> = Vec::new();
    for (bucket, txid, id, job_id) in rows {
        if batches.last().is_none_or(|b| b.bucket != bucket) {
            let from = progress
                .iter()
                .find(|(b, _)| *b == bucket)
                .map(|(_, p)| p.clone())
                .unwrap_or_default();
            batches.push(Batch {
                bucket,
                from: Snapshot(from),
                to: Snapshot(to.clone()),
                rows: Vec::new(),
            });
        }
        if let Some(batch) = batches.last_mut() {
            batch.rows.push(Planned {
                bucket,
                txid,
                id,
                job_id,
            });
        }
    }
    Ok(batches)
}

/// The statement under [`fetch`]: `$1`, `$2`, `$3` the rows' buckets,
/// txids and ids, pairwise. One probe of the `(bucket, txid, id)` index
/// per row. Public so tests can look at its plan.
pub const PAGE_ROWS: &str =
    "SELECT o.event_id, o.job_id, o.sequence, o.event_type, o.bucket, o.payload, o.body,
            o.traceparent, o.tracestate
     FROM unnest($1::smallint[], $2::int8[], $3::int8[]) AS p(bucket, txid, id)
     JOIN workflow_run_outbox o
       ON o.bucket = p.bucket AND o.txid = p.txid::text::xid8 AND o.id = p.id
     ORDER BY o.id";

/// The rows named by `page`, in `id` order. A row replayed since it was
/// planned has a new txid and is not found: the next batch takes it.
///
/// # Errors
/// Database errors.
pub async fn fetch(
    conn: &mut PgConnection,
    page: &[Planned],
) -> Result<Vec<PendingEvent>, sqlx::Error> {
    let mut tx = sqlx::Connection::begin(conn).await?;
    prefer_indexes(&mut tx).await?;
    let rows = crate::sql::query_as(PAGE_ROWS)
        .bind(page.iter().map(|p| p.bucket).collect::<Vec<_>>())
        .bind(page.iter().map(|p| p.txid).collect::<Vec<_>>())
        .bind(page.iter().map(|p| p.id).collect::<Vec<_>>())
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(rows)
}

/// Tells the planner, for the rest of the transaction on `conn`, to reach
/// the outbox through its indexes, and not to compile the statements. On a
/// table whose statistics lag behind its size (a fresh database, the first
/// minute of a burst, before autovacuum analyzes it) the planner takes the
/// indexes for empty and may scan the whole outbox instead. Without
/// sequential scans the estimates of a large outbox pass JIT's threshold,
/// and compiling took 100 to 900 ms a statement that runs in 2 (a relay
/// with a million rows retained ran at half its speed).
///
/// # Errors
/// Database errors.
pub async fn prefer_indexes(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    crate::sql::query("SET LOCAL enable_seqscan = off")
        .execute(&mut *conn)
        .await?;
    crate::sql::query("SET LOCAL jit = off")
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
/// analyzed. Autovacuum gets there within a minute or so; a relay catching
/// up on a fresh database gets there first. One relay at a time (an
/// advisory lock): `None` when another holds it, else whether it analyzed.
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

/// A batch sent whole: its bucket's progress moves from `from` to `to`.
#[derive(Debug, Clone)]
pub struct Finished {
    pub bucket: i16,
    pub from: Snapshot,
    pub to: Snapshot,
}

/// Moves each finished batch's bucket to the snapshot it ended at: its
/// rows are published. Only buckets `relay_id` still holds (by the
/// database's clock) and whose progress is still where the batch started
/// (no other relay moved it meanwhile). Returns the buckets moved.
///
/// # Errors
/// Database errors.
pub async fn advance(
    conn: &mut PgConnection,
    relay_id: &str,
    done: &[Finished],
) -> Result<Vec<i16>, sqlx::Error> {
    let text =
        |f: fn(&Finished) -> &Snapshot| done.iter().map(|d| f(d).0.clone()).collect::<Vec<_>>();
    crate::sql::query_scalar(
        "UPDATE relay_bucket b SET published = d.snapshot::pg_snapshot, published_at = now()
         FROM unnest($1::smallint[], $2::text[], $3::text[]) AS d(bucket, progress, snapshot)
         WHERE b.bucket = d.bucket AND b.published::text = d.progress
           AND b.owner = $4 AND b.lease_until > now()
         RETURNING b.bucket",
    )
    .bind(done.iter().map(|d| d.bucket).collect::<Vec<_>>())
    .bind(text(|d| &d.from))
    .bind(text(|d| &d.to))
    .bind(relay_id)
    .fetch_all(conn)
    .await
}

/// A row that can never be published as it is, and why.
#[derive(Debug, Clone)]
pub struct Refused {
    pub key: EventKey,
    pub bucket: i16,
    pub error: String,
}

/// Lands `rows` FAILED (a row each in `workflow_run_outbox_failed`), only
/// those of buckets `relay_id` still holds; returns how many. A row refused
/// again (its batch sent again) keeps its first failure.
///
/// # Errors
/// Database errors.
pub async fn record_failed(
    conn: &mut PgConnection,
    relay_id: &str,
    rows: &[Refused],
) -> Result<u64, sqlx::Error> {
    let done = crate::sql::query(
        "INSERT INTO workflow_run_outbox_failed (job_id, sequence, bucket, error)
         SELECT f.job_id, f.sequence, f.bucket, f.error
         FROM unnest($1::uuid[], $2::int8[], $3::smallint[], $4::text[])
             AS f(job_id, sequence, bucket, error)
         WHERE EXISTS (SELECT 1 FROM relay_bucket b
                       WHERE b.bucket = f.bucket AND b.owner = $5 AND b.lease_until > now())
         ON CONFLICT (job_id, sequence) DO NOTHING",
    )
    .bind(rows.iter().map(|r| r.key.job_id).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.key.sequence).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.bucket).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.error.clone()).collect::<Vec<_>>())
    .bind(relay_id)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// The statement of [`delete_published_before`]: `$1` the cutoff, `$2` the
/// most rows per bucket. Per bucket, its oldest published rows by
/// transaction (those its progress sees), through the `(bucket, txid, id)`
/// index; those written before the cutoff and not FAILED are deleted.
/// Public so tests can look at its plan.
pub const DELETE_PUBLISHED_BEFORE: &str = "DELETE FROM workflow_run_outbox o
     USING (SELECT old.bucket, old.txid, old.id
            FROM relay_bucket b
            CROSS JOIN LATERAL (
                SELECT x.bucket, x.txid, x.id, x.job_id, x.sequence, x.created_at
                FROM workflow_run_outbox x
                WHERE x.bucket = b.bucket AND x.txid < pg_snapshot_xmax(b.published)
                  AND pg_visible_in_snapshot(x.txid, b.published)
                ORDER BY x.txid, x.id LIMIT $2) old
            WHERE old.created_at < $1
              AND NOT EXISTS (SELECT 1 FROM workflow_run_outbox_failed f
                              WHERE f.job_id = old.job_id AND f.sequence = old.sequence)) gone
     WHERE o.bucket = gone.bucket AND o.txid = gone.txid AND o.id = gone.id";

/// Deletes up to `limit` published rows per bucket written before `cutoff`,
/// if no other relay is doing so right now (a transaction-scoped advisory
/// lock): `None` when another holds it.
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

/// Operator action: FAILED rows (of one job, or all) go again. Each gets a
/// new txid (this transaction's), outside every bucket's progress, so the
/// next batch of its bucket takes it; its failure is forgotten. Returns
/// how many.
///
/// # Errors
/// Database errors.
pub async fn replay_failed(
    conn: &mut PgConnection,
    job_id: Option<Uuid>,
) -> Result<u64, sqlx::Error> {
    let done = crate::sql::query(
        "WITH replayed AS (
             DELETE FROM workflow_run_outbox_failed
             WHERE $1::uuid IS NULL OR job_id = $1
             RETURNING job_id, sequence)
         UPDATE workflow_run_outbox o SET txid = pg_current_xact_id()
         FROM replayed r WHERE o.job_id = r.job_id AND o.sequence = r.sequence",
    )
    .bind(job_id)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// How many of `rows` (a batch's rest, in order) a page may take when
/// only one event of a job may be in flight: up to, not including, the
/// first row of a job already in it, and at most `most`.
#[must_use]
pub fn one_per_job(rows: &[Planned], most: usize) -> usize {
    let mut jobs = std::collections::HashSet::new();
    rows.iter()
        .take(most)
        .take_while(|row| jobs.insert(row.job_id))
        .count()
}

#[cfg(test)]
mod tests {
    use super::{Planned, one_per_job};
    use uuid::Uuid;

    #[test]
    fn a_page_of_one_event_per_job_ends_before_a_jobs_second_event() {
        let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let rows: Vec<Planned> = [a, b, a, c]
            .into_iter()
            .zip(1..)
            .map(|(job_id, id)| Planned {
                bucket: 0,
                txid: 10,
                id,
                job_id,
            })
            .collect();
        assert_eq!(one_per_job(&rows, 10), 2);
        assert_eq!(one_per_job(&rows, 1), 1);
        assert_eq!(one_per_job(&rows[2..], 10), 2);
        assert_eq!(one_per_job(&[], 10), 0);
    }
}
