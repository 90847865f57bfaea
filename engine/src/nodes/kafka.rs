//! Steps whose target is a pair of Kafka topics.
//!
//! Reaching one, a segment builds its request (the step's `rules`, as for a
//! call) and parks the job on it; the park's transaction writes the request
//! to the request outbox, which the relay publishes, so a request is never
//! sent for a park that did not commit and never lost once it did; a
//! request whose record would be larger than the relay publishes fails the
//! step as a defect at once instead. The reply, read by the reply
//! consumer, is matched by correlation id, taken only from its request's
//! reply topic and before its deadline, and kept on the step's request
//! under the row lock (`Engine::record_reply`, `ops/reply.rs`); a WAITING job is queued again at once, and its next segment judges the
//! reply (`output_schema`, `validate`) and checkpoints it with its event, or
//! fails the step by the retry rules. A request past its deadline puts the
//! job back in the queue ([`Engine::wake_due_waits`]) and the step
//! fails as timed out. Each attempt sends a new request with a new
//! correlation id, so a reply to an earlier one finds nothing to match.
//!
//! A target with `max_concurrent` lets that many of its requests await
//! replies at once, across the fleet: the segment takes a slot before it
//! sends (`Engine::slot_for`, `flotilla_store::runs::target_slots`) and
//! waits, holding its lease, while all are held, as a call waits for a
//! permit of an HTTP target.

use chrono::{DateTime, Utc};
use flotilla_contracts::{StepRequestParts, WorkflowStepRequest};
use flotilla_store::runs::RunRow;
use flotilla_store::runs::step_requests::{
    self, AwaitedReplies, OutgoingRequest, RequestEntry, StoredReply,
};
use flotilla_store::runs::target_slots;
use serde_json::Value as Json;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::Engine;
use flotilla_targets::kafka::KafkaTarget;
use flotilla_targets::{RetryClass, StepFailure};
use flotilla_workflow::assemble;
use flotilla_workflow::expr::Scope;

use super::call::over_budget;
use super::{Began, Nodes, Wait, checkpoint};

/// Where a Kafka step of the current attempt stands.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum KafkaStep {
    /// This attempt sent no request yet: this one goes with the park.
    Send(Box<OutgoingRequest>),
    /// Sent, no reply yet, the deadline ahead.
    Waiting(DateTime<Utc>),
    /// The reply's answer, to be judged.
    Answered(Json),
    /// A refusal, a timeout: the step's failure.
    Failed(StepFailure),
    /// Waiting for a slot of its capped target, the segment lost its lease
    /// or was asked to cancel: nothing is sent.
    Interrupted,
}

/// Where step `step` of `row` stands at `now`; `None`: this attempt sent
/// no request yet.
///
/// # Errors
/// The row's requests do not read: a defect of the job.
pub(crate) fn state_of(
    row: &RunRow,
    step: &str,
    now: DateTime<Utc>,
) -> Result<Option<KafkaStep>, StepFailure> {
    let Some(entry) = step_requests::entry_of(row, step).map_err(StepFailure::Defect)? else {
        return Ok(None);
    };
    // An earlier attempt's request (its reply, or its silence) is that
    // attempt's: this one asks again.
    if entry.attempt != row.attempt {
        return Ok(None);
    }
    Ok(Some(match entry.reply {
        Some(StoredReply {
            result: Some(result),
            ..
        }) => KafkaStep::Answered(result),
        Some(StoredReply {
            error, retryable, ..
        }) => {
            let error = error.unwrap_or_else(|| "the reply held no answer".into());
            let message = format!("{} answered: {error}", entry.topic);
            KafkaStep::Failed(if retryable {
                StepFailure::retryable(RetryClass::Other, message)
            } else {
                StepFailure::Verdict {
                    message,
                    violations: vec![error],
                }
            })
        }
        None if entry.deadline <= now => KafkaStep::Failed(StepFailure::retryable(
            RetryClass::Timeout,
            format!(
                "no reply on {} by {} (request {})",
                entry.reply_topic,
                entry
                    .deadline
                    .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                entry.correlation_id
            ),
        )),
        None => KafkaStep::Waiting(entry.deadline),
    }))
}

/// How long a request waits for its reply: the target's timeout, which the
/// step's own `timeout_ms` may shorten.
pub(crate) fn reply_timeout(step_timeout_ms: Option<u64>, target: &KafkaTarget) -> Duration {
    step_timeout_ms
        .map(Duration::from_millis)
        .map_or(target.timeout, |step| step.min(target.timeout))
}

/// The first and the longest pause between two tries at a slot of a
/// capped target.
const SLOT_POLL: (Duration, Duration) = (Duration::from_millis(20), Duration::from_millis(500));

/// What a wait for a slot of a capped target needs to know.
pub(crate) struct SlotWait<'a> {
    pub target: &'a str,
    pub cap: usize,
    pub step: &'a str,
    /// The request the slot is for.
    pub correlation_id: Uuid,
    /// How long the request will wait for its reply (the slot's life).
    pub timeout: Duration,
    /// The wait gives up after this long (the segment's time left counts).
    pub patience: Duration,
    /// Either cancelled: the wait stops, nothing taken.
    pub interrupt: (&'a CancellationToken, &'a CancellationToken),
}

impl Engine {
    /// Takes a slot of a capped Kafka target for `wait.step` of `job_id`,
    /// trying again while all are held (a reply or a deadline frees one);
    /// the instant it was taken at, which the request's deadline is counted
    /// from, or `None` when interrupted.
    ///
    /// # Errors
    /// No slot within the wait's patience (retryable, a timeout), or the
    /// database failed (retryable).
    pub(crate) async fn slot_for(
        &self,
        job_id: Uuid,
        wait: SlotWait<'_>,
    ) -> Result<Option<DateTime<Utc>>, StepFailure> {
        let begun = tokio::time::Instant::now();
        let mut pause = SLOT_POLL.0;
        let mut counted = false;
        loop {
            let now = self.now();
            let claim = target_slots::Claim {
                target: wait.target,
                job_id,
                step: wait.step,
                correlation_id: wait.correlation_id,
                expires_at: now
                    + chrono::TimeDelta::from_std(wait.timeout).unwrap_or(chrono::TimeDelta::MAX),
            };
            match target_slots::take(self.pool(), claim, wait.cap, now).await {
                Ok(target_slots::Take::Taken) => return Ok(Some(now)),
                Ok(target_slots::Take::Full) => {}
                Err(e) => {
                    return Err(StepFailure::retryable(
                        RetryClass::Other,
                        format!(
                            "step {}: taking a slot of target {}: {e}",
                            wait.step, wait.target
                        ),
                    ));
                }
            }
            if !counted {
                counted = true;
                metrics::counter!("flotilla_step_request_slot_waits_total", "target" => wait.target.to_owned())
                    .increment(1);
            }
            if begun.elapsed() + pause > wait.patience {
                return Err(StepFailure::retryable(
                    RetryClass::Timeout,
                    format!(
                        "step {}: all {} requests target {} may have awaiting replies stayed unanswered for {} ms",
                        wait.step,
                        wait.cap,
                        wait.target,
                        begun.elapsed().as_millis()
                    ),
                ));
            }
            tokio::select! {
                () = wait.interrupt.0.cancelled() => return Ok(None),
                () = wait.interrupt.1.cancelled() => return Ok(None),
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(SLOT_POLL.1);
        }
    }
}

/// Room a request's record needs beside its value and the headers
/// counted in [`record_bytes`]: its key, `content-type`, and the framing
/// of the record and its batch.
const RECORD_OVERHEAD_BYTES: usize = 256;

/// The bytes the record of `contract` takes: its value in JSON (an Avro
/// encoding is never larger: the request travels there as the same JSON
/// text, without the field names), its headers and their overhead.
fn record_bytes(contract: &WorkflowStepRequest, trace: [(&str, Option<&str>); 2]) -> usize {
    let value = flotilla_contracts::json::encode(contract).map_or(usize::MAX, |bytes| bytes.len());
    let trace = trace
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)));
    let headers: usize = contract
        .headers()
        .iter()
        .map(|(name, value)| (*name, value.as_str()))
        .chain(trace)
        .map(|(name, value)| name.len() + value.len())
        .sum();
    value
        .saturating_add(headers)
        .saturating_add(RECORD_OVERHEAD_BYTES)
}

/// The request of step `step` for this attempt: a fresh correlation id,
/// the deadline `timeout` ahead (the step's `timeout_ms` may shorten the
/// target's), in the target's encoding, its record no larger than
/// `max_record_bytes`.
///
/// # Errors
/// The request breaks the contract's rules or its record would be larger
/// than the relay publishes: a defect of the job.
pub(crate) fn outgoing(
    row: &RunRow,
    (step, step_timeout_ms): (&str, Option<u64>),
    (target, fleet): (&KafkaTarget, flotilla_targets::kafka::Encoding),
    (request, max_record_bytes): (Json, usize),
    (now, correlation_id): (DateTime<Utc>, Uuid),
) -> Result<OutgoingRequest, StepFailure> {
    let timeout = reply_timeout(step_timeout_ms, target);
    let deadline = now + chrono::TimeDelta::from_std(timeout).unwrap_or(chrono::TimeDelta::MAX);
    let contract = WorkflowStepRequest::new(StepRequestParts {
        job_id: row.job_id,
        step_name: step.to_owned(),
        attempt: row.attempt.max(1),
        correlation_id,
        reply_topic: target.reply_topic.clone(),
        request,
        deadline,
    })
    .map_err(|e| {
        StepFailure::Defect(format!("step {step}: the request breaks the contract: {e}"))
    })?;
    // Refused here, not by the relay: a record too large would never be
    // sent, and its step would time out at every attempt.
    let size = record_bytes(
        &contract,
        [
            ("traceparent", row.traceparent.as_deref()),
            ("tracestate", row.tracestate.as_deref()),
        ],
    );
    if size > max_record_bytes {
        return Err(StepFailure::Defect(format!(
            "step {step}: the request to {} is {size} bytes, {} over the limit of {max_record_bytes} bytes a record may have (FLOTILLA_MAX_EVENT_BYTES, the relay's --max-message-bytes)",
            target.request_topic,
            size - max_record_bytes
        )));
    }
    let payload = serde_json::to_value(&contract)
        .map_err(|e| StepFailure::Defect(format!("step {step}: the request: {e}")))?;
    Ok(OutgoingRequest {
        step: step.to_owned(),
        entry: RequestEntry {
            correlation_id,
            attempt: row.attempt,
            topic: target.request_topic.clone(),
            reply_topic: target.reply_topic.clone(),
            deadline: contract.deadline(),
            requested_at: Some(now),
            reply: None,
        },
        encoding: target.encoding_or(fleet).as_str(),
        payload,
        traceparent: row.traceparent.clone(),
        tracestate: row.tracestate.clone(),
    })
}

/// What a segment gathers about the replies it will wait for.
#[derive(Debug, Default)]
pub(crate) struct Replies(AwaitedReplies);

impl Replies {
    /// Step `step` waits for the reply to a request sent earlier.
    pub(crate) fn wait(&mut self, step: String, deadline: DateTime<Utc>) {
        self.0.steps.push(step);
        self.0.deadline = Some(self.0.deadline.map_or(deadline, |d| d.min(deadline)));
    }

    /// Step `request.step` sends `request` with the park and waits for it.
    pub(crate) fn send(&mut self, request: OutgoingRequest) {
        self.wait(request.step.clone(), request.entry.deadline);
        self.0.sending.push(request);
    }

    pub(crate) fn into_inner(self) -> AwaitedReplies {
        self.0
    }
}

impl Nodes<'_> {
    /// Starts step `index` of Kafka target `target`: its reply's answer,
    /// a wait for the reply, or the request to send with the park.
    /// `may_wait`: whether it may wait for a slot of a capped target.
    pub(super) async fn begin_kafka(
        &self,
        index: usize,
        scope: &Scope,
        target: &KafkaTarget,
        may_wait: bool,
    ) -> Began {
        let name = self.compiled.steps[index].definition.name.clone();
        match self.holds(index, scope).await {
            Ok(false) => return Began::Answer(checkpoint(name, None, None)),
            Ok(true) => {}
            Err(failed) => return Began::Failed(failed),
        }
        match self.kafka_step(index, scope, target, may_wait).await {
            Ok(KafkaStep::Answered(result)) => match self.judge(index, &result, scope).await {
                Ok(()) => Began::Answer(checkpoint(name, None, Some(result))),
                Err(failed) => Began::Failed(failed),
            },
            Ok(KafkaStep::Failed(failed)) | Err(failed) => Began::Failed(failed),
            Ok(KafkaStep::Waiting(deadline)) => Began::Waits(Wait::Reply(deadline)),
            Ok(KafkaStep::Send(request)) => Began::Waits(Wait::Send(request)),
            Ok(KafkaStep::Interrupted) => Began::Interrupted,
        }
    }

    /// Where Kafka step `index` stands for this attempt; when this attempt
    /// has sent no request, the request to send with the park.
    async fn kafka_step(
        &self,
        index: usize,
        scope: &Scope,
        target: &KafkaTarget,
        may_wait: bool,
    ) -> Result<KafkaStep, StepFailure> {
        let step = &self.compiled.steps[index];
        let name = &step.definition.name;
        if step.for_each.is_some() || step.definition.paged {
            return Err(StepFailure::Defect(format!(
                "step {name}: a Kafka target is not called per item or by pages"
            )));
        }
        let now = self.engine.now();
        if let Some(state) = state_of(self.claimed.row(), name, now)? {
            return Ok(state);
        }
        let built = {
            let (compiled, scope) = (self.compiled.clone(), scope.clone());
            self.engine
                .off_runtime(move || assemble(&compiled.steps[index].rules, &scope))
                .await
        };
        let request = match built {
            Ok(Ok(request)) => request,
            Ok(Err(e)) => {
                return Err(StepFailure::Defect(format!(
                    "step {name}: building the request: {e}"
                )));
            }
            Err(exhausted) => return Err(over_budget(name, "building the request", &exhausted)),
        };
        // A capped target: the request's clock starts once its slot is
        // taken. With a checkpoint write under way (its transaction holds
        // the job's row, which the heartbeat renews) it tries once only.
        let correlation_id = uuid::Uuid::new_v4();
        let now = match target.max_concurrent {
            None => now,
            Some(cap) => {
                let patience = Duration::from_millis(self.compiled.definition.deadline_ms)
                    .saturating_sub(self.started.elapsed());
                let timeout = reply_timeout(step.definition.timeout_ms, target);
                let wait = SlotWait {
                    target: &step.definition.target,
                    cap,
                    step: name,
                    correlation_id,
                    timeout,
                    patience: if may_wait {
                        patience.min(timeout)
                    } else {
                        Duration::ZERO
                    },
                    interrupt: (self.lease_lost, self.cancel_asked),
                };
                match self.engine.slot_for(self.claimed.job_id(), wait).await? {
                    Some(taken_at) => taken_at,
                    None => return Ok(KafkaStep::Interrupted),
                }
            }
        };
        let request = outgoing(
            self.claimed.row(),
            (name, step.definition.timeout_ms),
            (target, self.engine.targets().fleet_encoding()),
            (request, self.engine.settings().max_event_bytes),
            (now, correlation_id),
        )?;
        Ok(KafkaStep::Send(Box::new(request)))
    }
}
