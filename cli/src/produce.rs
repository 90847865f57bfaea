//! `flotilla produce` and `produce-signal`: one WorkflowRunRequest or
//! WorkflowRunSignal to Kafka, keyed by job id.

use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use flotilla_codec::Codec;
use flotilla_contracts::avro::AvroMessage;
use flotilla_contracts::{WorkflowRunRequest, WorkflowRunSignal, json, topics};
use flotilla_runtime::BrokerConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use uuid::Uuid;

use crate::Failure;

#[derive(Debug, Args)]
pub(crate) struct ProduceArgs {
    /// The stored workflow to run.
    #[arg(long)]
    workflow: String,
    /// The input document: JSON text, or @path to read it from a file.
    #[arg(long, default_value = "{}")]
    input: String,
    /// The job id (the idempotency key); a new one when omitted.
    #[arg(long)]
    job_id: Option<Uuid>,
    #[command(flatten)]
    kafka: BrokerConfig,
    /// Request topic.
    #[arg(long, env = "FLOTILLA_REQUEST_TOPIC", default_value = topics::REQUEST_TOPIC)]
    topic: String,
    /// Force JSON even when a registry is configured.
    #[arg(long)]
    json: bool,
    /// W3C trace context to attach, so the run joins the caller's trace.
    #[arg(long)]
    traceparent: Option<String>,
}

pub(crate) async fn run(args: ProduceArgs) -> Result<(), Failure> {
    args.kafka.validate().map_err(Failure::usage)?;
    let text = match args.input.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("reading {path}"))
            .map_err(Failure::usage)?,
        None => args.input.clone(),
    };
    let input: serde_json::Value = serde_json::from_str(&text)
        .context("--input is not JSON")
        .map_err(Failure::usage)?;
    let job_id = args.job_id.unwrap_or_else(Uuid::new_v4);
    let request = WorkflowRunRequest::new(job_id, &args.workflow, input).map_err(Failure::usage)?;

    let (partition, offset) = send(
        &args.kafka,
        (&args.topic, args.json),
        &job_id,
        &request,
        args.traceparent.as_deref(),
    )
    .await?;
    println!("{job_id}");
    eprintln!(
        "produced to {} partition {partition} offset {offset}",
        args.topic
    );
    Ok(())
}

/// Encodes `message` (Avro when a registry is configured and `json_only`
/// is not set, JSON otherwise) and produces it to `topic` keyed by
/// `job_id`, waiting for the broker's acknowledgement: its partition and
/// offset.
pub(crate) async fn send<M: AvroMessage>(
    kafka: &BrokerConfig,
    (topic, json_only): (&str, bool),
    job_id: &Uuid,
    message: &M,
    traceparent: Option<&str>,
) -> Result<(i32, i64), Failure> {
    let registry = (!json_only).then_some(&kafka.registry);
    let codec = match registry {
        Some(registry) => Codec::from_config(registry).map_err(Failure::usage)?,
        None => Codec::json(),
    };
    let bytes = match codec {
        codec if registry.is_some_and(|r| r.url().is_some()) => codec
            .encode(topic, message)
            .await
            .map_err(Failure::delivery)?,
        _ => json::encode(message).map_err(Failure::usage)?,
    };
    let producer: FutureProducer = kafka
        .idempotent_producer()
        .create()
        .map_err(Failure::delivery)?;
    let key = job_id.to_string();
    let mut record = FutureRecord::to(topic).key(&key).payload(&bytes);
    if let Some(traceparent) = traceparent {
        record = record.headers(OwnedHeaders::new().insert(Header {
            key: "traceparent",
            value: Some(traceparent.as_bytes()),
        }));
    }
    let delivery = producer
        .send(record, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| Failure::delivery(anyhow::anyhow!("producing to {topic}: {e}")))?;
    Ok((delivery.partition, delivery.offset))
}

#[derive(Debug, Args)]
pub(crate) struct ProduceSignalArgs {
    /// The job the signal is for.
    job_id: Uuid,
    /// The signal's name: what a `wait_for` step of the job waits for.
    name: String,
    /// The payload: JSON text, or @path to read it from a file.
    #[arg(default_value = "{}")]
    payload: String,
    /// Who sends it, as JSON.
    #[arg(long)]
    source: Option<String>,
    /// The same key twice is one signal; without one, the record's
    /// partition and offset are its key.
    #[arg(long)]
    key: Option<String>,
    #[command(flatten)]
    kafka: BrokerConfig,
    /// Signal topic.
    #[arg(long, env = "FLOTILLA_SIGNAL_TOPIC", default_value = topics::SIGNAL_TOPIC)]
    topic: String,
    /// Force JSON even when a registry is configured.
    #[arg(long)]
    json: bool,
}

/// `flotilla produce-signal`: one WorkflowRunSignal to Kafka, keyed by job id.
pub(crate) async fn run_signal(args: ProduceSignalArgs) -> Result<(), Failure> {
    args.kafka.validate().map_err(Failure::usage)?;
    let payload = crate::jobs::json_arg(&args.payload, "the payload")?;
    let source = match &args.source {
        Some(source) => crate::jobs::json_arg(source, "--source")?,
        None => serde_json::Value::Null,
    };
    let signal = WorkflowRunSignal::new(args.job_id, &args.name, payload, source, args.key)
        .map_err(Failure::usage)?;
    let (partition, offset) = send(
        &args.kafka,
        (&args.topic, args.json),
        &args.job_id,
        &signal,
        None,
    )
    .await?;
    eprintln!(
        "produced signal {} to {} partition {partition} offset {offset}",
        args.name, args.topic
    );
    Ok(())
}
