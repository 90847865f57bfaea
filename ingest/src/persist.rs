//! Making one batch durable: classify every message, submit the requests in
//! one transaction, keep the signals and match the replies to Kafka
//! targets' requests (one transaction each, after the requests),
//! dead-letter the rest. Offsets are not touched here.

use flotilla_codec::CodecError;
use flotilla_contracts::avro::AvroMessage;
use flotilla_contracts::{WorkflowRunRequest, WorkflowRunSignal, WorkflowStepReply};
use flotilla_store::{RunStatus, StoreError};
use rdkafka::Message;
use rdkafka::message::Headers;

use crate::dead_letter::{self, DeadLetter};
use crate::{Received, RequestConsumer};
use flotilla_engine::ops::reply::ReplyOutcome;
use flotilla_engine::ops::signal::{Signal, SignalError};
use flotilla_engine::{Submission, SubmitError, Submitted, WorkflowRef};

/// What a persisted batch came to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// New QUEUED rows.
    pub created: usize,
    /// Redelivered requests whose rows exist already.
    pub existing: usize,
    /// New FAILED rows (unknown workflow, input that fails the schema).
    pub refused: usize,
    /// Records sent to the dead-letter topic (undecodable, oversize, conflicting).
    pub dead_lettered: usize,
    /// Signals kept (or repeats of signals kept before).
    pub signals: usize,
    /// Replies matched to their requests.
    pub replies: usize,
    /// Replies dropped: repeats, for earlier attempts, on another topic
    /// than their request's reply topic, late, for finished or unknown jobs.
    pub replies_dropped: usize,
}

/// Why a batch could not be persisted now; the same batch is retried.
#[derive(Debug, thiserror::Error)]
pub enum Outage {
    #[error("database: {0}")]
    Store(#[from] StoreError),
    #[error("schema registry: {0}")]
    Registry(CodecError),
    #[error("dead-letter topic {topic}: {error}")]
    DeadLetter {
        topic: String,
        error: rdkafka::error::KafkaError,
    },
    /// Kafka did not say where the group's committed offsets are.
    #[error("reading the group's committed offsets: {0}")]
    Committed(String),
    /// Kafka did not say which offsets an instant gives (where a reply
    /// partition with no offset anywhere starts).
    #[error("finding the offsets of an instant: {0}")]
    OffsetsAt(String),
    /// A signal's job was written by a newer release than this worker
    /// (a rolling deploy under way): a newer worker takes it, or this one
    /// once replaced; it is not the signal's fault.
    #[error("signal for job {job_id}: {reason}")]
    TooNew { job_id: uuid::Uuid, reason: String },
    /// Seeking a partition back to the database's offset failed.
    #[error("seeking {partition} back to the database's offset: {error}")]
    Seek {
        partition: String,
        error: rdkafka::error::KafkaError,
    },
}

enum Classified {
    Submit(Submission),
    Signal(Signal),
    Reply(WorkflowStepReply),
    DeadLetter(DeadLetter),
}

impl RequestConsumer {
    /// Makes every message of `batch` durable: rows in one transaction,
    /// dead letters acknowledged by the broker. Offsets are not touched.
    ///
    /// # Errors
    /// An [`Outage`]: nothing may be committed for this batch; retry it.
    pub async fn persist(&self, batch: &[Received]) -> Result<BatchReport, Outage> {
        let mut report = BatchReport::default();
        let mut letters: Vec<(&Received, DeadLetter)> = Vec::new();
        let mut submitted: Vec<&Received> = Vec::new();
        let mut submissions = Vec::new();
        let mut signals: Vec<(&Received, Signal)> = Vec::new();
        let mut replies: Vec<(&Received, WorkflowStepReply)> = Vec::new();
        for message in batch {
            match self.classify(message).await? {
                Classified::Submit(submission) => {
                    submitted.push(message);
                    submissions.push(submission);
                }
                Classified::Signal(signal) => signals.push((message, signal)),
                Classified::Reply(reply) => replies.push((message, reply)),
                Classified::DeadLetter(letter) => letters.push((message, letter)),
            }
        }
        let results = self.engine.submit_batch(submissions).await?;
        for (message, result) in submitted.into_iter().zip(results) {
            match result {
                Ok(Submitted::Created(row)) if row.status == RunStatus::Failed => {
                    report.refused += 1
                }
                Ok(Submitted::Created(_)) => report.created += 1,
                Ok(Submitted::Existing(_) | Submitted::Removed(_)) => report.existing += 1,
                Err(SubmitError::Conflict(job_id)) => {
                    tracing::warn!(%job_id, partition = message.partition(), offset = message.offset(),
                        "request conflicts with the existing job; the original stays, the request is dead-lettered");
                    metrics::counter!("flotilla_request_conflicts_total").increment(1);
                    let reason = format!(
                        "job {job_id} exists with different content; the original job stays"
                    );
                    letters.push((
                        message,
                        DeadLetter {
                            code: "conflict",
                            reason,
                        },
                    ));
                }
                Err(SubmitError::Unstorable(unstorable)) => {
                    tracing::warn!(partition = message.partition(), offset = message.offset(),
                        reason = %unstorable, "request cannot be stored; dead-lettered");
                    letters.push((
                        message,
                        DeadLetter {
                            code: "unstorable",
                            reason: format!("the request cannot be stored: {unstorable}"),
                        },
                    ));
                }
                Err(other) => {
                    letters.push((
                        message,
                        DeadLetter {
                            code: "refused",
                            reason: other.to_string(),
                        },
                    ));
                }
            }
        }
        // After the batch's requests, so a signal may follow its job's
        // request in the same batch; each waits a bounded time for its
        // job's row lock.
        let (kept, refused) = self.keep_signals(signals).await?;
        report.signals += kept;
        letters.extend(refused);
        // Replies to Kafka targets' requests, one at a time: each is
        // matched under its job's row lock, waited for a bounded time (a
        // row held elsewhere is an outage: the batch is tried again).
        for (message, reply) in replies {
            match self.engine.record_reply(&reply, message.topic()).await {
                Ok(ReplyOutcome::Matched { .. }) => report.replies += 1,
                Ok(dropped) => {
                    report.replies_dropped += 1;
                    tracing::info!(job_id = %reply.job_id(), correlation_id = %reply.correlation_id(),
                        reason = dropped.label(), partition = message.partition(), offset = message.offset(),
                        "reply dropped");
                }
                Err(store) if !store.is_about_the_data() => return Err(Outage::Store(store)),
                Err(e) => letters.push((
                    message,
                    DeadLetter {
                        code: "refused",
                        reason: e.to_string(),
                    },
                )),
            }
        }
        for (message, letter) in &letters {
            let producer = self.dead_letter_producer();
            let topic = self.settings.dead_letter_topic_of(message.topic());
            if let Err(e) = dead_letter::send(&producer, &topic, message, letter).await {
                self.replace_if_broken(&producer);
                return Err(Outage::DeadLetter { topic, error: e });
            }
            metrics::counter!("flotilla_requests_dead_lettered_total", "code" => letter.code)
                .increment(1);
        }
        // The tally is for the console; the dead letters themselves are
        // already on their topic, so a failure here is only logged.
        let codes: Vec<&str> = letters.iter().map(|(_, letter)| letter.code).collect();
        if let Err(e) = self.engine.tally_dead_letters(&codes).await {
            tracing::warn!(error = %e, count = codes.len(), "counting dead letters by reason failed");
            metrics::counter!("flotilla_dead_letter_tally_failures_total").increment(1);
        }
        report.dead_lettered = letters.len();
        Ok(report)
    }

    /// Replaces the dead-letter producer when it can send nothing more (a
    /// fatal error): the batch is retried with the new one.
    fn replace_if_broken(&self, producer: &rdkafka::producer::FutureProducer) {
        if !dead_letter::is_broken(producer) {
            return;
        }
        match dead_letter::producer(&self.settings.broker) {
            Ok(fresh) => {
                let old = std::mem::replace(
                    &mut *self
                        .dead_letters
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner),
                    fresh,
                );
                // librdkafka can block in a client's destructor.
                std::thread::spawn(move || drop(old));
                metrics::counter!("flotilla_dead_letter_producer_replaced_total").increment(1);
                tracing::warn!("the dead-letter producer hit a fatal error; replaced it");
            }
            Err(e) => {
                tracing::error!(error = %e, "replacing the broken dead-letter producer failed")
            }
        }
    }

    /// Decodes a message of the contract; a registry that does not answer
    /// is an outage, a message that does not decode its dead letter.
    async fn decode<M: AvroMessage>(
        &self,
        payload: &[u8],
    ) -> Result<Result<M, DeadLetter>, Outage> {
        let dead = |code: &'static str, reason: String| Ok(Err(DeadLetter { code, reason }));
        match self.codec.decode(payload).await {
            Ok(message) => Ok(Ok(message)),
            Err(e) if e.is_transient() => Err(Outage::Registry(e)),
            Err(CodecError::Decode(e)) => dead(e.code(), e.to_string()),
            Err(CodecError::NoRegistry(_)) => {
                dead("no_registry", CodecError::NoRegistry(0).to_string())
            }
            Err(e) => dead("undecodable", e.to_string()),
        }
    }

    async fn classify(&self, message: &Received) -> Result<Classified, Outage> {
        let dead = |code: &'static str, reason: String| {
            Ok(Classified::DeadLetter(DeadLetter { code, reason }))
        };
        if let Some(size) = message.dropped_value_bytes() {
            let limit = self.settings.max_request_bytes;
            return dead(
                "oversize",
                format!("request of {size} bytes is over the limit of {limit} bytes"),
            );
        }
        let payload = message.payload().unwrap_or_default();
        if self.settings.is_reply_topic(message.topic()) {
            return Ok(match self.decode::<WorkflowStepReply>(payload).await? {
                Ok(reply) => Classified::Reply(reply),
                Err(letter) => Classified::DeadLetter(letter),
            });
        }
        if self.settings.is_signal_topic(message.topic()) {
            let signal: WorkflowRunSignal = match self.decode(payload).await? {
                Ok(signal) => signal,
                Err(letter) => return Ok(Classified::DeadLetter(letter)),
            };
            // Without a key of its own, a record's place is its key: the
            // same record read again is the same signal.
            let key = signal.idempotency_key().map_or_else(
                || {
                    format!(
                        "kafka:{}:{}:{}",
                        message.topic(),
                        message.partition(),
                        message.offset()
                    )
                },
                str::to_owned,
            );
            return Ok(Classified::Signal(Signal {
                job_id: signal.job_id(),
                name: signal.name().to_owned(),
                payload: signal.payload().clone(),
                source: signal.source().clone(),
                idempotency_key: key,
            }));
        }
        let request: WorkflowRunRequest = match self.decode(payload).await? {
            Ok(request) => request,
            Err(letter) => return Ok(Classified::DeadLetter(letter)),
        };
        let header = |name: &str| {
            message.headers().and_then(|headers| {
                headers
                    .iter()
                    .find(|h| h.key.eq_ignore_ascii_case(name))
                    .and_then(|h| h.value)
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .map(str::to_owned)
            })
        };
        let (producer_traceparent, producer_tracestate) =
            (header("traceparent"), header("tracestate"));
        // The consumer span continues the producer's trace; the run keeps
        // this span's context, so everything the job does later hangs under
        // it. Without trace export the producer's traceparent is kept as is.
        let span = tracing::info_span!(
            "process",
            otel.name = format!("{} process", message.topic()),
            otel.kind = "consumer",
            messaging.system = "kafka",
            messaging.operation.type = "process",
            messaging.destination.name = %message.topic(),
            messaging.destination.partition.id = message.partition(),
            messaging.kafka.offset = message.offset(),
            messaging.consumer.group.name = %self.settings.group,
            messaging.kafka.message.key = %request.job_id(),
            job_id = %request.job_id(),
            workflow_name = %request.workflow_name(),
            trace_id = flotilla_runtime::trace::trace_id(producer_traceparent.as_deref()),
        );
        let (traceparent, tracestate) =
            flotilla_runtime::trace::enter_trace(&span, producer_traceparent, producer_tracestate);
        // In range: the contract's rules were checked at decode.
        let priority = request
            .priority()
            .and_then(|p| i16::try_from(p).ok())
            .unwrap_or(0);
        Ok(Classified::Submit(Submission {
            metadata: request.metadata().cloned(),
            priority,
            job_id: request.job_id(),
            workflow: match request.workflow_version() {
                Some(version) => WorkflowRef::Version(request.workflow_name().to_owned(), version),
                None => WorkflowRef::Stored(request.workflow_name().to_owned()),
            },
            input: request.into_input(),
            traceparent,
            tracestate,
        }))
    }
}

/// Jobs whose signals one batch keeps at once (review M6): a flood of
/// signals to many jobs costs the batch a few row round trips each, not
/// one after another, while each job's signals stay in partition order.
const SIGNAL_JOBS_AT_ONCE: usize = 4;

impl RequestConsumer {
    /// Keeps a batch's signals: those of one job in order, up to
    /// [`SIGNAL_JOBS_AT_ONCE`] jobs at a time. Returns how many were kept
    /// and the dead letters of those refused.
    ///
    /// # Errors
    /// An outage met by any of them: the batch is tried again (the signals
    /// kept meanwhile come again as repeats of their keys, and change
    /// nothing).
    async fn keep_signals<'m>(
        &self,
        signals: Vec<(&'m Received, Signal)>,
    ) -> Result<(usize, Vec<(&'m Received, DeadLetter)>), Outage> {
        use futures_util::StreamExt as _;
        let mut by_job: Vec<Vec<(&'m Received, Signal)>> = Vec::new();
        let mut index: std::collections::HashMap<uuid::Uuid, usize> =
            std::collections::HashMap::new();
        for (message, signal) in signals {
            let at = *index.entry(signal.job_id).or_insert_with(|| {
                by_job.push(Vec::new());
                by_job.len() - 1
            });
            by_job[at].push((message, signal));
        }
        // Made here, not in the stream's closure: a closure returning a
        // future that borrows the batch is not `Send` for every lifetime.
        let jobs: Vec<_> = by_job
            .into_iter()
            .map(|signals| self.keep_signals_of_one_job(signals))
            .collect();
        let outcomes: Vec<_> = futures_util::stream::iter(jobs)
            .buffer_unordered(SIGNAL_JOBS_AT_ONCE)
            .collect()
            .await;
        let (mut kept, mut letters) = (0, Vec::new());
        for outcome in outcomes {
            let (more, refused) = outcome?;
            kept += more;
            letters.extend(refused);
        }
        Ok((kept, letters))
    }

    /// Keeps one job's signals, in order.
    async fn keep_signals_of_one_job<'m>(
        &self,
        signals: Vec<(&'m Received, Signal)>,
    ) -> Result<(usize, Vec<(&'m Received, DeadLetter)>), Outage> {
        let (mut kept, mut letters) = (0, Vec::new());
        for (message, signal) in signals {
            match self.engine.send_signal(signal).await {
                Ok(_) => kept += 1,
                Err(e) => {
                    let letter = refused_signal(e)?;
                    tracing::warn!(partition = message.partition(), offset = message.offset(),
                        code = letter.code, reason = %letter.reason, "signal refused; dead-lettered");
                    letters.push((message, letter));
                }
            }
        }
        Ok((kept, letters))
    }
}

/// What a refused signal comes to: a dead letter when the refusal is about
/// the signal, an outage (the batch tried again) when it is about the
/// world: the database failed (a signal kept already repeats its key,
/// changing nothing), or the job needs a newer release than this worker,
/// as during a rolling deploy.
fn refused_signal(refused: SignalError) -> Result<DeadLetter, Outage> {
    match refused {
        SignalError::Store(store) if !store.is_about_the_data() => Err(Outage::Store(store)),
        too_new @ SignalError::TooNew { job_id, .. } => Err(Outage::TooNew {
            job_id,
            reason: too_new.to_string(),
        }),
        e => Ok(DeadLetter {
            code: e.code().unwrap_or("refused"),
            reason: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_for_a_job_of_a_newer_release_is_retried_not_dead_lettered() {
        let job_id = uuid::Uuid::new_v4();
        let too_new = SignalError::TooNew {
            job_id,
            needs: 9,
            reads: 1,
        };
        assert!(
            matches!(refused_signal(too_new), Err(Outage::TooNew { job_id: j, .. }) if j == job_id)
        );
        let not_awaited = SignalError::NotAwaited {
            job_id,
            name: "x".into(),
        };
        let letter = refused_signal(not_awaited).unwrap();
        assert_eq!(letter.code, "not_awaited");
        let late = SignalError::TimedOut {
            job_id,
            step: "approve".into(),
        };
        assert_eq!(refused_signal(late).unwrap().code, "wait_timed_out");
    }
}
