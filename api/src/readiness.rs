//! What `/readyz` reads: state kept up to date in the background, so a
//! probe costs no database round trip and no Kafka client, however often it
//! comes. The database is pinged every [`PING_EVERY`]; the supervised tasks
//! and every consumer the worker runs (requests, replies) report their own
//! state.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use flotilla_engine::Engine;
use flotilla_runtime::kafka::health::ConsumerHealth;

/// How often the database is pinged.
pub const PING_EVERY: Duration = Duration::from_secs(2);
/// How long one ping may take.
const PING_TIMEOUT: Duration = Duration::from_secs(2);
/// A successful ping older than this no longer counts.
const PING_STALE_AFTER: Duration = Duration::from_secs(10);

/// The readiness inputs of one worker.
#[derive(Debug, Clone)]
pub struct Readiness {
    engine: Engine,
    /// The last ping: when it answered, or why it did not.
    database: Arc<Mutex<Result<Instant, String>>>,
    /// Each consumer the worker runs, by what it reads.
    consumers: Vec<(&'static str, Arc<ConsumerHealth>)>,
    paused_unready_after: Duration,
}

impl Readiness {
    #[must_use]
    pub fn new(
        engine: Engine,
        consumers: Vec<(&'static str, Arc<ConsumerHealth>)>,
        paused_unready_after: Duration,
    ) -> Self {
        Self {
            engine,
            database: Arc::new(Mutex::new(Err("not pinged yet".into()))),
            consumers,
            paused_unready_after,
        }
    }

    fn database(&self) -> std::sync::MutexGuard<'_, Result<Instant, String>> {
        self.database
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Pings the database once and keeps the answer.
    pub async fn ping(&self) {
        let answer = match tokio::time::timeout(PING_TIMEOUT, self.engine.ping()).await {
            Ok(Ok(())) => Ok(Instant::now()),
            Ok(Err(e)) => Err(format!("database unavailable: {e}")),
            Err(_) => Err(format!(
                "database did not answer within {} s",
                PING_TIMEOUT.as_secs()
            )),
        };
        *self.database() = answer;
    }

    /// Pings the database every [`PING_EVERY`] until `shutdown`.
    pub async fn keep_fresh(self, shutdown: CancellationToken) {
        let mut ticks = tokio::time::interval(PING_EVERY);
        loop {
            tokio::select! {
                _ = ticks.tick() => self.ping().await,
                () = shutdown.cancelled() => return,
            }
        }
    }

    /// Why this worker is not ready; empty when it is.
    #[must_use]
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        match &*self.database() {
            Ok(at) if at.elapsed() <= PING_STALE_AFTER => {}
            Ok(at) => problems.push(format!(
                "database: no answer for {} s",
                at.elapsed().as_secs()
            )),
            Err(reason) => problems.push(reason.clone()),
        }
        problems.extend(self.engine.health().problems());
        for (name, consumer) in &self.consumers {
            if let Some((paused, reason)) = consumer.paused_for()
                && paused >= self.paused_unready_after
            {
                problems.push(format!(
                    "the {name} has been paused for {} s: {reason}",
                    paused.as_secs()
                ));
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A consumer paused by an outage is reported once the bound has passed
    /// (not before), naming the consumer and the outage; a resumed one no
    /// longer is. The reply consumer counts as the request consumer does.
    #[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
    async fn a_consumer_paused_past_the_bound_makes_the_worker_unready(pool: sqlx::PgPool) {
        let engine = flotilla_engine::Engine::new(
            pool,
            flotilla_targets::Targets::default(),
            std::sync::Arc::new(flotilla_engine::SystemClock),
            flotilla_engine::EngineSettings::new("w"),
        );
        let consumer = Arc::new(ConsumerHealth::default());
        let replies = Arc::new(ConsumerHealth::default());
        let consumers = vec![
            ("request consumer", consumer.clone()),
            ("reply consumer", replies.clone()),
        ];
        let patient = Readiness::new(engine.clone(), consumers.clone(), Duration::from_secs(3600));
        let strict = Readiness::new(engine, consumers, Duration::ZERO);
        patient.ping().await;
        strict.ping().await;
        assert!(strict.problems().is_empty(), "{:?}", strict.problems());
        consumer.paused("database: connection refused".into());
        assert!(patient.problems().is_empty(), "within the bound");
        let problems = strict.problems();
        assert!(
            problems
                .iter()
                .any(|p| p.contains("paused") && p.contains("connection refused")),
            "{problems:?}"
        );
        consumer.resumed();
        assert!(strict.problems().is_empty());
        replies.paused("database: connection refused".into());
        let problems = strict.problems();
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("the reply consumer has been paused")),
            "{problems:?}"
        );
        replies.resumed();
        assert!(strict.problems().is_empty());
    }

    /// Without a database, the last ping says so.
    #[tokio::test]
    async fn an_unreachable_database_makes_the_worker_unready() {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .acquire_timeout(Duration::from_millis(300))
            .connect_lazy("postgres://postgres@127.0.0.1:1/none")
            .unwrap();
        let engine = flotilla_engine::Engine::new(
            pool,
            flotilla_targets::Targets::default(),
            std::sync::Arc::new(flotilla_engine::SystemClock),
            flotilla_engine::EngineSettings::new("w"),
        );
        let readiness = Readiness::new(engine, Vec::new(), Duration::from_secs(60));
        readiness.ping().await;
        let problems = readiness.problems();
        assert!(
            problems.iter().any(|p| p.contains("database")),
            "{problems:?}"
        );
    }
}
