//! The demo target's Kafka mode: a service that listens on a topic, as a
//! Kafka target of a workflow step does. It reads each `WorkflowStepRequest`
//! (Avro or JSON), answers on the request's `reply_topic` with a
//! `WorkflowStepReply` naming its correlation id (in the fleet's encoding:
//! Avro with a registry), and commits its offset only once the reply is
//! acknowledged, so a request is answered at least once; a repeated answer
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
    // A group of its own per process: the test broker never hands a killed
    // member's partitions to a newcomer of its group (docs/operations.md,
    // "The test broker"), so a fixed group outlived by an earlier run's
    // target would leave the requests unread. A new process reads the topic
    // from its start; answering a request again is harmless.
    let group = format!("flotilla-demo-target-{}", uuid::Uuid::new_v4().simple());
    let consumer: StreamConsumer = broker
        .manual_commit_consumer(&group)
        // The test broker and librdkafka's mock cluster hold an empty fetch
        // for the whole wait even when a record arrives (a real Kafka
        // answers at once): a short wait keeps a request's answer prompt.
        .set("fetch.wait.max.ms", "20")
        .create()?;
    consumer.subscribe(&[topic.as_str()])?;
    let producer: FutureProducer = broker.idempotent_producer().create()?;
    println!("demo target answering step requests on {topic}");
    loop {
        let message = match consumer.recv().await {
            Ok(message) => message,
            Err(e) => {
                eprintln!("demo target: reading {topic}: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
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
                let key = request.job_id().to_string();
                // Until acknowledged: an unanswered request is answered again.
                while let Err((e, _)) = producer
                    .send(
                        FutureRecord::to(request.reply_topic())
                            .key(&key)
                            .payload(&bytes),
                        Duration::from_secs(10),
                    )
                    .await
                {
                    eprintln!("demo target: replying to {key}: {e}; again");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
            // Not a request this service can read: nothing to answer.
            Err(e) => eprintln!("demo target: a record on {topic} is not a step request: {e}"),
        }
        if let Err(e) = consumer.commit_message(&message, CommitMode::Async) {
            eprintln!("demo target: committing: {e}");
        }
    }
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
