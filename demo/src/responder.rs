//! The demo target's Kafka mode: a service that listens on a topic, as a
//! Kafka target of a workflow step does. It reads each `WorkflowStepRequest`
//! (Avro or JSON), answers on the request's `reply_topic` with a
//! `WorkflowStepReply` naming its correlation id (in the fleet's encoding:
//! Avro with a registry), a batch of requests at a time, and commits their
//! offsets only once their replies are acknowledged, so a request is answered at least once; a repeated answer
//! is harmless (the worker drops it).
//!
//! The fraud model it plays: `risk` is the request's `amount` modulo 100,
//! as a share.

use std::time::Duration;

use flotilla_codec::Codec;
use flotilla_contracts::{WorkflowStepReply, WorkflowStepRequest};
use flotilla_runtime::BrokerConfig;
use rdkafka::Message as _;
use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::message::BorrowedMessage;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{Value, json};

/// The answer to one request.
#[must_use]
pub fn answer(request: &WorkflowStepRequest) -> Value {
    let amount = request.request()["amount"].as_i64().unwrap_or(0);
    #[allow(clippy::cast_precision_loss)]
    let risk = amount.rem_euclid(100) as f64 / 100.0;
    json!({ "risk": risk, "model": "demo-fraud-model" })
}

/// Answers the requests on `topic` until the process ends.
///
/// # Errors
/// The clients cannot be created or subscribed.
pub async fn respond(broker: BrokerConfig, codec: Codec, topic: String) -> anyhow::Result<()> {
    // A group of its own per process: the target is stopped without
    // leaving its group, and a successor in the same group would wait out
    // the dead member's session (45 s) before reading, longer than a
    // screening step's deadline. A new process reads the topic from its
    // start; answering a request again is harmless (the worker takes the
    // first reply of each correlation id).
    let group = format!("flotilla-demo-target-{}", uuid::Uuid::new_v4().simple());
    let consumer: StreamConsumer = broker.manual_commit_consumer(&group).create()?;
    consumer.subscribe(&[topic.as_str()])?;
    let producer: FutureProducer = broker.idempotent_producer().create()?;
    println!("demo target answering step requests on {topic}");
    loop {
        let batch = next_batch(&consumer, &topic).await;
        // Every reply of the batch on its way at once, then each awaited
        // (sent again until acknowledged), then the batch's offsets
        // committed: answered at least once, without a round trip per
        // request.
        let mut replies = Vec::with_capacity(batch.len());
        for message in &batch {
            match codec
                .decode::<WorkflowStepRequest>(message.payload().unwrap_or_default())
                .await
            {
                Ok(request) => {
                    let reply = WorkflowStepReply::answer(
                        request.job_id(),
                        request.correlation_id(),
                        answer(&request),
                    )?;
                    let bytes = codec.encode(request.reply_topic(), &reply).await?;
                    let (topic, key) = (
                        request.reply_topic().to_owned(),
                        request.job_id().to_string(),
                    );
                    replies.push((topic, key, bytes));
                }
                // Not a request this service can read: nothing to answer.
                Err(e) => eprintln!("demo target: a record on {topic} is not a step request: {e}"),
            }
        }
        let producer = &producer;
        let sends = replies.iter().map(|(topic, key, bytes)| async move {
            while let Err((e, _)) = producer
                .send(
                    FutureRecord::to(topic).key(key).payload(bytes),
                    Duration::from_secs(10),
                )
                .await
            {
                eprintln!("demo target: replying to {key}: {e}; again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        futures_util::future::join_all(sends).await;
        for message in &batch {
            if let Err(e) = consumer.store_offset_from_message(message) {
                eprintln!("demo target: storing an offset: {e}");
            }
        }
        if let Err(e) = consumer.commit_consumer_state(CommitMode::Async) {
            eprintln!("demo target: committing: {e}");
        }
    }
}

/// The next message, and whatever else is already waiting (up to 500).
async fn next_batch<'a>(consumer: &'a StreamConsumer, topic: &str) -> Vec<BorrowedMessage<'a>> {
    let mut batch = Vec::new();
    while batch.is_empty() {
        match consumer.recv().await {
            Ok(message) => batch.push(message),
            Err(e) => {
                eprintln!("demo target: reading {topic}: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    while batch.len() < 500 {
        match tokio::time::timeout(Duration::from_millis(2), consumer.recv()).await {
            Ok(Ok(message)) => batch.push(message),
            Ok(Err(_)) | Err(_) => break,
        }
    }
    batch
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_risk_is_the_amount_modulo_a_hundred() {
        let request = WorkflowStepRequest::new(flotilla_contracts::StepRequestParts {
            job_id: uuid::Uuid::new_v4(),
            step_name: "risk".into(),
            attempt: 1,
            correlation_id: uuid::Uuid::new_v4(),
            reply_topic: "replies".into(),
            request: json!({"amount": 142}),
            deadline: chrono::Utc::now(),
        })
        .unwrap();
        assert_eq!(answer(&request)["risk"], json!(0.42));
    }
}
