//! `flotilla produce` and `produce-signal`: one WorkflowRunRequest or
//! WorkflowRunSignal to Kafka, keyed by job id, through `flotilla-client`.

use anyhow::Context as _;
use clap::Args;
use flotilla_client::{Receipt, Submission, SubmitError, Submitter, WorkflowRunSignal};
use flotilla_contracts::topics;
use flotilla_runtime::BrokerConfig;
use flotilla_runtime::registry::RegistryConfig;
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
    let text = match args.input.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("reading {path}"))
            .map_err(Failure::usage)?,
        None => args.input.clone(),
    };
    let input: serde_json::Value = serde_json::from_str(&text)
        .context("--input is not JSON")
        .map_err(Failure::usage)?;
    let mut submission = Submission::new(&args.workflow, &input).map_err(failure)?;
    if let Some(job_id) = args.job_id {
        submission = submission.with_job_id(job_id);
    }
    if let Some(traceparent) = args.traceparent {
        submission = submission.with_traceparent(traceparent, None);
    }
    let receipt = submitter(&args.kafka, args.json)?
        .with_request_topic(&args.topic)
        .submit(&submission)
        .await
        .map_err(failure)?;
    println!("{}", receipt.job_id());
    if let Receipt::Kafka {
        partition, offset, ..
    } = receipt
    {
        eprintln!(
            "produced to {} partition {partition} offset {offset}",
            args.topic
        );
    }
    Ok(())
}

/// The client library's Kafka submitter; JSON on the wire when `json_only`
/// even where a registry is configured.
pub(crate) fn submitter(kafka: &BrokerConfig, json_only: bool) -> Result<Submitter, Failure> {
    let mut broker = kafka.clone();
    if json_only {
        broker.registry = RegistryConfig::default();
    }
    Submitter::kafka(&broker).map_err(failure)
}

/// Exit codes: the request's own fault is bad input (2), the rest is the
/// world's (1).
pub(crate) fn failure(error: SubmitError) -> Failure {
    match error {
        SubmitError::Rejected(_) | SubmitError::Settings(_) => Failure::usage(error),
        SubmitError::Unavailable(_) => Failure::delivery(error),
    }
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
    let payload = crate::jobs::json_arg(&args.payload, "the payload")?;
    let source = match &args.source {
        Some(source) => crate::jobs::json_arg(source, "--source")?,
        None => serde_json::Value::Null,
    };
    let signal = WorkflowRunSignal::new(args.job_id, &args.name, payload, source, args.key)
        .map_err(Failure::usage)?;
    let (partition, offset) = submitter(&args.kafka, args.json)?
        .with_signal_topic(&args.topic)
        .signal(&signal)
        .await
        .map_err(failure)?;
    eprintln!(
        "produced signal {} to {} partition {partition} offset {offset}",
        args.name, args.topic
    );
    Ok(())
}
