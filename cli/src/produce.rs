//! `flotilla produce`: one WorkflowRunRequest to Kafka, keyed by job id.

use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use flotilla_codec::Codec;
use flotilla_contracts::{WorkflowRunRequest, json, topics};
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

    let registry = (!args.json).then_some(&args.kafka.registry);
    let codec = match registry {
        Some(registry) => Codec::from_config(registry).map_err(Failure::usage)?,
        None => Codec::json(),
    };
    let bytes = match codec {
        codec if registry.is_some_and(|r| r.url().is_some()) => codec
            .encode(&args.topic, &request)
            .await
            .map_err(Failure::delivery)?,
        _ => json::encode(&request).map_err(Failure::usage)?,
    };
    let producer: FutureProducer = args
        .kafka
        .idempotent_producer()
        .create()
        .map_err(Failure::delivery)?;
    let key = job_id.to_string();
    let mut record = FutureRecord::to(&args.topic).key(&key).payload(&bytes);
    if let Some(traceparent) = &args.traceparent {
        record = record.headers(OwnedHeaders::new().insert(Header {
            key: "traceparent",
            value: Some(traceparent.as_bytes()),
        }));
    }
    let delivery = producer
        .send(record, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| Failure::delivery(anyhow::anyhow!("producing to {}: {e}", args.topic)))?;
    println!("{job_id}");
    eprintln!(
        "produced to {} partition {} offset {}",
        args.topic, delivery.partition, delivery.offset
    );
    Ok(())
}
