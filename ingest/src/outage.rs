//! Riding out what is not this batch's fault: an outage of the database,
//! the registry or the dead-letter topic (pause, keep polling, retry the
//! same batch), and a message the client cannot read (stop loudly rather
//! than commit past it).

use std::time::Duration;

use flotilla_runtime::backoff::Doubling;
use flotilla_runtime::kafka::security::is_refused_access;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use tokio_util::sync::CancellationToken;

use crate::{BatchReport, OUTAGE_BACKOFF_MIN, Received, RequestConsumer};

impl RequestConsumer {
    /// Persists `batch`, riding out outages: the partitions are paused
    /// (those assigned meanwhile too, on arrival) and the same batch retried
    /// with backoff, while the consumer keeps polling so it keeps its group
    /// seat and rebalances finish. `None` on shutdown.
    pub(crate) async fn persist_until_done(
        &self,
        batch: &[Received],
        shutdown: &CancellationToken,
    ) -> Option<BatchReport> {
        self.ride_out(shutdown, || self.persist(batch)).await
    }

    /// Runs `attempt` until it succeeds, riding out outages as
    /// [`RequestConsumer::persist_until_done`] does. `None` on shutdown.
    pub(crate) async fn ride_out<T, Attempt>(
        &self,
        shutdown: &CancellationToken,
        mut attempt: impl FnMut() -> Attempt,
    ) -> Option<T>
    where
        Attempt: std::future::Future<Output = Result<T, crate::Outage>>,
    {
        let mut backoff = Doubling::new(OUTAGE_BACKOFF_MIN, self.settings.outage_backoff_max);
        let mut in_outage = false;
        loop {
            match attempt().await {
                Ok(done) => {
                    if in_outage {
                        self.end_outage();
                    }
                    return Some(done);
                }
                Err(outage) => {
                    let pause = backoff.next_pause();
                    tracing::warn!(error = %outage, retry_in = ?pause, "batch not persisted; pausing and retrying");
                    self.health.paused(outage.to_string());
                    if !in_outage {
                        self.begin_outage();
                        in_outage = true;
                    }
                    if !self.poll_paused(pause, shutdown).await {
                        return None;
                    }
                }
            }
        }
    }

    fn begin_outage(&self) {
        self.consumer.context().set_outage(true);
        let assignment = self.consumer.assignment().unwrap_or_default();
        if let Err(e) = self.consumer.pause(&assignment) {
            tracing::warn!(error = %e, "pausing partitions failed");
        }
    }

    fn end_outage(&self) {
        self.consumer.context().set_outage(false);
        self.health.resumed();
        tracing::info!("outage over; resuming partitions");
        let assignment = self.consumer.assignment().unwrap_or_default();
        if let Err(e) = self.consumer.resume(&assignment) {
            tracing::warn!(error = %e, "resuming partitions failed");
        }
    }

    /// Polls for `pause` with the partitions paused: the group sees a live
    /// member, rebalances complete, and a message that still arrives (from a
    /// partition assigned as the pause began) is kept for the next batch.
    /// `false` on shutdown.
    async fn poll_paused(&self, pause: Duration, shutdown: &CancellationToken) -> bool {
        let until = tokio::time::Instant::now() + pause;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(until) => return true,
                () = shutdown.cancelled() => return false,
                received = self.consumer.recv() => match received {
                    Ok(message) => {
                        let kept = Received::take(&message, self.settings.max_request_bytes);
                        self.carried
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .push(kept);
                    }
                    Err(e) => self.note_error(&e),
                },
            }
        }
    }

    pub(crate) fn note_error(&self, error: &KafkaError) {
        if matches!(
            error,
            KafkaError::MessageConsumption(rdkafka::types::RDKafkaErrorCode::PollExceeded)
        ) {
            self.poll_interval_exceeded
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            metrics::counter!("flotilla_consumer_poll_interval_exceeded_total").increment(1);
        }
        if is_refused_access(error) {
            // Credentials or rights refused: an outage to alert on, never a
            // reason to dead-letter anything.
            metrics::counter!("flotilla_kafka_access_refused_total").increment(1);
            tracing::error!(error = %error, "the broker refused this consumer's credentials or rights");
            return;
        }
        tracing::warn!(error = %error, "consumer error");
    }

    pub(crate) fn is_stalled(&self) -> bool {
        self.stalled.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// When `error` is fatal to the client (most often: another live member
    /// of the group joined with this worker's `group.instance.id` and
    /// fenced this one), marks the consumer dead, naming the cause: it can
    /// consume nothing more, and readiness fails until it is restarted.
    pub(crate) fn dies_on(&self, error: &KafkaError) -> bool {
        if !matches!(error, KafkaError::MessageConsumptionFatal(_)) {
            return false;
        }
        if !self.dead.swap(true, std::sync::atomic::Ordering::SeqCst) {
            let (code, detail) = self.consumer.client().fatal_error().unwrap_or((
                error
                    .rdkafka_error_code()
                    .unwrap_or(rdkafka::types::RDKafkaErrorCode::Fatal),
                error.to_string(),
            ));
            let reason = if code == rdkafka::types::RDKafkaErrorCode::FencedInstanceId {
                format!(
                    "another live member of group {} uses group.instance.id {:?}, this worker's id, and fenced this one ({detail}); give every worker its own FLOTILLA_WORKER_ID",
                    self.settings.group,
                    self.settings.group_instance_id.as_deref().unwrap_or("?")
                )
            } else {
                format!("the Kafka client hit a fatal error: {code:?}: {detail}")
            };
            metrics::counter!("flotilla_consumer_fatal_errors_total").increment(1);
            self.engine.health().dead("request consumer", reason);
        }
        true
    }

    /// When `error` says a message could not be read (librdkafka would skip
    /// it), stops consuming loudly instead: every partition paused, offsets
    /// never stored past it, an error logged and counted, and readiness
    /// failing. The client does not say which partition, so all stop.
    pub(crate) fn stall_on(&self, error: &KafkaError) -> bool {
        if !is_unreadable(error) {
            return false;
        }
        if !self.stalled.swap(true, std::sync::atomic::Ordering::SeqCst) {
            let reason = format!(
                "a message could not be read ({error}); consumption stopped so that nothing is committed past it"
            );
            metrics::counter!("flotilla_unreadable_messages_total").increment(1);
            self.engine.health().dead("request consumer", reason);
            let assignment = self.consumer.assignment().unwrap_or_default();
            if let Err(e) = self.consumer.pause(&assignment) {
                tracing::error!(error = %e, "pausing partitions failed");
            }
        }
        true
    }
}

/// Whether a consumer error means a message was skipped unread: a batch
/// that does not decompress or does not parse. Transport errors are not.
#[must_use]
pub fn is_unreadable(error: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as Code;
    matches!(
        error,
        KafkaError::MessageConsumption(
            Code::BadCompression | Code::BadMessage | Code::InvalidMessage | Code::InvalidRecord
        )
    )
}

#[cfg(test)]
mod tests {
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode as Code;

    use super::is_unreadable;

    #[test]
    fn a_batch_that_cannot_be_read_stops_consumption_and_transport_errors_do_not() {
        assert!(is_unreadable(&KafkaError::MessageConsumption(
            Code::BadCompression
        )));
        assert!(is_unreadable(&KafkaError::MessageConsumption(
            Code::InvalidMessage
        )));
        assert!(!is_unreadable(&KafkaError::MessageConsumption(
            Code::BrokerTransportFailure
        )));
        assert!(!is_unreadable(&KafkaError::MessageConsumption(
            Code::AllBrokersDown
        )));
        // Refused credentials are an outage: nothing is stalled or dead-lettered.
        for code in [
            Code::SaslAuthenticationFailed,
            Code::Authentication,
            Code::TopicAuthorizationFailed,
            Code::GroupAuthorizationFailed,
            Code::SSL,
        ] {
            assert!(
                !is_unreadable(&KafkaError::MessageConsumption(code)),
                "{code:?}"
            );
        }
    }
}
