//! Publishing outbox rows: encode, produce keyed by job id to the partition
//! the recorded count maps it to (the `placement` module), with the stored
//! trace context, await the broker's acknowledgements, then mark (the
//! `marks` module: the bucket's progress moves when its batch went whole).

use std::sync::Arc;
use std::time::Duration;

use flotilla_codec::Codec;
use flotilla_contracts::WorkflowRunEvent;
use flotilla_store::outbox::relay::PendingEvent;
use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer as _, PurgeConfig};

use crate::producer::Producer;

use crate::buckets::HeldBuckets;
use crate::placement::RecordedCount;

mod classify;
mod marks;

pub use classify::{Class, Outcome, Reason};
use classify::{Miss, classify, classify_encoding};
pub use marks::{DrainReport, Marks};

/// Header naming the event type, so consumers can route without decoding.
pub const EVENT_TYPE_HEADER: &str = "flotilla.event-type";

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

    /// One wave of a pass: sends `rows` (pages of their buckets, in `id`
    /// order) of buckets still held for at least the producer's timeout,
    /// and waits for their acknowledgements until `deadline`, recording
    /// how each ended in `marks`. The first row of a bucket the world holds
    /// back at the hand-over stops that bucket's page: no later event of a
    /// job may leave ahead of an earlier one.
    pub async fn publish(
        &self,
        rows: Vec<PendingEvent>,
        deadline: tokio::time::Instant,
        marks: &mut Marks,
    ) {
        let mut in_flight = FuturesUnordered::new();
        let mut stopped: Vec<i16> = Vec::new();
        for row in rows {
            if stopped.contains(&row.bucket) {
                continue;
            }
            if !self.held.holds_for(row.bucket, self.window) {
                // Recorded, so its batch is not finished without it.
                stopped.push(row.bucket);
                let outcome = Outcome::Deferred(
                    Reason::Lease,
                    "the bucket's lease could run out before the producer gives up on the record; not sent".into(),
                );
                marks.record(row, outcome);
                continue;
            }
            match self.dispatch(row, Some(deadline)).await {
                Ok(delivery) => in_flight.push(delivery),
                Err((row, outcome)) => {
                    if outcome.is_deferred() {
                        stopped.push(row.bucket);
                    }
                    marks.record(row, outcome);
                }
            }
        }
        while let Some((row, outcome)) = in_flight.next().await {
            marks.record(row, outcome);
        }
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
