//! The Kafka route of [`Submitter`](crate::Submitter) (the `kafka`
//! feature): requests and signals produced by an idempotent producer,
//! keyed by job id, encoded by the codec, with the trace context in the
//! record's headers.

use std::time::Duration;

use flotilla_codec::Codec;
use flotilla_contracts::avro::AvroMessage;
use flotilla_contracts::{WorkflowRunRequest, WorkflowRunSignal, topics};
use flotilla_runtime::BrokerConfig;
use flotilla_runtime::kafka::security::{is_refused_access, is_refused_for_itself};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use uuid::Uuid;

use crate::ends::EndsFeed;
use crate::submit_error::SubmitError;

/// How long a record may wait for room in the producer's queue.
const QUEUE_WAIT: Duration = Duration::from_secs(30);

/// What a submitter through Kafka holds.
pub(crate) struct KafkaRoute {
    producer: FutureProducer,
    codec: Codec,
    pub(crate) request_topic: String,
    pub(crate) signal_topic: String,
    /// What `submit_and_wait` reads the jobs' ends from.
    pub(crate) ends: EndsFeed,
}

impl KafkaRoute {
    /// The contract's producer and the codec for `broker`.
    ///
    /// # Errors
    /// [`SubmitError::Settings`] for settings that cannot work.
    pub(crate) fn new(broker: &BrokerConfig) -> Result<Self, SubmitError> {
        broker
            .validate()
            .map_err(|e| SubmitError::Settings(e.to_string()))?;
        let codec = Codec::from_config(&broker.registry)?;
        let producer = broker
            .idempotent_producer()
            .create()
            .map_err(|e| SubmitError::Settings(format!("creating the producer: {e}")))?;
        Ok(Self {
            producer,
            codec,
            request_topic: topics::REQUEST_TOPIC.to_owned(),
            signal_topic: topics::SIGNAL_TOPIC.to_owned(),
            ends: EndsFeed::new(broker.clone()),
        })
    }

    /// Produces `request` and waits for every in-sync replica: its
    /// partition and offset.
    pub(crate) async fn submit(
        &self,
        request: &WorkflowRunRequest,
        trace: Option<(String, Option<String>)>,
    ) -> Result<(i32, i64), SubmitError> {
        self.produce(&self.request_topic, request.job_id(), request, trace)
            .await
    }

    /// Produces `signal`: its partition and offset.
    pub(crate) async fn signal(
        &self,
        signal: &WorkflowRunSignal,
    ) -> Result<(i32, i64), SubmitError> {
        self.produce(&self.signal_topic, signal.job_id(), signal, None)
            .await
    }

    async fn produce<M: AvroMessage>(
        &self,
        topic: &str,
        job_id: Uuid,
        message: &M,
        trace: Option<(String, Option<String>)>,
    ) -> Result<(i32, i64), SubmitError> {
        let payload = self.codec.encode(topic, message).await?;
        let key = job_id.to_string();
        let mut record = FutureRecord::to(topic).key(&key).payload(&payload);
        if let Some((traceparent, tracestate)) = &trace {
            let mut headers = OwnedHeaders::new().insert(Header {
                key: "traceparent",
                value: Some(traceparent.as_bytes()),
            });
            if let Some(tracestate) = tracestate {
                headers = headers.insert(Header {
                    key: "tracestate",
                    value: Some(tracestate.as_bytes()),
                });
            }
            record = record.headers(headers);
        }
        let delivery = self
            .producer
            .send(record, QUEUE_WAIT)
            .await
            .map_err(|(e, _)| delivery_error(topic, &e))?;
        Ok((delivery.partition, delivery.offset))
    }
}

/// A record the broker will never take is about the record; refused
/// access or a dead producer is about the settings; anything else is about
/// the broker.
fn delivery_error(topic: &str, error: &KafkaError) -> SubmitError {
    let text = format!("producing to {topic}: {error}");
    match error.rdkafka_error_code() {
        Some(code) if is_refused_for_itself(code) => SubmitError::Rejected(text),
        _ if is_refused_access(error) => SubmitError::Settings(text),
        Some(RDKafkaErrorCode::InvalidTopic | RDKafkaErrorCode::Fatal) => {
            SubmitError::Settings(text)
        }
        _ => SubmitError::Unavailable(text),
    }
}
