//! Helpers for tests and benchmarks (feature `test-support`): a whole worker
//! on port 0 over the test's own database, and the echo target.

use std::sync::Arc;

use clap::{CommandFactory as _, FromArgMatches as _};
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::Application;
use crate::config::Cli;
use crate::engine::Engine;
use crate::targets::{FnTarget, StepFailure, Target, TargetCall, Targets};

/// The bearer token a [`TestApp`] accepts unless told otherwise.
pub const TEST_TOKEN: &str = "test-token";

/// A target that answers `{"echo": <request>}`.
#[must_use]
pub fn echo_target() -> Arc<dyn Target> {
    Arc::new(FnTarget(|call: TargetCall| async move {
        Ok::<_, StepFailure>(json!({ "echo": call.request }))
    }))
}

/// A Kafka target writing JSON to `fraud-requests`, answered on
/// `fraud-replies`, waiting `timeout` for each reply (no broker needed
/// until a relay sends its requests).
#[must_use]
pub fn kafka_target(timeout: std::time::Duration) -> crate::targets::kafka::KafkaTarget {
    crate::targets::kafka::KafkaTarget {
        request_topic: "fraud-requests".into(),
        reply_topic: "fraud-replies".into(),
        encoding: Some(crate::targets::kafka::Encoding::Json),
        timeout,
        max_concurrent: None,
    }
}

/// Targets with [`echo_target`] registered as `echo`.
#[must_use]
pub fn echo_targets() -> Targets {
    let mut targets = Targets::default();
    targets.register(
        "echo",
        echo_target(),
        crate::targets::DEFAULT_MAX_CONCURRENT,
    );
    targets
}

/// A running worker: API on 127.0.0.1 port 0, no request consumer, the
/// test's database, stopped when dropped.
#[derive(Debug)]
pub struct TestApp {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// The probes' own listener, with `--health-addr`.
    pub health_url: Option<String>,
    pub engine: Engine,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestApp {
    /// A worker with the echo target, one token ([`TEST_TOKEN`]) and its
    /// claim loops running.
    ///
    /// # Panics
    /// The worker cannot be built.
    pub async fn spawn(pool: PgPool) -> Self {
        Self::spawn_with(pool, &[], echo_targets()).await
    }

    /// A worker with extra `flags` (as on the command line, e.g.
    /// `["--worker-count", "0"]`) and these targets.
    ///
    /// # Panics
    /// The flags do not parse or the worker cannot be built.
    pub async fn spawn_with(pool: PgPool, flags: &[&str], targets: Targets) -> Self {
        let mut args = vec![
            "flotilla-worker",
            "--database-url",
            "postgres://unused-the-pool-is-given",
            "--http-addr",
            "127.0.0.1:0",
            "--consume-requests",
            "false",
            "--api-tokens",
            TEST_TOKEN,
            "--worker-id",
            "test-worker",
            "--shutdown-grace",
            "5s",
        ];
        args.extend_from_slice(flags);
        // A flag given again in `flags` overrides the default above.
        let matches = Cli::command()
            .args_override_self(true)
            .try_get_matches_from(args)
            .expect("test worker flags");
        let cli = Cli::from_arg_matches(&matches).expect("test worker flags");
        let app = Application::with_parts(cli.worker, pool, targets)
            .await
            .expect("building the test worker");
        let url = format!("http://{}", app.api_addr());
        let health_url = app.health_addr().map(|addr| format!("http://{addr}"));
        let engine = app.engine().clone();
        let stop = CancellationToken::new();
        let task = tokio::spawn(app.run_until_stopped(stop.clone()));
        Self {
            url,
            health_url,
            engine,
            stop,
            task: Some(task),
        }
    }

    /// Stops the worker and waits for it.
    ///
    /// # Panics
    /// The worker's task panicked.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            task.await.expect("the test worker stopped cleanly");
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
