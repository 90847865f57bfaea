//! Publishing outbox rows: encode, produce keyed by job id to the partition
//! the recorded count maps it to (the `placement` module), with the stored
//! trace context, await the broker's acknowledgements, then mark.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use flotilla_codec::{Codec, CodecError};
use flotilla_contracts::WorkflowRunEvent;
use flotilla_runtime::kafka::security::{is_refused_access, is_refused_for_itself};
use flotilla_store::outbox::relay::{self as outbox, EventKey, PendingEvent};
use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer as _, PurgeConfig};

use crate::producer::Producer;
use rdkafka::types::RDKafkaErrorCode;
use sqlx::PgPool;

use crate::buckets::HeldBuckets;
use crate::placement::RecordedCount;

/// Header naming the event type, so consumers can route without decoding.
pub const EVENT_TYPE_HEADER: &str = "flotilla.event-type";

/// What one marking did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Acknowledged and marked PUBLISHED.
    pub published: usize,
    /// Refused for themselves (an attempt counted) or unreadable (FAILED).
    pub failed: usize,
    /// Not sent or not acknowledged because of the world (broker or
    /// registry unreachable, a queue full, no acknowledgement in time): no
    /// attempt spent, sent again after a pause.
    pub deferred: usize,
    /// The rows `failed` and `deferred` count, by class and reason.
    pub misses: BTreeMap<(Class, Reason), usize>,
}

/// Whose fault a miss is: the `class` label of
/// `flotilla_relay_publish_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    /// The record itself: counts an attempt (or fails the row at once).
    Message,
    /// The broker or the registry: spends nothing.
    World,
}

impl Class {
    /// The metric's label value.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Message => "message",
            Self::World => "world",
        }
    }
}

/// Why a row did not go out: the `reason` label of
/// `flotilla_relay_publish_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// Larger than the producer or the broker takes.
    TooLarge,
    /// Not a valid record: refused as corrupt or invalid, a payload that
    /// does not decode, an event that breaks a rule.
    Invalid,
    /// No connection to the broker, or no leader for the partition.
    Unreachable,
    /// Fewer replicas in sync than the topic's `min.insync.replicas`: the
    /// brokers refuse every `acks=all` write to it (brokers down, or a
    /// topic replicated fewer times than it asks).
    NotEnoughReplicas,
    /// The producer's local queue is full.
    QueueFull,
    /// No acknowledgement within the delivery timeout (or the round).
    Timeout,
    /// Credentials or ACLs refused (authentication, authorization, TLS).
    RefusedAccess,
    /// Not handed to the producer: the bucket's lease could run out before
    /// the producer would give up on the record (renewals late, or this
    /// process stalled).
    Lease,
    /// The schema registry could not be asked, or refused the schema.
    Registry,
    /// Anything else.
    Other,
}

impl Reason {
    /// The metric's label value.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::TooLarge => "too_large",
            Self::Invalid => "invalid",
            Self::Unreachable => "unreachable",
            Self::NotEnoughReplicas => "not_enough_replicas",
            Self::QueueFull => "queue_full",
            Self::Timeout => "timeout",
            Self::RefusedAccess => "refused_access",
            Self::Lease => "lease",
            Self::Registry => "registry",
            Self::Other => "other",
        }
    }

    /// The reason of a broker or producer error code.
    fn of(code: RDKafkaErrorCode) -> Self {
        use RDKafkaErrorCode as Code;
        match code {
            Code::MessageSizeTooLarge | Code::MessageBatchTooLarge => Self::TooLarge,
            Code::InvalidMessageSize | Code::InvalidMessage | Code::InvalidRecord => Self::Invalid,
            Code::BrokerTransportFailure
            | Code::AllBrokersDown
            | Code::Resolve
            | Code::NetworkException
            | Code::BrokerNotAvailable
            | Code::LeaderNotAvailable
            | Code::NotLeaderForPartition => Self::Unreachable,
            Code::NotEnoughReplicas | Code::NotEnoughReplicasAfterAppend => Self::NotEnoughReplicas,
            Code::QueueFull => Self::QueueFull,
            Code::MessageTimedOut | Code::RequestTimedOut | Code::OperationTimedOut => {
                Self::Timeout
            }
            Code::Authentication
            | Code::SaslAuthenticationFailed
            | Code::UnsupportedSASLMechanism
            | Code::IllegalSASLState
            | Code::SSL
            | Code::TopicAuthorizationFailed
            | Code::ClusterAuthorizationFailed
            | Code::TransactionalIdAuthorizationFailed => Self::RefusedAccess,
            _ => Self::Other,
        }
    }
}

/// Why a row did not go out, by whose fault it is.
#[derive(Debug)]
enum Miss {
    /// The message itself (too large, invalid): counts an attempt.
    Message(Reason, String),
    /// The world (unreachable, full, too slow): spends nothing.
    World(Reason, String),
}

impl From<Miss> for Outcome {
    fn from(miss: Miss) -> Self {
        match miss {
            Miss::Message(reason, error) => Outcome::Refused(reason, error),
            Miss::World(reason, error) => Outcome::Deferred(reason, error),
        }
    }
}

/// Classifies a producer or broker error: the class decides whether an
/// attempt is spent, the reason only labels the metric.
fn classify(error: &KafkaError) -> Miss {
    let code = error.rdkafka_error_code();
    let reason = if is_refused_access(error) {
        // Credentials or rights refused: the alert's counter, shared with
        // the worker's consumer; never the fault of the record.
        metrics::counter!("flotilla_kafka_access_refused_total").increment(1);
        Reason::RefusedAccess
    } else {
        code.map_or(Reason::Other, Reason::of)
    };
    match code {
        Some(code) if is_refused_for_itself(code) => Miss::Message(reason, error.to_string()),
        _ => Miss::World(reason, error.to_string()),
    }
}

/// Classifies an encoding error: the registry unavailable, refusing the
/// event schema (409, 422: the schema is the relay's, the same for every
/// event, so an operator must fix the subject's compatibility) or
/// misconfigured is the world's fault and spends nothing; an event that
/// breaks a rule is the message's.
fn classify_encoding(error: &CodecError) -> Miss {
    let text = format!("encoding: {error}");
    match error {
        e if e.is_transient() => Miss::World(Reason::Registry, text),
        CodecError::RegistryRefused { .. } | CodecError::Settings(_) => {
            metrics::counter!("flotilla_relay_schema_refused_total").increment(1);
            Miss::World(Reason::Registry, text)
        }
        _ => Miss::Message(Reason::Invalid, text),
    }
}

/// How one row's send ended.
#[derive(Debug)]
pub enum Outcome {
    /// The broker has it.
    Acked,
    /// Refused for itself: counts an attempt toward FAILED.
    Refused(Reason, String),
    /// Held back by the world: nothing is written for it.
    Deferred(Reason, String),
    /// Its payload does not decode: it can never be published as it is.
    Unreadable(String),
}

/// Rows whose send has ended, waiting to be marked in one transaction.
#[derive(Debug, Default)]
pub struct Marks {
    /// Acknowledged: `(key, bucket)`.
    acked: Vec<(EventKey, i16)>,
    /// Refused for themselves: these count toward FAILED.
    refused: Vec<(PendingEvent, Reason, String)>,
    /// Held back by the world: nothing is written for them; their buckets.
    deferred: Vec<(i16, Reason)>,
    /// Rows whose payload does not decode.
    unreadable: Vec<(PendingEvent, String)>,
}

impl Marks {
    /// Records how `row`'s send ended.
    pub fn record(&mut self, row: PendingEvent, outcome: Outcome) {
        match outcome {
            Outcome::Acked => self.acked.push((row.key(), row.bucket)),
            Outcome::Refused(reason, error) => self.refused.push((row, reason, error)),
            Outcome::Deferred(reason, error) => {
                tracing::debug!(event_id = %row.event_id, reason = reason.label(), %error,
                    "not published; no attempt spent");
                self.deferred.push((row.bucket, reason));
            }
            Outcome::Unreadable(error) => self.unreadable.push((row, error)),
        }
    }

    #[must_use]
    pub fn acked(&self) -> usize {
        self.acked.len()
    }

    #[must_use]
    pub fn len(&self) -> usize {
        self.acked.len() + self.refused.len() + self.deferred.len() + self.unreadable.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bucket of every recorded row, once per row.
    pub fn buckets(&self) -> impl Iterator<Item = i16> + '_ {
        self.acked
            .iter()
            .map(|(_, bucket)| *bucket)
            .chain(self.refused.iter().map(|(row, _, _)| row.bucket))
            .chain(self.deferred.iter().map(|(bucket, _)| *bucket))
            .chain(self.unreadable.iter().map(|(row, _)| row.bucket))
    }

    /// Buckets with a row the world held back.
    pub fn deferred_buckets(&self) -> impl Iterator<Item = i16> + '_ {
        self.deferred.iter().map(|(bucket, _)| *bucket)
    }

    /// The misses recorded, by class and reason.
    fn misses(&self) -> BTreeMap<(Class, Reason), usize> {
        let mut misses = BTreeMap::new();
        let mut count = |class, reason| *misses.entry((class, reason)).or_default() += 1;
        for (_, reason, _) in &self.refused {
            count(Class::Message, *reason);
        }
        for _ in &self.unreadable {
            count(Class::Message, Reason::Invalid);
        }
        for (_, reason) in &self.deferred {
            count(Class::World, *reason);
        }
        misses
    }

    /// Marks acknowledged rows PUBLISHED in one statement and counts the
    /// refusals (backing them off, or landing them FAILED at the tenth
    /// attempt), in one transaction, fenced on the buckets still held.
    ///
    /// The transaction is bounded by the bucket `lease`
    /// (`bound_transaction` in the crate root): a relay stalled inside it cannot hold
    /// the next owner's marks of the same rows up for longer.
    ///
    /// # Errors
    /// Database errors: the rows stay PENDING and are published again (same event ids).
    pub async fn mark(
        self,
        pool: &PgPool,
        relay_id: &str,
        now: DateTime<Utc>,
        backoff_base: Duration,
        lease: Duration,
    ) -> Result<DrainReport, sqlx::Error> {
        let acked: Vec<EventKey> = self.acked.iter().map(|(key, _)| *key).collect();
        let mut tx = pool.begin().await?;
        crate::bound_transaction(&mut tx, lease).await?;
        outbox::prefer_indexes(&mut tx).await?;
        let marked = outbox::mark_published(&mut tx, relay_id, &acked, now).await?;
        if marked < acked.len() as u64 {
            tracing::warn!(
                acked = acked.len(),
                marked,
                "buckets lost before marking: their rows stay PENDING for the new owner"
            );
        }
        for (row, reason, error) in &self.refused {
            // This failure is attempt `attempts + 1`.
            let delay = flotilla_runtime::backoff::exponential(backoff_base, row.attempts + 1);
            let next = now + chrono::TimeDelta::from_std(delay).unwrap_or(chrono::TimeDelta::MAX);
            tracing::warn!(event_id = %row.event_id, job_id = %row.job_id, sequence = row.sequence, attempt = row.attempts + 1, reason = reason.label(), %error, "publish failed");
            outbox::record_failure(&mut tx, relay_id, row.key(), error, next).await?;
        }
        for (row, error) in &self.unreadable {
            tracing::error!(event_id = %row.event_id, job_id = %row.job_id, sequence = row.sequence, %error,
                "stored event does not decode; the row is FAILED");
            outbox::fail_now(&mut tx, relay_id, row.key(), error).await?;
        }
        tx.commit().await?;
        Ok(DrainReport {
            published: usize::try_from(marked).unwrap_or(usize::MAX),
            failed: self.refused.len() + self.unreadable.len(),
            deferred: self.deferred.len(),
            misses: self.misses(),
        })
    }
}

/// A row on its way: resolves when the broker answers for it (or
/// librdkafka gives up after the delivery timeout).
pub type Delivery = BoxFuture<'static, (PendingEvent, Outcome)>;

#[derive(Clone)]
pub struct Publisher {
    producer: Producer,
    codec: Arc<Codec>,
    topic: String,
    /// The buckets this relay holds, checked at the hand-over of each record.
    held: HeldBuckets,
    /// The producer's timeout: how long a bucket must surely stay held
    /// after a record of it is handed over.
    window: Duration,
    /// Acknowledgements that came close to the window (see [`SLOW_ACK`]).
    slow_acks: Arc<SlowAcks>,
    /// The event topic's recorded partition count, which places records.
    placement: RecordedCount,
}

/// An acknowledgement that took this share of the send window is slow:
/// a broker answering slower than the window gets every record timed out
/// and sent again, so the operator is warned before that.
pub const SLOW_ACK: f64 = 0.8;

/// How often a slow acknowledgement is logged at most.
const SLOW_ACK_LOG_EVERY: Duration = Duration::from_secs(10);

/// Slow acknowledgements counted, and when one was last logged.
#[derive(Debug, Default)]
struct SlowAcks {
    count: std::sync::atomic::AtomicU64,
    logged: std::sync::Mutex<Option<std::time::Instant>>,
}

impl SlowAcks {
    fn record(&self, took: Duration, window: Duration) {
        if took.as_secs_f64() < window.as_secs_f64() * SLOW_ACK {
            return;
        }
        self.count
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        metrics::counter!("flotilla_relay_slow_acks_total").increment(1);
        let mut logged = self
            .logged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if logged.is_none_or(|at| at.elapsed() >= SLOW_ACK_LOG_EVERY) {
            *logged = Some(std::time::Instant::now());
            tracing::warn!(
                ?took,
                ?window,
                "the broker's acknowledgement took most of the send window (a third of the bucket lease): slower ones are timed out and sent again; raise FLOTILLA_RELAY_LEASE"
            );
        }
    }
}

/// How long this process may stall between checking a bucket's lease and
/// handing its record to the producer before what waits in the producer
/// is purged.
const STALL_TOLERANCE: Duration = Duration::from_millis(100);

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// A publisher to `topic` that hands a record of a bucket to `producer`
    /// (whose timeout is `window`) only while `held` holds the bucket for at
    /// least `window` more, to the partition `placement` maps its key to.
    #[must_use]
    pub fn new(
        producer: Producer,
        codec: Arc<Codec>,
        topic: String,
        held: HeldBuckets,
        window: Duration,
        placement: RecordedCount,
    ) -> Self {
        Self {
            producer,
            codec,
            topic,
            held,
            window,
            slow_acks: Arc::default(),
            placement,
        }
    }

    /// The producer, the codec and the send window, for the request sender
    /// (`step_requests`), which shares them.
    pub(crate) fn parts(&self) -> (FutureProducer, &Codec, &HeldBuckets, Duration) {
        (
            self.producer.current(),
            &self.codec,
            &self.held,
            self.window,
        )
    }

    /// Replaces a producer that hit a fatal error (see [`Producer`]);
    /// called before each round.
    pub fn replace_producer_if_fatal(&self) -> bool {
        self.producer.replace_if_fatal()
    }

    /// Acknowledgements so far that took [`SLOW_ACK`] of the send window or more.
    #[must_use]
    pub fn slow_acks(&self) -> u64 {
        self.slow_acks
            .count
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Hands `row` to the producer: the delivery to await, or how it ended
    /// at once (it does not decode, the registry or the producer's queue
    /// refused it). A delivery not answered by `deadline`, when given, ends
    /// deferred (the record may still arrive: a later send repeats it).
    pub async fn dispatch(
        &self,
        row: PendingEvent,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Delivery, (PendingEvent, Outcome)> {
        let event = match row.event() {
            Ok(event) => event,
            Err(e) => {
                let error = format!("the stored event does not decode: {e}");
                return Err((row, Outcome::Unreadable(error)));
            }
        };
        let delivery = match self.send(&row, &event).await {
            Ok(delivery) => delivery,
            Err(miss) => return Err((row, miss.into())),
        };
        let sent = std::time::Instant::now();
        let (slow_acks, window) = (self.slow_acks.clone(), self.window);
        Ok(Box::pin(async move {
            let answered = match deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, delivery).await.ok(),
                None => Some(delivery.await),
            };
            let outcome = match answered {
                Some(Ok(Ok(_))) => {
                    let took = sent.elapsed();
                    metrics::histogram!("flotilla_relay_publish_duration_seconds")
                        .record(took.as_secs_f64());
                    slow_acks.record(took, window);
                    Outcome::Acked
                }
                Some(Ok(Err((e, _)))) => classify(&e).into(),
                Some(Err(_)) => {
                    Outcome::Deferred(Reason::Other, "the producer dropped the delivery".into())
                }
                None => Outcome::Deferred(
                    Reason::Timeout,
                    "no acknowledgement within the round".into(),
                ),
            };
            (row, outcome)
        }))
    }

    /// Fails every record still waiting inside the producer (not yet
    /// sent): none of them can leave after this relay gives its buckets up.
    pub fn purge_waiting(&self) {
        self.producer
            .current()
            .purge(PurgeConfig::default().queue());
    }

    /// One pass: sends `rows` (heads of their jobs) of the buckets still
    /// held for at least the producer's timeout and waits for their
    /// acknowledgements until `deadline`.
    pub async fn publish(&self, rows: Vec<PendingEvent>, deadline: tokio::time::Instant) -> Marks {
        let mut marks = Marks::default();
        let mut in_flight = FuturesUnordered::new();
        for row in rows {
            if !self.held.holds_for(row.bucket, self.window) {
                continue;
            }
            match self.dispatch(row, Some(deadline)).await {
                Ok(delivery) => in_flight.push(delivery),
                Err((row, outcome)) => marks.record(row, outcome),
            }
        }
        while let Some((row, outcome)) = in_flight.next().await {
            marks.record(row, outcome);
        }
        marks
    }

    async fn send(
        &self,
        row: &PendingEvent,
        event: &WorkflowRunEvent,
    ) -> Result<DeliveryFuture, Miss> {
        let bytes = self
            .codec
            .encode(&self.topic, event)
            .await
            .map_err(|e| classify_encoding(&e))?;
        let key = row.job_id.to_string();
        let mut headers = OwnedHeaders::new()
            .insert(Header {
                key: EVENT_TYPE_HEADER,
                value: Some(row.event_type.as_bytes()),
            })
            .insert(Header {
                key: "content-type",
                value: Some(self.codec.content_type().as_bytes()),
            });
        // The publish span continues the run's trace; its own context is
        // what goes into the event's header (the run's, without export).
        let span = tracing::info_span!(
            "send",
            otel.name = format!("{} send", self.topic),
            otel.kind = "producer",
            messaging.system = "kafka",
            messaging.operation.type = "send",
            messaging.destination.name = %self.topic,
            messaging.kafka.message.key = %key,
            job_id = %row.job_id,
            trace_id = flotilla_runtime::trace::trace_id(row.traceparent.as_deref()),
            flotilla.event_type = %row.event_type,
            flotilla.sequence = row.sequence,
        );
        flotilla_runtime::trace::continue_trace(
            &span,
            row.traceparent.as_deref(),
            row.tracestate.as_deref(),
        );
        let (traceparent, tracestate) = match flotilla_runtime::trace::headers_of(&span) {
            Some((traceparent, tracestate)) => (Some(traceparent), tracestate),
            None => (row.traceparent.clone(), row.tracestate.clone()),
        };
        for (name, value) in [("traceparent", &traceparent), ("tracestate", &tracestate)] {
            if let Some(value) = value {
                headers = headers.insert(Header {
                    key: name,
                    value: Some(value.as_bytes()),
                });
            }
        }
        // Not the producer's partitioner: its count follows the broker's
        // metadata, which may list partitions not accepted yet.
        let Some(partition) = self.placement.partition_of(key.as_bytes()) else {
            return Err(Miss::World(
                Reason::Other,
                "the event topic's recorded partition count is not known yet; not sent".into(),
            ));
        };
        let record = FutureRecord::to(&self.topic)
            .key(&key)
            .partition(partition)
            .payload(&bytes)
            .headers(headers);
        // Checked again at the hand-over: encoding may have waited on the
        // registry, and the record's timeout starts now.
        if !self.held.holds_for(row.bucket, self.window) {
            return Err(Miss::World(
                Reason::Lease,
                "the bucket's lease could run out before the producer gives up on the record; not sent"
                    .into(),
            ));
        }
        let delivery = self
            .producer
            .current()
            .send_result(record)
            .map_err(|(e, _)| classify(&e))?;
        if !self
            .held
            .holds_for(row.bucket, self.window.saturating_sub(STALL_TOLERANCE))
        {
            // This process stalled between the check and the hand-over: the
            // record's timeout started late and could outlive the lease.
            // Nothing waiting in the producer may leave; what fails goes again.
            tracing::warn!(event_id = %row.event_id, bucket = row.bucket,
                "stalled while handing a record over; purging what waits in the producer");
            self.purge_waiting();
        }
        Ok(delivery)
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode as Code;

    use super::{Miss, Reason, classify};

    #[test]
    fn only_refusals_of_the_record_itself_count_and_credentials_are_the_world() {
        let delivery = |code| KafkaError::MessageProduction(code);
        for (code, reason) in [
            (Code::MessageSizeTooLarge, Reason::TooLarge),
            (Code::MessageBatchTooLarge, Reason::TooLarge),
            (Code::InvalidRecord, Reason::Invalid),
            (Code::InvalidMessage, Reason::Invalid),
        ] {
            match classify(&delivery(code)) {
                Miss::Message(found, _) => assert_eq!(found, reason, "{code:?}"),
                other => panic!("{code:?}: {other:?}"),
            }
        }
        for (code, reason) in [
            (Code::SaslAuthenticationFailed, Reason::RefusedAccess),
            (Code::Authentication, Reason::RefusedAccess),
            (Code::TopicAuthorizationFailed, Reason::RefusedAccess),
            (Code::ClusterAuthorizationFailed, Reason::RefusedAccess),
            (Code::SSL, Reason::RefusedAccess),
            (Code::MessageTimedOut, Reason::Timeout),
            (Code::RequestTimedOut, Reason::Timeout),
            (Code::QueueFull, Reason::QueueFull),
            (Code::BrokerTransportFailure, Reason::Unreachable),
            (Code::AllBrokersDown, Reason::Unreachable),
            (Code::NotLeaderForPartition, Reason::Unreachable),
            (Code::UnknownTopic, Reason::Other),
            (Code::NotEnoughReplicas, Reason::NotEnoughReplicas),
            (
                Code::NotEnoughReplicasAfterAppend,
                Reason::NotEnoughReplicas,
            ),
        ] {
            match classify(&delivery(code)) {
                Miss::World(found, _) => assert_eq!(found, reason, "{code:?}"),
                other => panic!("{code:?}: {other:?}"),
            }
        }
    }

    /// The event schema is the relay's own, the same for every event: a
    /// registry that refuses it is an outage for an operator, like one that
    /// does not answer.
    #[test]
    fn an_unavailable_registry_and_a_refused_schema_are_both_the_world() {
        use flotilla_codec::CodecError;
        let unavailable = CodecError::RegistryUnavailable("500".into());
        assert!(matches!(
            super::classify_encoding(&unavailable),
            Miss::World(Reason::Registry, _)
        ));
        let refused = CodecError::RegistryRefused {
            subject: "events-value".into(),
            reason: "409".into(),
        };
        assert!(matches!(
            super::classify_encoding(&refused),
            Miss::World(Reason::Registry, _)
        ));
    }

    /// The relay's refused credentials or rights count in the metric the
    /// `FlotillaKafkaAccessRefused` alert watches, as the consumer's do;
    /// other world errors and refused records do not.
    #[test]
    fn refused_credentials_and_rights_are_counted_for_the_alert() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let refused = [
            Code::SaslAuthenticationFailed,
            Code::TopicAuthorizationFailed,
            Code::ClusterAuthorizationFailed,
        ];
        metrics::with_local_recorder(&recorder, || {
            for code in refused
                .into_iter()
                .chain([Code::MessageTimedOut, Code::MessageSizeTooLarge])
            {
                let _ = classify(&KafkaError::MessageProduction(code));
            }
        });
        let rendered = handle.render();
        let count = rendered
            .lines()
            .find_map(|line| line.strip_prefix("flotilla_kafka_access_refused_total "))
            .unwrap_or_else(|| panic!("not counted:\n{rendered}"));
        assert_eq!(count.trim(), refused.len().to_string(), "{rendered}");
    }
}
