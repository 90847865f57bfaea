//! A reply from a Kafka target, matched to its request and kept on the
//! job's row (the executor of Kafka steps is `nodes/kafka.rs`).

use flotilla_contracts::WorkflowStepReply;
use flotilla_store::StoreError;
use flotilla_store::runs::step_requests::{self, ReplyMatch, StoredReply};

use crate::Engine;

/// What a reply came to, for the consumer's count and log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyOutcome {
    /// Matched and kept; the job was queued again when it waited.
    Matched { step: String, woken: bool },
    /// Dropped, and why: `repeat` (answered before), `stale` (no request
    /// of the job has this correlation id now), `wrong_topic` (not on its
    /// request's reply topic), `late` (at or past its request's
    /// deadline), `finished` (the job ended), `unknown_job`.
    Dropped(&'static str),
}

impl ReplyOutcome {
    /// The `outcome` label of `flotilla_step_replies_total`.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::Matched { .. } => "matched",
            Self::Dropped(reason) => reason,
        }
    }
}

impl Engine {
    /// Matches `reply`, read on `topic`, to its request and keeps it on
    /// the job's row (see the module). A reply for an earlier attempt, a
    /// finished job or an unknown one, on another topic than its
    /// request's reply topic, or past its request's deadline changes
    /// nothing and is reported as dropped; so is a repeat of one matched
    /// before.
    ///
    /// # Errors
    /// The database failed, or the job's row stayed locked by another
    /// session past [`Engine::row_lock_wait`] (about the world: the reply
    /// is to be read again).
    pub async fn record_reply(
        &self,
        reply: &WorkflowStepReply,
        topic: &str,
    ) -> Result<ReplyOutcome, StoreError> {
        let stored = StoredReply {
            result: reply.result().cloned(),
            error: reply.error().map(str::to_owned),
            retryable: reply.retryable(),
            received_at: self.now(),
        };
        let incoming = step_requests::IncomingReply {
            job_id: reply.job_id(),
            correlation_id: reply.correlation_id(),
            topic,
            reply: &stored,
        };
        let matched =
            step_requests::record_reply(self.pool(), incoming, self.row_lock_wait()).await?;
        let outcome = match matched {
            ReplyMatch::Recorded {
                step,
                woken,
                waited,
            } => {
                if woken {
                    self.wake();
                }
                if let Some(waited) = waited.and_then(|w| w.to_std().ok()) {
                    metrics::histogram!("flotilla_step_reply_seconds").record(waited.as_secs_f64());
                }
                ReplyOutcome::Matched { step, woken }
            }
            ReplyMatch::Repeat { .. } => ReplyOutcome::Dropped("repeat"),
            ReplyMatch::Stale => ReplyOutcome::Dropped("stale"),
            ReplyMatch::WrongTopic { step, expected } => {
                tracing::warn!(job_id = %reply.job_id(), correlation_id = %reply.correlation_id(), %step,
                    topic, expected = %expected, "a reply came on another topic than its request's reply topic");
                ReplyOutcome::Dropped("wrong_topic")
            }
            ReplyMatch::Late { .. } => ReplyOutcome::Dropped("late"),
            ReplyMatch::Finished(_) => ReplyOutcome::Dropped("finished"),
            ReplyMatch::UnknownJob => ReplyOutcome::Dropped("unknown_job"),
        };
        metrics::counter!("flotilla_step_replies_total", "outcome" => outcome.label()).increment(1);
        Ok(outcome)
    }
}
