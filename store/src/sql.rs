//! How this process's statements reach the database: `sqlx`'s `query`,
//! `query_as` and `query_scalar`, each prepared as the database path
//! allows (`Pooler`, docs/operations.md "Behind a connection pooler").
//!
//! Straight to Postgres a statement is prepared once per connection and
//! kept (sqlx's statement cache). Behind a pooler in transaction mode a
//! server connection belongs to a client for one transaction only, so a
//! statement kept on it would be met by the next client (a name taken, or
//! one missing on the server the next transaction lands on): statements
//! are then prepared unnamed, for the one execution, inside the
//! transaction that runs them: sqlx prepares and executes a statement in
//! two round trips, and between two transactions the pooler may hand the
//! second to another server connection. Statements that are not part of
//! a caller's transaction run through [`session`], which gives them one.

use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::postgres::PgArguments;
use sqlx::query::{Query, QueryAs, QueryScalar};
use sqlx::{PgConnection, PgPool, Postgres};

/// Whether statements are kept prepared on their connection: false once a
/// pool behind a transaction-mode pooler is opened in this process.
static KEEP_PREPARED: AtomicBool = AtomicBool::new(true);

/// Statements are prepared for one execution from now on, in this process.
pub(crate) fn prepare_for_one_execution() {
    KEEP_PREPARED.store(false, Ordering::SeqCst);
}

/// Whether statements are kept prepared on their connection (not behind a
/// transaction-mode pooler): for statements built otherwise, as a
/// `QueryBuilder`'s.
#[must_use]
pub fn keep_prepared() -> bool {
    KEEP_PREPARED.load(Ordering::Relaxed)
}

/// `sqlx::query`, prepared as this process's database path allows.
pub fn query(sql: &str) -> Query<'_, Postgres, PgArguments> {
    sqlx::query(sql).persistent(keep_prepared())
}

/// `sqlx::query_as`, prepared as this process's database path allows.
pub fn query_as<'q, O>(sql: &'q str) -> QueryAs<'q, Postgres, O, PgArguments>
where
    O: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
{
    sqlx::query_as(sql).persistent(keep_prepared())
}

/// `sqlx::query_scalar`, prepared as this process's database path allows.
pub fn query_scalar<'q, O>(sql: &'q str) -> QueryScalar<'q, Postgres, O, PgArguments>
where
    (O,): for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
{
    sqlx::query_scalar(sql).persistent(keep_prepared())
}

/// Whether this process reaches Postgres through a transaction-mode
/// pooler: no state may be kept on a connection past its transaction.
#[must_use]
pub fn behind_transaction_pooler() -> bool {
    !keep_prepared()
}

/// Runs `work` on a connection of `pool`, for statements that need no
/// transaction of the caller's: straight to Postgres on a pooled
/// connection as it is (each statement commits on its own); behind a
/// transaction-mode pooler in a transaction of its own, committed when
/// `work` succeeds and rolled back when it fails, so every statement's
/// round trips reach one server connection. A caller that needs its
/// statements to commit together begins a transaction itself.
///
/// # Errors
/// No connection, the commit failed, or what `work` returned.
pub async fn session<T, E>(
    pool: &PgPool,
    work: impl AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
) -> Result<T, E>
where
    E: From<sqlx::Error>,
{
    if keep_prepared() {
        let mut conn = pool.acquire().await?;
        return work(&mut conn).await;
    }
    let mut tx = pool.begin().await?;
    match work(&mut tx).await {
        Ok(value) => {
            tx.commit().await?;
            Ok(value)
        }
        Err(e) => {
            // Said at once: a rollback left for the connection's next use
            // would keep its server connection pinned until then.
            if let Err(rollback) = tx.rollback().await {
                tracing::debug!(error = %rollback, "rolling back a failed session's transaction failed");
            }
            Err(e)
        }
    }
}

/// Bounds how long the statements of the transaction on `conn` wait for a
/// row lock (`lock_timeout`, for this transaction only, so it holds behind
/// a transaction-mode pooler too): past it they fail with
/// `lock_not_available` (55P03).
///
/// # Errors
/// Database errors.
pub async fn bound_lock_wait(
    conn: &mut PgConnection,
    wait: std::time::Duration,
) -> Result<(), sqlx::Error> {
    query("SELECT set_config('lock_timeout', $1, true)")
        .bind(format!("{}ms", wait.as_millis().max(1)))
        .execute(conn)
        .await?;
    Ok(())
}

/// Commits `tx` when `result` is a success and rolls it back otherwise,
/// ending it here rather than dropping it: a dropped transaction keeps its
/// advisory locks until its connection is next used.
///
/// # Errors
/// `result`'s error, or the commit's.
pub async fn end_transaction<T, E>(
    tx: sqlx::PgTransaction<'_>,
    result: Result<T, E>,
) -> Result<T, E>
where
    E: From<sqlx::Error>,
{
    match result {
        Ok(value) => {
            tx.commit().await?;
            Ok(value)
        }
        Err(e) => {
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}
