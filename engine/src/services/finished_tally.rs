//! This process's count of finished jobs by minute and final state, added
//! to the fleet's `finished_tally` on every sweeper tick (see
//! [`flotilla_store::finished`]). Counting here instead of reading the
//! outbox keeps the console's chart of the last hour a few rows to read,
//! whatever the history holds.

use std::collections::BTreeMap;

use chrono::{DateTime, DurationRound as _, TimeDelta, Utc};
use flotilla_store::finished::{self, FinishedInMinute};
use sqlx::PgConnection;

/// Counts not yet added to the table, and the lock that keeps a flush and
/// a read of the fleet from seeing the same counts twice.
#[derive(Debug, Default)]
pub(crate) struct Finishes {
    pending: std::sync::Mutex<BTreeMap<(DateTime<Utc>, &'static str), i64>>,
    flushing: tokio::sync::Mutex<()>,
}

fn minute_of(at: DateTime<Utc>) -> DateTime<Utc> {
    at.duration_trunc(TimeDelta::minutes(1)).unwrap_or(at)
}

impl Finishes {
    fn pending(&self) -> std::sync::MutexGuard<'_, BTreeMap<(DateTime<Utc>, &'static str), i64>> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts one job that reached `state` at `at`.
    pub(crate) fn record(&self, state: &'static str, at: DateTime<Utc>) {
        *self.pending().entry((minute_of(at), state)).or_default() += 1;
    }

    fn as_rows(counts: &BTreeMap<(DateTime<Utc>, &'static str), i64>) -> Vec<FinishedInMinute> {
        counts
            .iter()
            .map(|((minute, status), count)| FinishedInMinute {
                minute: *minute,
                status: (*status).to_owned(),
                count: *count,
            })
            .collect()
    }

    /// Adds the counts so far to the table; kept for the next flush when
    /// the database refuses.
    ///
    /// # Errors
    /// Database errors.
    pub(crate) async fn flush(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        let _flushing = self.flushing.lock().await;
        let counts = std::mem::take(&mut *self.pending());
        if let Err(e) = finished::add(conn, &Self::as_rows(&counts)).await {
            let mut pending = self.pending();
            for (key, count) in counts {
                *pending.entry(key).or_default() += count;
            }
            return Err(e);
        }
        Ok(())
    }

    /// The fleet's minutes since `since`: the table's and this process's
    /// counts not yet added to it.
    ///
    /// # Errors
    /// Database errors.
    pub(crate) async fn since(
        &self,
        conn: &mut PgConnection,
        since: DateTime<Utc>,
    ) -> Result<Vec<FinishedInMinute>, sqlx::Error> {
        let _flushing = self.flushing.lock().await;
        let since = minute_of(since);
        let mut merged: BTreeMap<(DateTime<Utc>, String), i64> = finished::since(conn, since)
            .await?
            .into_iter()
            .map(|row| ((row.minute, row.status), row.count))
            .collect();
        for ((minute, status), count) in self.pending().iter() {
            if *minute >= since {
                *merged.entry((*minute, (*status).to_owned())).or_default() += count;
            }
        }
        Ok(merged
            .into_iter()
            .map(|((minute, status), count)| FinishedInMinute {
                minute,
                status,
                count,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    /// Finishes are counted per minute and state; a failed flush keeps
    /// them, and a read sees table and pending counts once each.
    #[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
    async fn counts_reach_the_table_once_and_a_failed_flush_keeps_them(pool: sqlx::PgPool) {
        let finishes = Finishes::default();
        finishes.record("COMPLETED", at("2026-12-02T10:00:05Z"));
        finishes.record("COMPLETED", at("2026-12-02T10:00:55Z"));
        finishes.record("FAILED", at("2026-12-02T10:01:00Z"));
        let mut conn = pool.acquire().await.unwrap();
        let since = at("2026-12-02T09:00:00Z");
        let before_flush = finishes.since(&mut conn, since).await.unwrap();
        finishes.flush(&mut conn).await.unwrap();
        let after_flush = finishes.since(&mut conn, since).await.unwrap();
        assert_eq!(
            before_flush, after_flush,
            "pending and flushed counts read alike"
        );
        let counts: Vec<_> = after_flush
            .iter()
            .map(|r| (r.status.as_str(), r.count))
            .collect();
        assert_eq!(counts, [("COMPLETED", 2), ("FAILED", 1)]);

        finishes.record("DEAD", at("2026-12-02T10:02:00Z"));
        flotilla_store::sql::query("ALTER TABLE finished_tally RENAME TO gone")
            .execute(&mut *conn)
            .await
            .unwrap();
        assert!(finishes.flush(&mut conn).await.is_err());
        flotilla_store::sql::query("ALTER TABLE gone RENAME TO finished_tally")
            .execute(&mut *conn)
            .await
            .unwrap();
        finishes.flush(&mut conn).await.unwrap();
        let total: i64 = finished::since(&mut conn, since)
            .await
            .unwrap()
            .iter()
            .map(|r| r.count)
            .sum();
        assert_eq!(
            total, 4,
            "the count kept through the failed flush arrived once"
        );
    }
}
