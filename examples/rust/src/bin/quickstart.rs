//! `docs/clients.md`'s "Five minutes with Rust", line for line between the
//! markers (`scripts/check-quickstarts` holds the page and this file to each
//! other and runs this against the demo's fleet), with the `handle` the page
//! leaves to you: it prints each event, and ends the program at the end of
//! an `order` job accepted after it started, exiting 0 when that job
//! COMPLETED.
//!
//! ```text
//! source .services/demo/fleet.env
//! cargo run -p flotilla-examples --bin flotilla-example-quickstart
//! ```

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use flotilla_client::{WorkflowRunEvent, WorkflowRunEventType};

/// When this program started, in microseconds since the epoch: events
/// before it are of jobs submitted by someone else.
static STARTED_MICROS: OnceLock<i64> = OnceLock::new();

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?;
    STARTED_MICROS.get_or_init(|| i64::try_from(now.as_micros()).unwrap_or(i64::MAX));
    let Err(stopped) = quickstart().await;
    match stopped.downcast_ref::<Ended>() {
        Some(Ended(WorkflowRunEventType::Completed)) => Ok(()),
        _ => Err(stopped),
    }
}

/// The page's block, as printed (not reformatted: the page is the source).
#[rustfmt::skip]
async fn quickstart() -> anyhow::Result<std::convert::Infallible> {
    // quickstart:begin
    use flotilla_client::{
        BrokerConfig, EventStream, EventStreamOptions, RegistryConfig, StreamError, Submission, Submitter,
    };

    // The fleet's settings (`source .services/demo/fleet.env` sets the demo's).
    let setting = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
    let mut broker = BrokerConfig::new(&setting("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092"));
    // Avro through the registry; an empty URL means JSON.
    broker.registry = RegistryConfig::new(&setting("SCHEMA_REGISTRY_URL", "http://localhost:8081"));
    let submitter = Submitter::kafka(&broker)?
        .with_request_topic(&setting("FLOTILLA_REQUEST_TOPIC", "workflow-run-requests"));
    let receipt = submitter
        .submit(&Submission::new("order", &serde_json::json!({"name": "Grace"}))?)
        .await?;
    println!("job {}", receipt.job_id());

    let options = EventStreamOptions::new("billing")
        .topic(&setting("FLOTILLA_EVENT_TOPIC", "workflow-run-events"));
    let mut events = EventStream::subscribe(&broker, &options)?;
    loop {
        match events.next().await {
            Ok(delivery) => {
                handle(delivery.event()).await?;   // your effect, made durable
                events.ack(&delivery);             // only now may its offset be committed
            }
            Err(StreamError::Gap { delivery, .. }) => {
                // Events before this one never arrived (see the table below):
                // note it, then apply this one like any other.
                handle(delivery.event()).await?;
                events.ack(&delivery);
            }
            Err(StreamError::Undecodable { reason, .. }) => eprintln!("skipped: {reason}"),
            Err(StreamError::Unavailable(e)) => eprintln!("unavailable, trying again: {e}"),
            Err(e @ StreamError::Settings(_)) => return Err(e.into()), // e.g. Avro and no registry
        }
    }
    // quickstart:end
}

/// The job this program submitted ended, as this type says.
#[derive(Debug)]
struct Ended(WorkflowRunEventType);

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the order ended {}", self.0.as_str())
    }
}

impl std::error::Error for Ended {}

/// Your effect goes here; this one prints the event, and stops the
/// program once the order it submitted has ended.
async fn handle(event: &WorkflowRunEvent) -> anyhow::Result<()> {
    println!(
        "{} {} {}",
        event.job_id(),
        event.sequence(),
        event.event_type().as_str()
    );
    let started = STARTED_MICROS.get().copied().unwrap_or(i64::MAX);
    let ours =
        event.workflow_name() == "order" && event.occurred_at().timestamp_micros() >= started;
    if ours && event.event_type().is_terminal() {
        return Err(Ended(event.event_type()).into());
    }
    Ok(())
}
