//! `flotilla tail`: follow the event topic, decoding either encoding.

use std::time::Duration;

use clap::Args;
use flotilla_codec::Codec;
use flotilla_contracts::{WorkflowRunEvent, topics};
use flotilla_runtime::BrokerConfig;
use rdkafka::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};
use uuid::Uuid;

use crate::Failure;

#[derive(Debug, Args)]
pub(crate) struct TailArgs {
    /// Only this job's events.
    #[arg(long)]
    job: Option<Uuid>,
    /// With --job: exit once the job reaches a terminal state (COMPLETED,
    /// FAILED, DEAD, CANCELLED); exit code 0 for COMPLETED, 6 otherwise.
    #[arg(long, requires = "job")]
    until_terminal: bool,
    /// Read from the start of the topic instead of from now.
    #[arg(long)]
    from_beginning: bool,
    /// Give up after this long (for scripts), e.g. `2m`.
    #[arg(long, value_parser = humantime::parse_duration)]
    timeout: Option<Duration>,
    #[command(flatten)]
    kafka: BrokerConfig,
    /// Event topic.
    #[arg(long, env = "FLOTILLA_EVENT_TOPIC", default_value = topics::EVENT_TOPIC)]
    topic: String,
    /// Print each event as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: TailArgs) -> Result<(), Failure> {
    args.kafka.validate().map_err(Failure::usage)?;
    let codec = Codec::from_config(&args.kafka.registry).map_err(Failure::usage)?;
    let consumer: StreamConsumer = args
        .kafka
        .client()
        .set(
            "group.id",
            format!("flotilla-tail-{}", Uuid::new_v4().simple()),
        )
        .set("enable.auto.commit", "false")
        .set(
            "auto.offset.reset",
            if args.from_beginning || args.job.is_some() {
                "earliest"
            } else {
                "latest"
            },
        )
        .create()
        .map_err(Failure::delivery)?;
    consumer
        .subscribe(&[&args.topic])
        .map_err(Failure::delivery)?;
    let follow = follow(&consumer, &codec, &args);
    let result = match args.timeout {
        Some(limit) => tokio::time::timeout(limit, follow)
            .await
            .unwrap_or_else(|_| {
                Err(Failure::delivery(anyhow::anyhow!(
                    "no terminal event within {limit:?}"
                )))
            }),
        None => follow.await,
    };
    consumer.unsubscribe();
    std::thread::spawn(move || drop(consumer));
    result
}

async fn follow(consumer: &StreamConsumer, codec: &Codec, args: &TailArgs) -> Result<(), Failure> {
    loop {
        let message = match consumer.recv().await {
            Ok(message) => message,
            Err(e) => {
                // e.g. the topic does not exist yet: keep following.
                eprintln!("flotilla: {e}; still following");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let Some(payload) = message.payload() else {
            continue;
        };
        let event: WorkflowRunEvent = match codec.decode(payload).await {
            Ok(event) => event,
            Err(e) => {
                eprintln!(
                    "flotilla: skipping undecodable event at {}/{}: {e}",
                    message.partition(),
                    message.offset()
                );
                continue;
            }
        };
        if args.job.is_some_and(|job| job != event.job_id()) {
            continue;
        }
        if args.json {
            println!("{}", serde_json::to_string(&event).unwrap_or_default());
        } else {
            let detail = event
                .step_name()
                .or(event.verdict())
                .or(event.error())
                .unwrap_or("");
            println!(
                "{}  {}  #{:<3} {:<15} {}",
                event.occurred_at().to_rfc3339(),
                event.job_id(),
                event.sequence(),
                event.event_type(),
                detail
            );
        }
        if args.until_terminal && event.event_type().is_terminal() {
            return if event.event_type() == flotilla_contracts::WorkflowRunEventType::Completed {
                Ok(())
            } else {
                Err(Failure {
                    error: anyhow::anyhow!("job ended {}", event.event_type()),
                    exit_code: 6,
                })
            };
        }
    }
}
