//! Waiting jobs whose wait came due: the earliest timer of a job parked on
//! something else, or a Kafka request that ran out (`nodes/timers.rs` and
//! `nodes/kafka.rs` park them; this queues them again).

use flotilla_store::StoreError;
use flotilla_store::runs::idle::{self, DueWake};

use crate::Engine;

impl Engine {
    /// Queues again, attempt given back, the WAITING jobs whose earliest
    /// timer came due or whose Kafka requests ran out (their steps then
    /// time out by the retry rules). Returns how many.
    ///
    /// # Errors
    /// The database failed.
    pub async fn wake_due_waits(&self) -> Result<usize, StoreError> {
        let woken = idle::wake_due(self.pool(), self.now(), self.settings().sweep_batch).await?;
        let ran_out = woken
            .iter()
            .filter(|(_, why)| *why == DueWake::ReplyDeadline)
            .count();
        let timers = woken.len() - ran_out;
        if ran_out > 0 {
            metrics::counter!("flotilla_step_reply_timeouts_total").increment(ran_out as u64);
            tracing::info!(
                jobs = ran_out,
                "requests to Kafka targets ran out; their jobs are queued again"
            );
        }
        if timers > 0 {
            metrics::counter!("flotilla_waits_woken_by_timers_total").increment(timers as u64);
            tracing::debug!(
                jobs = timers,
                "timers came due while their jobs waited; queued again"
            );
        }
        if !woken.is_empty() {
            self.wake();
        }
        Ok(woken.len())
    }
}
