//! Both schemas register with the real registry, and an Avro-framed event goes
//! through the broker and decodes back through the registry.

use std::time::Duration;

use chrono::Utc;
use flotilla_codec::Codec;
use flotilla_contracts::{EventHeader, WorkflowRunEvent, WorkflowRunRequest, framing};
use flotilla_tests::{
    KAFKA_TEST_TIMEOUT, bootstrap_servers, close_consumer, create_topic,
    manual_commit_consumer_config, schema_registry_url, unique,
};
use rdkafka::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use uuid::Uuid;

async fn avro_event_through_broker_and_registry() -> anyhow::Result<()> {
    let request_topic = unique("smoke-requests");
    let event_topic = unique("smoke-events");
    let codec = Codec::with_registry(&schema_registry_url())?;

    let request_id = codec
        .schema_id::<WorkflowRunRequest>(&request_topic)
        .await?;
    let event_id = codec.schema_id::<WorkflowRunEvent>(&event_topic).await?;
    assert_ne!(request_id, event_id, "two subjects, two schemas");
    // Registering again finds the same schema.
    let again = Codec::with_registry(&schema_registry_url())?;
    assert_eq!(
        again.schema_id::<WorkflowRunEvent>(&event_topic).await?,
        event_id
    );

    let job_id = Uuid::new_v4();
    let event = WorkflowRunEvent::completed(
        EventHeader {
            event_id: Uuid::new_v4(),
            job_id,
            sequence: 4,
            workflow_name: "smoke".into(),
            attempt: 1,
            occurred_at: Utc::now(),
        },
        "done",
        serde_json::json!({"ok": true}),
    )?;
    let bytes = codec.encode(&event_topic, &event).await?;
    assert_eq!(
        framing::detect(&bytes)?,
        framing::Framed::Avro {
            schema_id: event_id,
            datum: &bytes[5..]
        }
    );

    create_topic(&event_topic, 3).await?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()?;
    let key = job_id.to_string();
    producer
        .send(
            FutureRecord::to(&event_topic).key(&key).payload(&bytes),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)?;

    let consumer: StreamConsumer =
        manual_commit_consumer_config(&unique("smoke-group")).create()?;
    consumer.subscribe(&[&event_topic])?;
    let message = consumer.recv().await?;
    let payload = message.payload().unwrap_or_default().to_vec();
    assert_eq!(message.key(), Some(key.as_bytes()));
    drop(message);
    close_consumer(consumer);

    // A fresh codec has nothing cached: it must fetch the schema by id.
    let reader = Codec::with_registry(&schema_registry_url())?;
    let decoded: WorkflowRunEvent = reader.decode(&payload).await?;
    assert_eq!(decoded, event);
    Ok(())
}

#[tokio::test]
async fn avro_framed_event_round_trips_through_broker_and_registry() {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, avro_event_through_broker_and_registry())
        .await
        .expect("the registry smoke test timed out")
        .expect("the registry smoke test failed");
}
