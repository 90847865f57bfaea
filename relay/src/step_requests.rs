//! Sends the requests of Kafka-target steps (`workflow_step_request_outbox`,
//! written with the park that waits for their replies) for the buckets
//! this relay holds: to the target's request topic, keyed by job id, with
//! headers naming the job, the step, the correlation id, the reply topic,
//! the idempotency key and the deadline, and the step's trace; each row
//! deleted once the broker acknowledged it. A step has one request
//! outstanding, so requests need no order among themselves and go side by
//! side.
//!
//! A row no longer wanted is deleted unsent and counted by reason: its
//! deadline passed, its step's current request is another (a later
//! attempt's), it was answered, or its job ended or is gone (see
//! `PendingStepRequest::unwanted_at`). So a relay back from an outage
//! does not send what nobody waits for any more.
//!
//! What the world holds back (broker, registry) is tried again, doubling
//! from a second up to a minute per row. A row that cannot go out as it
//! is (it does not decode: a newer or broken writer's; the producer or
//! the broker refuse it as too large) is set aside with its reason and
//! never sent: its step times out, as an attempt that got no reply.

use std::time::Duration;

use flotilla_contracts::{WorkflowStepRequest, json};
use flotilla_store::outbox::step_requests::{self as outbox, PendingStepRequest};
use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use rdkafka::types::RDKafkaErrorCode;
use tokio_util::sync::CancellationToken;

use crate::Relay;

/// Rows read per pass.
const BATCH: i64 = 200;
/// The wait of an idle sender, unless a worker rings first.
const IDLE_POLL: Duration = Duration::from_millis(250);
/// The first pause of a row the world held back; it doubles per attempt.
const RETRY_BASE: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);
/// How long past the send window a pass still waits for acknowledgements.
const DELIVERY_GRACE: Duration = Duration::from_secs(2);

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SentRequests {
    pub sent: usize,
    pub deferred: usize,
    /// Set aside: they cannot go out as they are.
    pub unreadable: usize,
    /// Deleted unsent: no longer wanted.
    pub dropped: usize,
}

impl Relay {
    /// Sends what waits in the request outbox until `shutdown`.
    pub(crate) async fn step_request_loop(&self, shutdown: CancellationToken) {
        loop {
            let busy = match self.send_step_requests().await {
                Ok(pass) => pass.sent + pass.deferred + pass.unreadable + pass.dropped > 0,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the step request outbox failed");
                    false
                }
            };
            if !busy {
                tokio::select! {
                    () = tokio::time::sleep(IDLE_POLL) => {}
                    () = self.requests_committed.notified() => {}
                    () = shutdown.cancelled() => return,
                }
            } else if shutdown.is_cancelled() {
                return;
            }
        }
    }

    /// One pass: sends the due requests of the buckets held for the whole
    /// send window, waits for their acknowledgements, deletes the
    /// acknowledged and those no longer wanted.
    ///
    /// # Errors
    /// Database errors (what was acknowledged is sent again: a repeat the
    /// service drops by correlation id or idempotency key).
    pub async fn send_step_requests(&self) -> Result<SentRequests, sqlx::Error> {
        let (producer, codec, held, window) = self.publisher.parts();
        let buckets = held.current_for(window);
        if buckets.is_empty() {
            return Ok(SentRequests::default());
        }
        let now = self.clock.now();
        let rows = flotilla_store::sql::session(&self.pool, async |conn| {
            outbox::pending(conn, &buckets, now, BATCH).await
        })
        .await?;
        let mut pass = SentRequests::default();
        let mut in_flight = FuturesUnordered::new();
        // What was handed to the producer and has no answer yet, by row id.
        let mut awaited = std::collections::HashMap::new();
        let mut refused: Vec<(PendingStepRequest, String, bool)> = Vec::new();
        let mut unwanted = Vec::new();
        for row in rows {
            if let Some(why) = row.unwanted_at(now) {
                tracing::info!(job_id = %row.job_id, step = %row.step_name, correlation_id = %row.correlation_id,
                    reason = why.label(), "a step request is no longer wanted; deleted unsent");
                metrics::counter!("flotilla_step_requests_dropped_total", "reason" => why.label())
                    .increment(1);
                unwanted.push(row.id);
                continue;
            }
            let request = match json::decode_stored::<WorkflowStepRequest>(row.payload.0.clone()) {
                Ok(request) => request,
                Err(e) => {
                    let reason = format!("the stored request does not decode: {e}");
                    refused.push((row, reason, true));
                    continue;
                }
            };
            let bytes = match row.encoding.as_str() {
                "json" => json::encode(&request).map_err(|e| (e.to_string(), true)),
                "avro" => codec
                    .encode(&row.topic, &request)
                    .await
                    .map_err(|e| (e.to_string(), false)),
                other => Err((format!("unknown encoding {other:?}"), true)),
            };
            let bytes = match bytes {
                Ok(bytes) => bytes,
                Err((reason, unreadable)) => {
                    refused.push((row, reason, unreadable));
                    continue;
                }
            };
            let key = row.job_id.to_string();
            let contract_headers = request.headers();
            let mut record_headers = OwnedHeaders::new();
            let trace_headers = [
                ("content-type", Some(content_type(&row.encoding))),
                ("traceparent", row.traceparent.as_deref()),
                ("tracestate", row.tracestate.as_deref()),
            ];
            let all = contract_headers
                .iter()
                .map(|(name, value)| (*name, Some(value.as_str())))
                .chain(trace_headers);
            for (name, value) in all {
                if let Some(value) = value {
                    record_headers = record_headers.insert(Header {
                        key: name,
                        value: Some(value.as_bytes()),
                    });
                }
            }
            let record = FutureRecord::to(&row.topic)
                .key(&key)
                .payload(&bytes)
                .headers(record_headers);
            match producer.send_result(record) {
                Ok(delivery) => {
                    awaited.insert(row.id, row.clone());
                    in_flight.push(async move { (row, delivery.await) });
                }
                Err((e, _)) => refused.push((row, e.to_string(), is_about_the_record(&e))),
            }
        }
        let mut acked = Vec::new();
        // Every delivery ends by the producer's timeout (the window); the
        // grace covers librdkafka's once-a-second timeout scan. A row left
        // due while its record may still land would be sent again at once.
        let deadline = tokio::time::Instant::now() + window + DELIVERY_GRACE;
        while let Ok(Some((row, delivered))) =
            tokio::time::timeout_at(deadline, in_flight.next()).await
        {
            awaited.remove(&row.id);
            match delivered {
                Ok(Ok(_)) => acked.push(row.id),
                Ok(Err((e, _))) => refused.push((row, e.to_string(), is_about_the_record(&e))),
                Err(_) => refused.push((row, "the producer dropped the delivery".into(), false)),
            }
        }
        for (_, row) in awaited {
            refused.push((
                row,
                "no acknowledgement within the send window".into(),
                false,
            ));
        }
        pass.sent = acked.len();
        pass.dropped = unwanted.len();
        acked.extend(unwanted);
        flotilla_store::sql::session(&self.pool, async |conn| outbox::delete(conn, &acked).await)
            .await?;
        if pass.sent > 0 {
            metrics::counter!("flotilla_step_requests_published_total").increment(pass.sent as u64);
        }
        for (row, reason, unreadable) in refused {
            let now = self.clock.now();
            let next = if unreadable {
                pass.unreadable += 1;
                tracing::error!(job_id = %row.job_id, step = %row.step_name, correlation_id = %row.correlation_id,
                    reason = %reason, "a step request cannot be sent as it is; set aside (its step times out)");
                metrics::counter!("flotilla_step_requests_unsendable_total").increment(1);
                // Never again on its own: a century is past any deadline.
                now + chrono::TimeDelta::days(36_500)
            } else {
                pass.deferred += 1;
                tracing::warn!(job_id = %row.job_id, topic = %row.topic, reason = %reason,
                    "a step request was not sent; trying again");
                let pause = RETRY_BASE
                    .saturating_mul(1 << row.attempts.clamp(0, 6))
                    .min(RETRY_MAX);
                now + chrono::TimeDelta::from_std(pause).unwrap_or(chrono::TimeDelta::MAX)
            };
            flotilla_store::sql::session(&self.pool, async |conn| {
                outbox::defer(conn, row.id, &reason, next).await
            })
            .await?;
        }
        Ok(pass)
    }
}

/// Whether the producer or the broker refused the record itself (too
/// large for the producer's `message.max.bytes` or the topic's
/// `max.message.bytes`): sending it again fails the same way.
fn is_about_the_record(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::MessageBatchTooLarge)
    )
}

fn content_type(encoding: &str) -> &'static str {
    if encoding == "avro" {
        "application/vnd.flotilla.avro"
    } else {
        "application/json"
    }
}
