//! The background services every worker runs beside its claim loops, one
//! file per chore. Each service is a loop of its own until shutdown,
//! started the same way (`start`): supervised, restarted after a panic,
//! its death visible to readiness (`flotilla_runtime::supervise`).
//!
//! The sweeper's tick runs several chores in a fixed order (see
//! `sweeper.rs`); retention and the scheduler keep their own pace.

mod cascade;
mod concurrency;
mod due_waits;
pub(crate) mod finished_tally;
pub(crate) mod layout_switches;
mod membership;
pub mod retention;
mod scheduler;
mod sweeper;

use futures_util::future::BoxFuture;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::Engine;

pub use membership::Namesake;
pub use scheduler::{GRACE, SCHEDULE_POLL};

/// A service: its name (in logs and readiness) and its loop.
type Service = (
    &'static str,
    fn(Engine, CancellationToken) -> BoxFuture<'static, ()>,
);

/// Every service a worker runs.
const SERVICES: [Service; 3] = [
    ("sweeper", |engine, stop| {
        Box::pin(async move { engine.sweeper(stop).await })
    }),
    ("retention", |engine, stop| {
        Box::pin(async move { engine.retention(stop).await })
    }),
    ("scheduler", |engine, stop| {
        Box::pin(async move { engine.scheduler(stop).await })
    }),
];

/// Starts every service on `tasks`, each until `shutdown`.
pub(crate) fn start(engine: &Engine, tasks: &mut JoinSet<()>, shutdown: &CancellationToken) {
    for (name, service) in SERVICES {
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        let health = engine.health().clone();
        tasks.spawn(flotilla_runtime::supervise::restart_on_panic(
            health,
            name.into(),
            move || service(engine.clone(), shutdown.clone()),
        ));
    }
}
