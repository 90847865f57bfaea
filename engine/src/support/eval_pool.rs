//! Where CEL and JSON Schema run: off the async runtime, on a pool of as
//! many threads as the machine has cores, each CEL evaluation within the
//! budget (`flotilla_workflow::budget`), so an expression or a pattern that runs
//! long or builds much fails its own job without slowing the heartbeats,
//! the API or `/healthz`. The pool's threads have deep stacks: the `cel`
//! crate evaluates by recursion, with frames large enough that an
//! expression nested a few dozen levels overflows a default 2 MiB thread
//! (which would abort the whole process).

use std::panic::AssertUnwindSafe;

use crate::Engine;
use flotilla_workflow::{Budget, Exhausted};

/// The stack of an evaluation thread (address space; only what is used is
/// backed by memory).
const EVALUATION_STACK: usize = 64 * 1024 * 1024;

/// The evaluation threads and the budget of each evaluation.
pub(crate) struct Evaluations {
    pool: rayon::ThreadPool,
    budget: Budget,
}

impl std::fmt::Debug for Evaluations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Evaluations")
            .field("threads", &self.pool.current_num_threads())
            .field("budget", &self.budget)
            .finish()
    }
}

impl Evaluations {
    /// # Panics
    /// The threads cannot be started (the process is out of threads).
    pub(crate) fn new(budget: Budget) -> Self {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(cores.max(2))
            .stack_size(EVALUATION_STACK)
            .thread_name(|i| format!("flotilla-eval-{i}"))
            .build()
            .expect("starting the evaluation threads");
        Self { pool, budget }
    }
}

impl Engine {
    /// Runs `work` (CEL evaluations, schema validations) on the evaluation
    /// threads, within the expression budget.
    ///
    /// # Errors
    /// The budget ran out.
    ///
    /// # Panics
    /// When `work` panics: the panic goes on in the caller, where the
    /// segment's guard fails the job as a defect.
    pub(crate) async fn off_runtime<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Exhausted> {
        let budget = self.inner.evaluations.budget;
        self.on_pool(move || budget.run(work)).await
    }

    /// Runs `work` on the evaluation threads, without a budget (compiling
    /// a definition, which evaluates nothing).
    ///
    /// # Panics
    /// When `work` panics, as [`Engine::off_runtime`].
    pub(crate) async fn on_pool<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.inner.evaluations.pool.spawn(move || {
            // Caught here: a panic on a pool thread would abort the process.
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(work));
            // The caller may be gone (its lease lost): nobody to tell.
            let _ = answer.send(outcome);
        });
        match answered.await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(_) => panic!("an evaluation thread dropped its work"),
        }
    }
}
