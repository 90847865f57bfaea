//! Long-lived tasks under supervision: a task that panics is logged,
//! counted and restarted after a pause (when it can be), and [`Health`]
//! says which tasks are not running so that readiness can fail on them.

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt as _;

use crate::backoff::Doubling;

/// The state of every supervised task of a process, by name.
#[derive(Debug, Clone, Default)]
pub struct Health {
    tasks: Arc<Mutex<BTreeMap<String, TaskState>>>,
}

/// Where a supervised task is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskState {
    Running,
    /// It panicked and waits to be started again.
    Restarting {
        panic: String,
    },
    /// It stopped for good and nothing restarts it.
    Dead {
        reason: String,
    },
    /// Not a task: something found wrong that an operator must change
    /// (a topic that refuses writes).
    Unfit {
        reason: String,
    },
}

impl Health {
    fn set(&self, task: &str, state: TaskState) {
        self.tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(task.to_owned(), state);
    }

    fn forget(&self, task: &str) {
        self.tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(task);
    }

    /// Marks `task` dead for good (readiness fails from now on).
    pub fn dead(&self, task: &str, reason: impl Into<String>) {
        let reason = reason.into();
        tracing::error!(task, %reason, "task died");
        self.set(task, TaskState::Dead { reason });
    }

    /// Records something found wrong under `what` (readiness fails from now
    /// on, naming it), logged once when reported.
    pub fn unfit(&self, what: &str, reason: impl Into<String>) {
        let reason = reason.into();
        tracing::error!(what, %reason, "not ready");
        self.set(what, TaskState::Unfit { reason });
    }

    /// Every task that is not running, with why: empty when all is well.
    #[must_use]
    pub fn problems(&self) -> Vec<String> {
        self.tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter_map(|(task, state)| match state {
                TaskState::Running => None,
                TaskState::Restarting { panic } => {
                    Some(format!("{task} panicked ({panic}) and is restarting"))
                }
                TaskState::Dead { reason } => Some(format!("{task} died: {reason}")),
                TaskState::Unfit { reason } => Some(format!("{task}: {reason}")),
            })
            .collect()
    }
}

/// The message a panic carried, as text.
#[must_use]
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// Runs the task `make` builds until it returns; when it panics, records
/// it, waits (1 s doubling to 30 s) and builds it again. Returns when a run
/// of the task returns normally (it was told to stop).
pub async fn restart_on_panic<F, Fut>(health: Health, task: String, mut make: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut pause = Doubling::new(Duration::from_secs(1), Duration::from_secs(30));
    loop {
        health.set(&task, TaskState::Running);
        match AssertUnwindSafe(make()).catch_unwind().await {
            Ok(()) => {
                health.forget(&task);
                return;
            }
            Err(payload) => {
                let panic = panic_message(payload.as_ref());
                tracing::error!(task, %panic, "task panicked; restarting it");
                metrics::counter!("flotilla_task_restarts_total", "task" => task.clone())
                    .increment(1);
                health.set(&task, TaskState::Restarting { panic });
                tokio::time::sleep(pause.next_pause()).await;
            }
        }
    }
}

/// Runs a task that cannot be started again: a panic marks it dead.
pub async fn run_once_or_die<Fut>(health: Health, task: String, future: Fut)
where
    Fut: Future<Output = ()>,
{
    health.set(&task, TaskState::Running);
    match AssertUnwindSafe(future).catch_unwind().await {
        Ok(()) => health.forget(&task),
        Err(payload) => health.dead(
            &task,
            format!("panicked: {}", panic_message(payload.as_ref())),
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_panicking_task_is_restarted_and_reported_until_it_runs_again() {
        let health = Health::default();
        let runs = Arc::new(AtomicU32::new(0));
        let counter = runs.clone();
        let supervised = tokio::spawn(restart_on_panic(health.clone(), "loop".into(), move || {
            let counter = counter.clone();
            async move {
                if counter.fetch_add(1, Ordering::SeqCst) == 0 {
                    panic!("first run fails");
                }
            }
        }));
        supervised.await.unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 2, "restarted once");
        assert!(
            health.problems().is_empty(),
            "running again: no problem left"
        );
    }

    #[tokio::test]
    async fn a_task_that_cannot_restart_is_reported_dead() {
        let health = Health::default();
        run_once_or_die(health.clone(), "consumer".into(), async { panic!("boom") }).await;
        assert_eq!(health.problems(), ["consumer died: panicked: boom"]);
    }
}
