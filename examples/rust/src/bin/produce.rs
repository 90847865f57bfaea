//! Submits workflow runs through Kafka with `flotilla-client` and prints
//! each job id once the broker has it.
//!
//! ```text
//! KAFKA_BOOTSTRAP_SERVERS=localhost:9092 SCHEMA_REGISTRY_URL=http://localhost:8081 \
//!   flotilla-example-produce --workflow archive --count 10
//! ```

use clap::Parser;
use flotilla_client::{BrokerConfig, Submission, Submitter};
use std::time::Duration;

#[derive(Debug, Parser)]
struct Args {
    /// The registered workflow to run.
    #[arg(long)]
    workflow: String,
    /// How many runs to submit; each gets `{"n": <its number>}` as input.
    #[arg(long, default_value_t = 1)]
    count: u32,
    /// The request topic.
    #[arg(
        long,
        env = "FLOTILLA_REQUEST_TOPIC",
        default_value = "workflow-run-requests"
    )]
    topic: String,
    #[command(flatten)]
    broker: BrokerConfig,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let submitter = Submitter::kafka(&args.broker)?.with_request_topic(&args.topic);
    for n in 1..=args.count {
        let submission = Submission::new(&args.workflow, &serde_json::json!({ "n": n }))?;
        // Only an outage is worth a retry, and a retry keeps the job id:
        // the fleet takes the same id twice as one job.
        let mut pause = Duration::from_millis(200);
        let receipt = loop {
            match submitter.submit(&submission).await {
                Err(e) if e.is_retryable() => {
                    eprintln!("produce: {e}; retrying in {pause:?}");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(10));
                }
                // Rejected or Settings: the same request would fail again.
                Err(e) => return Err(e.into()),
                Ok(receipt) => break receipt,
            }
        };
        println!("{}", receipt.job_id());
    }
    Ok(())
}
