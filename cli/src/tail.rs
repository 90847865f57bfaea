//! `flotilla tail`: follow the event topic through `flotilla-client`'s
//! `EventStream` (either encoding, each job's events once and in order).

use std::time::Duration;

use clap::Args;
use flotilla_client::{
    EventStream, EventStreamOptions, StartAt, StreamError, WorkflowRunEventType,
};
use flotilla_contracts::topics;
use flotilla_runtime::BrokerConfig;
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
    // A throwaway group of its own that never commits: each `tail` sees
    // the whole stream from where it starts, and leaves nothing behind.
    let options = EventStreamOptions::new(&format!("flotilla-tail-{}", Uuid::new_v4().simple()))
        .without_commits()
        .topic(&args.topic)
        .start_at(if args.from_beginning || args.job.is_some() {
            StartAt::Earliest
        } else {
            StartAt::Latest
        });
    let mut stream = EventStream::subscribe(&args.kafka, &options).map_err(|e| match e {
        StreamError::Settings(_) => Failure::usage(e),
        _ => Failure::delivery(e),
    })?;
    let follow = follow(&mut stream, &args);
    match args.timeout {
        Some(limit) => tokio::time::timeout(limit, follow)
            .await
            .unwrap_or_else(|_| {
                Err(Failure::delivery(anyhow::anyhow!(
                    "no terminal event within {limit:?}"
                )))
            }),
        None => follow.await,
    }
}

/// Prints each job's events once and in order (the client library drops
/// repeats), a skipped sequence as a warning, until a terminal event when
/// asked.
async fn follow(stream: &mut EventStream, args: &TailArgs) -> Result<(), Failure> {
    loop {
        let delivery = match stream.next().await {
            Ok(delivery) => delivery,
            Err(StreamError::Gap {
                job_id,
                expected,
                got,
                delivery,
            }) => {
                if args.job.is_none_or(|job| job == job_id) {
                    eprintln!(
                        "flotilla: job {job_id}: events {expected}..{} never arrived",
                        got - 1
                    );
                }
                *delivery
            }
            Err(e @ StreamError::Undecodable { .. }) => {
                eprintln!("flotilla: skipping: {e}");
                continue;
            }
            Err(e) => {
                // e.g. the topic does not exist yet: keep following.
                eprintln!("flotilla: {e}; still following");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        stream.ack(&delivery);
        let event = delivery.into_event();
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
            return if event.event_type() == WorkflowRunEventType::Completed {
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
