//! Publishing outbox rows: encode, produce keyed by job id with the stored
//! trace context, await the broker's acknowledgements, then mark.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use flotilla_codec::Codec;
use flotilla_contracts::{WorkflowRunEvent, json};
use flotilla_store::outbox::relay::{self as outbox, PendingEvent};
use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use sqlx::PgPool;

use crate::buckets::HeldBuckets;

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
}

/// Why a row did not go out, by whose fault it is.
enum Miss {
    /// The message itself (too large, invalid): counts an attempt.
    Message(String),
    /// The world (unreachable, full, too slow): spends nothing.
    World(String),
}

/// Whether the broker refused this record for itself.
fn refused_for_itself(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::InvalidMessage
            | RDKafkaErrorCode::InvalidRecord
            | RDKafkaErrorCode::MessageBatchTooLarge
    )
}

impl From<Miss> for Outcome {
    fn from(miss: Miss) -> Self {
        match miss {
            Miss::Message(error) => Outcome::Refused(error),
            Miss::World(error) => Outcome::Deferred(error),
        }
    }
}

fn classify(error: &KafkaError) -> Miss {
    match error.rdkafka_error_code() {
        Some(code) if refused_for_itself(code) => Miss::Message(error.to_string()),
        _ => Miss::World(error.to_string()),
    }
}

/// How one row's send ended.
#[derive(Debug)]
pub enum Outcome {
    /// The broker has it.
    Acked,
    /// Refused for itself: counts an attempt toward FAILED.
    Refused(String),
    /// Held back by the world: nothing is written for it.
    Deferred(String),
    /// Its payload does not decode: it can never be published as it is.
    Unreadable(String),
}

/// Rows whose send has ended, waiting to be marked in one transaction.
#[derive(Debug, Default)]
pub struct Marks {
    /// Acknowledged: `(id, bucket)`.
    acked: Vec<(i64, i16)>,
    /// Refused for themselves: these count toward FAILED.
    refused: Vec<(PendingEvent, String)>,
    /// Held back by the world: nothing is written for them; their buckets.
    deferred: Vec<i16>,
    /// Rows whose payload does not decode.
    unreadable: Vec<(PendingEvent, String)>,
}

impl Marks {
    /// Records how `row`'s send ended.
    pub fn record(&mut self, row: PendingEvent, outcome: Outcome) {
        match outcome {
            Outcome::Acked => self.acked.push((row.id, row.bucket)),
            Outcome::Refused(error) => self.refused.push((row, error)),
            Outcome::Deferred(error) => {
                tracing::debug!(event_id = %row.event_id, %error, "not published; no attempt spent");
                self.deferred.push(row.bucket);
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
            .chain(self.refused.iter().map(|(row, _)| row.bucket))
            .chain(self.deferred.iter().copied())
            .chain(self.unreadable.iter().map(|(row, _)| row.bucket))
    }

    /// Buckets with a row the world held back.
    pub fn deferred_buckets(&self) -> impl Iterator<Item = i16> + '_ {
        self.deferred.iter().copied()
    }

    /// Marks acknowledged rows PUBLISHED in one statement and counts the
    /// refusals (backing them off, or landing them FAILED at the tenth
    /// attempt), in one transaction, fenced on the buckets still held.
    ///
    /// # Errors
    /// Database errors: the rows stay PENDING and are published again (same event ids).
    pub async fn mark(
        self,
        pool: &PgPool,
        relay_id: &str,
        now: DateTime<Utc>,
        backoff_base: Duration,
    ) -> Result<DrainReport, sqlx::Error> {
        let acked: Vec<i64> = self.acked.iter().map(|(id, _)| *id).collect();
        let mut tx = pool.begin().await?;
        outbox::prefer_indexes(&mut tx).await?;
        let marked = outbox::mark_published(&mut tx, relay_id, &acked, now).await?;
        if marked < acked.len() as u64 {
            tracing::warn!(
                acked = acked.len(),
                marked,
                "buckets lost before marking: their rows stay PENDING for the new owner"
            );
        }
        for (row, error) in &self.refused {
            // This failure is attempt `attempts + 1`.
            let delay = flotilla_runtime::backoff::exponential(backoff_base, row.attempts + 1);
            let next = now + chrono::TimeDelta::from_std(delay).unwrap_or(chrono::TimeDelta::MAX);
            tracing::warn!(event_id = %row.event_id, job_id = %row.job_id, sequence = row.sequence, attempt = row.attempts + 1, %error, "publish failed");
            outbox::record_failure(&mut tx, relay_id, row.id, error, next).await?;
        }
        for (row, error) in &self.unreadable {
            tracing::error!(event_id = %row.event_id, job_id = %row.job_id, sequence = row.sequence, %error,
                "stored event does not decode; the row is FAILED");
            outbox::fail_now(&mut tx, relay_id, row.id, error).await?;
        }
        tx.commit().await?;
        Ok(DrainReport {
            published: usize::try_from(marked).unwrap_or(usize::MAX),
            failed: self.refused.len() + self.unreadable.len(),
            deferred: self.deferred.len(),
        })
    }
}

/// A row on its way: resolves when the broker answers for it (or
/// librdkafka gives up after the delivery timeout).
pub type Delivery = BoxFuture<'static, (PendingEvent, Outcome)>;

#[derive(Clone)]
pub struct Publisher {
    producer: FutureProducer,
    codec: Arc<Codec>,
    topic: String,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    #[must_use]
    pub fn new(producer: FutureProducer, codec: Arc<Codec>, topic: String) -> Self {
        Self {
            producer,
            codec,
            topic,
        }
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
        let event = match json::decode_stored::<WorkflowRunEvent>(row.payload.0.clone()) {
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
        Ok(Box::pin(async move {
            let answered = match deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, delivery).await.ok(),
                None => Some(delivery.await),
            };
            let outcome = match answered {
                Some(Ok(Ok(_))) => {
                    metrics::histogram!("flotilla_relay_publish_duration_seconds")
                        .record(sent.elapsed().as_secs_f64());
                    Outcome::Acked
                }
                Some(Ok(Err((e, _)))) => classify(&e).into(),
                Some(Err(_)) => Outcome::Deferred("the producer dropped the delivery".into()),
                None => Outcome::Deferred("no acknowledgement within the round".into()),
            };
            (row, outcome)
        }))
    }

    /// One pass: sends `rows` (heads of their jobs) of the buckets still
    /// `held` and waits for their acknowledgements until `deadline`.
    pub async fn publish(
        &self,
        rows: Vec<PendingEvent>,
        held: &HeldBuckets,
        deadline: tokio::time::Instant,
    ) -> Marks {
        let mut marks = Marks::default();
        let mut in_flight = FuturesUnordered::new();
        for row in rows {
            if !held.holds(row.bucket) {
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
        let bytes = self.codec.encode(&self.topic, event).await.map_err(|e| {
            if e.is_transient() {
                Miss::World(format!("encoding: {e}"))
            } else {
                Miss::Message(format!("encoding: {e}"))
            }
        })?;
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
        let record = FutureRecord::to(&self.topic)
            .key(&key)
            .payload(&bytes)
            .headers(headers);
        self.producer
            .send_result(record)
            .map_err(|(e, _)| classify(&e))
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode as Code;

    use super::{Miss, classify};

    #[test]
    fn only_refusals_of_the_record_itself_count_and_credentials_are_the_world() {
        let delivery = |code| KafkaError::MessageProduction(code);
        assert!(matches!(
            classify(&delivery(Code::MessageSizeTooLarge)),
            Miss::Message(_)
        ));
        for code in [
            Code::SaslAuthenticationFailed,
            Code::Authentication,
            Code::TopicAuthorizationFailed,
            Code::ClusterAuthorizationFailed,
            Code::SSL,
            Code::MessageTimedOut,
            Code::QueueFull,
            Code::UnknownTopic,
        ] {
            assert!(
                matches!(classify(&delivery(code)), Miss::World(_)),
                "{code:?}"
            );
        }
    }
}
