//! Publishing outbox rows: encode, produce keyed by job id with the stored
//! trace context, await the broker's acknowledgements, then mark.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use flotilla_codec::Codec;
use flotilla_contracts::{WorkflowRunEvent, json};
use flotilla_store::outbox::relay::{self as outbox, PendingEvent};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use sqlx::PgPool;
use uuid::Uuid;

use crate::buckets::HeldBuckets;

/// Header naming the event type, so consumers can route without decoding.
pub const EVENT_TYPE_HEADER: &str = "flotilla.event-type";

/// What one publish round did.
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

/// Rows sent to the broker and acknowledged (or not), not yet marked.
#[derive(Debug)]
pub struct PublishedBatch {
    acked: Vec<i64>,
    /// Refused for themselves: these count toward FAILED.
    failures: Vec<(PendingEvent, String)>,
    /// Held back by the world: nothing is written for them.
    deferred: Vec<(PendingEvent, String)>,
    /// Rows whose payload does not decode: they can never be published.
    unreadable: Vec<(PendingEvent, String)>,
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

fn classify(error: &KafkaError) -> Miss {
    match error.rdkafka_error_code() {
        Some(code) if refused_for_itself(code) => Miss::Message(error.to_string()),
        _ => Miss::World(error.to_string()),
    }
}

impl PublishedBatch {
    #[must_use]
    pub fn acked(&self) -> usize {
        self.acked.len()
    }

    /// Marks acknowledged rows PUBLISHED and counts the failures (backing
    /// them off, or landing them FAILED at the tenth attempt).
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
        let mut tx = pool.begin().await?;
        // Fenced: only rows of buckets this relay still holds are marked.
        let marked = outbox::mark_published(&mut tx, relay_id, &self.acked, now).await?;
        if marked < self.acked.len() as u64 {
            tracing::warn!(
                acked = self.acked.len(),
                marked,
                "buckets lost mid-round: their rows stay PENDING for the new owner"
            );
        }
        for (row, error) in &self.failures {
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
        for (row, error) in &self.deferred {
            tracing::debug!(event_id = %row.event_id, %error, "not published this round; no attempt spent");
        }
        tx.commit().await?;
        Ok(DrainReport {
            published: usize::try_from(marked).unwrap_or(usize::MAX),
            failed: self.failures.len() + self.unreadable.len(),
            deferred: self.deferred.len(),
        })
    }
}

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

    /// Produces `rows` (oldest first) of the buckets still `held`, and waits
    /// for their acknowledgements until `deadline`: what was acknowledged by
    /// then is marked, the rest is sent again later. Once a job's event
    /// misses, its later events in this round are held back, so they cannot
    /// overtake it.
    pub async fn publish(
        &self,
        rows: Vec<PendingEvent>,
        held: &HeldBuckets,
        deadline: tokio::time::Instant,
    ) -> PublishedBatch {
        let mut blocked: HashSet<Uuid> = HashSet::new();
        let mut in_flight: Vec<(PendingEvent, DeliveryFuture, std::time::Instant)> =
            Vec::with_capacity(rows.len());
        let (mut failures, mut deferred, mut unreadable) = (Vec::new(), Vec::new(), Vec::new());
        for row in rows {
            if blocked.contains(&row.job_id) || !held.holds(row.bucket) {
                continue;
            }
            let event = match json::decode_stored::<WorkflowRunEvent>(row.payload.0.clone()) {
                Ok(event) => event,
                Err(e) => {
                    blocked.insert(row.job_id);
                    unreadable.push((row, format!("the stored event does not decode: {e}")));
                    continue;
                }
            };
            match self.send(&row, &event).await {
                Ok(delivery) => in_flight.push((row, delivery, std::time::Instant::now())),
                Err(miss) => {
                    blocked.insert(row.job_id);
                    match miss {
                        Miss::Message(error) => failures.push((row, error)),
                        Miss::World(error) => deferred.push((row, error)),
                    }
                }
            }
        }
        let mut acked = Vec::with_capacity(in_flight.len());
        for (row, delivery, sent) in in_flight {
            match tokio::time::timeout_at(deadline, delivery).await {
                Ok(Ok(Ok(_))) => {
                    metrics::histogram!("flotilla_relay_publish_duration_seconds")
                        .record(sent.elapsed().as_secs_f64());
                    acked.push(row.id);
                }
                Ok(Ok(Err((e, _)))) => match classify(&e) {
                    Miss::Message(error) => failures.push((row, error)),
                    Miss::World(error) => deferred.push((row, error)),
                },
                Ok(Err(_)) => deferred.push((row, "the producer dropped the delivery".into())),
                Err(_) => deferred.push((row, "no acknowledgement within the round".into())),
            }
        }
        PublishedBatch {
            acked,
            failures,
            deferred,
            unreadable,
        }
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
