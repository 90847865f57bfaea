//! The reserved connections: lease renewals and fenced writes on
//! connections of their own, with timeouts well inside the lease, so
//! neither waits behind the API, the console or a claim.

use std::time::Duration;

use sqlx::PgPool;

use crate::{Engine, EngineSettings};

/// The reserved connections of an engine: the shared pool's database,
/// `reserved_connections` of them, each with `lock_timeout` a tenth and
/// `statement_timeout` a fifth of the lease, so a row another session
/// holds, or a stuck statement, fails its own write long before any
/// lease it fences could lapse. A connection is waited for at most a
/// quarter of the lease. Opened lazily. Behind a transaction-mode pooler
/// the timeouts cannot stay on a connection (the next transaction may be
/// another client's, on another server connection): each transaction on
/// a reserved connection sets them for itself ([`reserved_timeouts`]).
pub(crate) fn reserved_pool(pool: &PgPool, settings: &EngineSettings) -> PgPool {
    let options = sqlx::postgres::PgPoolOptions::new()
        .max_connections(settings.reserved_connections.max(1))
        .acquire_timeout((settings.lease / 4).max(Duration::from_millis(100)));
    let options = if flotilla_store::sql::behind_transaction_pooler() {
        options
    } else {
        let set = reserved_timeouts(settings, false);
        options.after_connect(move |conn, _| {
            let set = set.clone();
            Box::pin(async move {
                flotilla_store::sql::query(&set).execute(conn).await?;
                Ok(())
            })
        })
    };
    options.connect_lazy_with((*pool.connect_options()).clone())
}

/// The statement that sets the reserved connections' timeouts: for the
/// session, or (`local`) for the transaction it runs in.
pub(crate) fn reserved_timeouts(settings: &EngineSettings, local: bool) -> String {
    let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
    let lock_timeout = millis(settings.lease / 10);
    let statement_timeout = millis(settings.lease / 5);
    format!(
        "SELECT set_config('lock_timeout', '{lock_timeout}', {local}), \
                set_config('statement_timeout', '{statement_timeout}', {local})"
    )
}

/// The longest a reply or a signal waits for its job's row lock.
const MAX_ROW_LOCK_WAIT: Duration = Duration::from_secs(5);

impl Engine {
    /// How long a reply or a signal waits for its job's row lock: a tenth
    /// of the lease (as a fenced write does), at most
    /// 5 s, well within the consumer's
    /// `max.poll.interval.ms`, so a row another session holds (an
    /// operator's open `SELECT … FOR UPDATE`) fails the write, which the
    /// consumer rides out as an outage, rather than stall its batch until
    /// the group takes the partition away.
    #[must_use]
    pub fn row_lock_wait(&self) -> Duration {
        (self.settings().lease / 10).clamp(Duration::from_millis(1), MAX_ROW_LOCK_WAIT)
    }

    /// A transaction on a reserved connection, its timeouts set for itself
    /// behind a transaction-mode pooler (where they cannot stay on the
    /// connection).
    ///
    /// # Errors
    /// No reserved connection, or the timeouts could not be set.
    pub(crate) async fn begin_reserved(
        &self,
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
        let mut tx = self.inner.reserved.begin().await?;
        if flotilla_store::sql::behind_transaction_pooler() {
            flotilla_store::sql::query(&reserved_timeouts(self.settings(), true))
                .execute(&mut *tx)
                .await?;
        }
        Ok(tx)
    }

    /// Runs `work` on a reserved connection, as [`flotilla_store::sql::session`]
    /// does on the shared pool; behind a transaction-mode pooler its
    /// transaction sets the reserved connections' timeouts for itself.
    ///
    /// # Errors
    /// No reserved connection, the commit failed, or what `work` returned.
    pub(crate) async fn on_reserved<T, E>(
        &self,
        work: impl AsyncFnOnce(&mut sqlx::PgConnection) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<sqlx::Error>,
    {
        let local = flotilla_store::sql::behind_transaction_pooler()
            .then(|| reserved_timeouts(self.settings(), true));
        flotilla_store::sql::session(&self.inner.reserved, async |conn| {
            if let Some(set) = &local {
                flotilla_store::sql::query(set).execute(&mut *conn).await?;
            }
            work(conn).await
        })
        .await
    }
}
