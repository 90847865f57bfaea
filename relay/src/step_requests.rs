//! Sends the requests of Kafka-target steps (`workflow_step_request_outbox`,
//! written with the park that waits for their replies) for the buckets
//! this relay holds: to the target's request topic, keyed by job id, with
//! headers naming the job, the step, the correlation id, the reply topic
//! and the idempotency key, and the step's trace; each row deleted once the
//! broker acknowledged it. A step has one request outstanding, so requests
//! need no order among themselves and go side by side.
//!
//! What the world holds back (broker, registry) is tried again, doubling
//! from a second up to a minute per row. A row that does not decode (a
//! newer or broken writer's) is set aside with its reason and never sent:
//! its step times out and sends a new request.

use std::time::Duration;

use flotilla_contracts::step_headers as headers;
use flotilla_contracts::{WorkflowStepRequest, json};
use flotilla_store::outbox::step_requests::{self as outbox, PendingStepRequest};
use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use tokio_util::sync::CancellationToken;

use crate::Relay;

/// Rows read per pass.
const BATCH: i64 = 200;
/// The wait of an idle sender, unless a worker rings first.
const IDLE_POLL: Duration = Duration::from_millis(250);
/// The first pause of a row the world held back; it doubles per attempt.
const RETRY_BASE: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SentRequests {
    pub sent: usize,
    pub deferred: usize,
    pub unreadable: usize,
}

impl Relay {
    /// Sends what waits in the request outbox until `shutdown`.
    pub(crate) async fn step_request_loop(&self, shutdown: CancellationToken) {
        loop {
            let busy = match self.send_step_requests().await {
                Ok(pass) => pass.sent + pass.deferred + pass.unreadable > 0,
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
    /// send window, waits for their acknowledgements, deletes the acknowledged.
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
        let mut refused: Vec<(PendingStepRequest, String, bool)> = Vec::new();
        for row in rows {
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
            let (job, correlation) = (row.job_id.to_string(), row.correlation_id.to_string());
            let mut record_headers = OwnedHeaders::new();
            for (name, value) in [
                (headers::JOB_ID, Some(job.as_str())),
                (headers::STEP, Some(row.step_name.as_str())),
                (headers::CORRELATION_ID, Some(correlation.as_str())),
                (headers::REPLY_TOPIC, Some(request.reply_topic())),
                (headers::IDEMPOTENCY_KEY, Some(request.idempotency_key())),
                ("content-type", Some(content_type(&row.encoding))),
                ("traceparent", row.traceparent.as_deref()),
                ("tracestate", row.tracestate.as_deref()),
            ] {
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
                Ok(delivery) => in_flight.push(async move { (row, delivery.await) }),
                Err((e, _)) => refused.push((row, e.to_string(), false)),
            }
        }
        let mut acked = Vec::new();
        let deadline = tokio::time::Instant::now() + window;
        while let Ok(Some((row, delivered))) =
            tokio::time::timeout_at(deadline, in_flight.next()).await
        {
            match delivered {
                Ok(Ok(_)) => acked.push(row.id),
                Ok(Err((e, _))) => refused.push((row, e.to_string(), false)),
                Err(_) => refused.push((row, "the producer dropped the delivery".into(), false)),
            }
        }
        let sent = flotilla_store::sql::session(&self.pool, async |conn| {
            outbox::delete_sent(conn, &acked).await
        })
        .await?;
        pass.sent = usize::try_from(sent).unwrap_or(0);
        if pass.sent > 0 {
            metrics::counter!("flotilla_step_requests_published_total").increment(pass.sent as u64);
        }
        for (row, reason, unreadable) in refused {
            let now = self.clock.now();
            let next = if unreadable {
                pass.unreadable += 1;
                tracing::error!(job_id = %row.job_id, step = %row.step_name, correlation_id = %row.correlation_id,
                    reason = %reason, "a step request cannot be sent; set aside (its step times out and asks again)");
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

fn content_type(encoding: &str) -> &'static str {
    if encoding == "avro" {
        "application/vnd.flotilla.avro"
    } else {
        "application/json"
    }
}
