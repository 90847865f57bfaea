//! Where CEL and JSON Schema run: off the async runtime, on a bounded pool
//! (as many at once as the machine has cores), each CEL evaluation within
//! the budget (`workflow/budget.rs`), so an expression or a pattern that
//! runs long or builds much fails its own job without slowing the
//! heartbeats, the API or `/healthz`.

use std::sync::Arc;

use tokio::sync::Semaphore;

use super::Engine;
use crate::workflow::{Budget, Exhausted};

/// The pool's permits.
#[derive(Debug)]
pub(super) struct Evaluations {
    permits: Arc<Semaphore>,
    budget: Budget,
}

impl Evaluations {
    pub(super) fn new(budget: Budget) -> Self {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        Self {
            permits: Arc::new(Semaphore::new(cores.max(2))),
            budget,
        }
    }
}

impl Engine {
    /// Runs `work` (CEL evaluations, schema validations) on the bounded
    /// pool, within the expression budget.
    ///
    /// # Errors
    /// The budget ran out.
    ///
    /// # Panics
    /// When `work` panics: the panic goes on in the caller, where the
    /// segment's guard fails the job as a defect.
    pub(super) async fn off_runtime<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Exhausted> {
        let evaluations = &self.inner.evaluations;
        let _permit = evaluations
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the evaluation pool is never closed");
        let budget = evaluations.budget;
        match tokio::task::spawn_blocking(move || budget.run(work)).await {
            Ok(outcome) => outcome,
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Err(join) => panic!("an evaluation was cancelled: {join}"),
        }
    }
}
