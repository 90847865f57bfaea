//! Publishing outbox rows: encode, produce keyed by job id with the stored
//! trace context, await the broker's acknowledgements, then mark.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use flotilla_codec::Codec;
use flotilla_contracts::{WorkflowRunEvent, json};
use flotilla_store::outbox::relay::{self as outbox, PendingEvent};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use sqlx::PgPool;
use uuid::Uuid;

/// Header naming the event type, so consumers can route without decoding.
pub const EVENT_TYPE_HEADER: &str = "flotilla.event-type";

/// What one publish round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainReport {
    pub published: usize,
    pub failed: usize,
}

/// Rows sent to the broker and acknowledged (or not), not yet marked.
#[derive(Debug)]
pub struct PublishedBatch {
    acked: Vec<i64>,
    failures: Vec<(PendingEvent, String)>,
    /// Rows whose payload does not decode: they can never be published.
    unreadable: Vec<(PendingEvent, String)>,
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
        now: DateTime<Utc>,
        backoff_base: Duration,
    ) -> Result<DrainReport, sqlx::Error> {
        let mut tx = pool.begin().await?;
        outbox::mark_published(&mut tx, &self.acked, now).await?;
        for (row, error) in &self.failures {
            // This failure is attempt `attempts + 1`.
            let delay = flotilla_runtime::backoff::exponential(backoff_base, row.attempts + 1);
            let next = now + chrono::TimeDelta::from_std(delay).unwrap_or(chrono::TimeDelta::MAX);
            tracing::warn!(event_id = %row.event_id, job_id = %row.job_id, sequence = row.sequence, attempt = row.attempts + 1, %error, "publish failed");
            outbox::record_failure(&mut tx, row.id, error, next).await?;
        }
        for (row, error) in &self.unreadable {
            tracing::error!(event_id = %row.event_id, job_id = %row.job_id, sequence = row.sequence, %error,
                "stored event does not decode; the row is FAILED");
            outbox::fail_now(&mut tx, row.id, error).await?;
        }
        tx.commit().await?;
        Ok(DrainReport {
            published: self.acked.len(),
            failed: self.failures.len() + self.unreadable.len(),
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

    /// Produces `rows` (oldest first) and waits for every acknowledgement.
    /// Once a job's event fails, its later events in this batch are held
    /// back, so they cannot overtake it.
    pub async fn publish(&self, rows: Vec<PendingEvent>) -> PublishedBatch {
        let mut blocked: HashSet<Uuid> = HashSet::new();
        let mut in_flight: Vec<(PendingEvent, DeliveryFuture)> = Vec::with_capacity(rows.len());
        let mut failures = Vec::new();
        let mut unreadable = Vec::new();
        for row in rows {
            if blocked.contains(&row.job_id) {
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
                Ok(delivery) => in_flight.push((row, delivery)),
                Err(error) => {
                    blocked.insert(row.job_id);
                    failures.push((row, error));
                }
            }
        }
        let mut acked = Vec::with_capacity(in_flight.len());
        for (row, delivery) in in_flight {
            match delivery.await {
                Ok(Ok(_)) => acked.push(row.id),
                Ok(Err((e, _))) => failures.push((row, e.to_string())),
                Err(_) => failures.push((row, "the producer dropped the delivery".into())),
            }
        }
        PublishedBatch {
            acked,
            failures,
            unreadable,
        }
    }

    async fn send(
        &self,
        row: &PendingEvent,
        event: &WorkflowRunEvent,
    ) -> Result<DeliveryFuture, String> {
        let bytes = self
            .codec
            .encode(&self.topic, event)
            .await
            .map_err(|e| format!("encoding: {e}"))?;
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
        if let Some(traceparent) = &row.traceparent {
            headers = headers.insert(Header {
                key: "traceparent",
                value: Some(traceparent.as_bytes()),
            });
        }
        let record = FutureRecord::to(&self.topic)
            .key(&key)
            .payload(&bytes)
            .headers(headers);
        self.producer
            .send_result(record)
            .map_err(|(e, _)| e.to_string())
    }
}
