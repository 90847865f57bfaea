//! `worker_member`: which workers are alive and how many claim loops each
//! runs, for the console's fleet view. Like `relay_member`, a worker writes
//! its own row on every sweeper tick and deletes it when it stops; a worker
//! that died leaves a row whose `last_seen` ages.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

/// A worker as the fleet view shows it.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub struct WorkerMember {
    pub worker_id: String,
    pub claim_loops: i32,
    /// RUNNING jobs whose lease this worker holds now.
    pub jobs_held: i64,
    pub started_at: DateTime<Utc>,
    pub last_seen: DateTime<Utc>,
}

/// Records that `worker_id`, started at `started_at` with `claim_loops`
/// loops and reading runs up to [`crate::runs::READER_LEVEL`], is alive now
/// (the database's clock).
///
/// # Errors
/// Database errors.
pub async fn heartbeat(
    conn: &mut PgConnection,
    worker_id: &str,
    claim_loops: i32,
    started_at: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    crate::sql::query(
        "INSERT INTO worker_member (worker_id, claim_loops, started_at, last_seen, reader_level)
         VALUES ($1, $2, $3, now(), $4)
         ON CONFLICT (worker_id) DO UPDATE
         SET claim_loops = EXCLUDED.claim_loops, started_at = EXCLUDED.started_at, last_seen = now(),
             reader_level = EXCLUDED.reader_level",
    )
    .bind(worker_id)
    .bind(claim_loops)
    .bind(started_at)
    .bind(i32::from(crate::runs::READER_LEVEL))
    .execute(conn)
    .await?;
    Ok(())
}

/// Removes `worker_id`'s row (it is stopping).
///
/// # Errors
/// Database errors.
pub async fn leave(conn: &mut PgConnection, worker_id: &str) -> Result<(), sqlx::Error> {
    crate::sql::query("DELETE FROM worker_member WHERE worker_id = $1")
        .bind(worker_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Workers seen within `ttl_ms`, and every worker that holds a lease even if
/// it has no row (an older version, or one whose row aged out), with the
/// jobs each holds; busiest first.
///
/// # Errors
/// Database errors.
pub async fn list(conn: &mut PgConnection, ttl_ms: i64) -> Result<Vec<WorkerMember>, sqlx::Error> {
    // `held` reads the RUNNING rows through their partial index.
    crate::sql::query_as(
        "WITH held AS (
             SELECT lease_owner AS worker_id, count(*) AS jobs_held
             FROM workflow_run WHERE status = 'RUNNING' AND lease_owner IS NOT NULL
             GROUP BY lease_owner)
         SELECT coalesce(m.worker_id, h.worker_id) AS worker_id,
                coalesce(m.claim_loops, 0) AS claim_loops,
                coalesce(h.jobs_held, 0) AS jobs_held,
                coalesce(m.started_at, '-infinity') AS started_at,
                coalesce(m.last_seen, '-infinity') AS last_seen
         FROM (SELECT * FROM worker_member
               WHERE last_seen > now() - $1 * interval '1 millisecond') m
         FULL JOIN held h ON h.worker_id = m.worker_id
         ORDER BY jobs_held DESC, worker_id",
    )
    .bind(ttl_ms)
    .fetch_all(conn)
    .await
}

/// Forgets workers not seen for `ttl_ms` milliseconds.
///
/// # Errors
/// Database errors.
pub async fn forget_departed(conn: &mut PgConnection, ttl_ms: i64) -> Result<u64, sqlx::Error> {
    let done = crate::sql::query(
        "DELETE FROM worker_member WHERE last_seen < now() - $1 * interval '1 millisecond'",
    )
    .bind(ttl_ms)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// When `worker_id` last announced itself, and how long ago that was by
/// the database's clock; `None` when it has no row.
///
/// # Errors
/// Database errors.
pub async fn last_seen(
    conn: &mut PgConnection,
    worker_id: &str,
) -> Result<Option<(DateTime<Utc>, f64)>, sqlx::Error> {
    crate::sql::query_as(
        "SELECT last_seen, extract(epoch FROM now() - last_seen)::float8
         FROM worker_member WHERE worker_id = $1",
    )
    .bind(worker_id)
    .fetch_optional(conn)
    .await
}
