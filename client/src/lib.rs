//! Talk to a Flotilla fleet from your own service: submit workflow runs,
//! and consume what happens to them.
//!
//! - [`Submitter`] sends a `WorkflowRunRequest` through Kafka (an
//!   idempotent producer waiting for every in-sync replica, keyed by job
//!   id, Avro through the Schema Registry or JSON, the current span's
//!   `traceparent` attached) or through a worker's HTTP API, and returns
//!   once the request is durable.
//! - [`Jobs`] reads and acts on jobs already submitted through the API:
//!   get, list, wait for one, cancel, retry, signal, complete a step,
//!   events, and retry or cancel many by filter.
//! - [`EventStream`] consumes `workflow-run-events` and yields each job's
//!   events once and in `sequence` order: repeats are dropped, a skipped
//!   sequence is reported as [`StreamError::Gap`], both encodings decode to
//!   the same [`WorkflowRunEvent`], and offsets are committed only past
//!   events you [acknowledged](EventStream::ack).
//!
//! Kafka is the `kafka` feature, on by default. A service that only talks
//! HTTP turns it off (`default-features = false`): no librdkafka to build,
//! and [`Submitter::api`], [`Jobs`] and `submit_and_wait` through the API
//! remain.
//!
//! ```no_run
//! use flotilla_client::{
//!     BrokerConfig, EventStream, EventStreamOptions, StreamError, Submission, Submitter,
//! };
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = BrokerConfig::new("localhost:9092");
//! let submitter = Submitter::kafka(&broker)?;
//! let receipt = submitter
//!     .submit(&Submission::new("order-fulfilment", &serde_json::json!({"order": 42}))?)
//!     .await?;
//! println!("submitted {}", receipt.job_id());
//!
//! let mut events = EventStream::subscribe(&broker, &EventStreamOptions::new("billing"))?;
//! loop {
//!     let delivery = match events.next().await {
//!         Ok(delivery) => delivery,
//!         // Events before this one never arrived: note it, then go on with it.
//!         Err(StreamError::Gap { job_id, expected, delivery, .. }) => {
//!             eprintln!("job {job_id}: events from {expected} missing");
//!             *delivery
//!         }
//!         // A record that is no event is skipped; the partition goes on.
//!         Err(StreamError::Undecodable { reason, .. }) => {
//!             eprintln!("skipped: {reason}");
//!             continue;
//!         }
//!         // The broker or registry away: the same record comes again.
//!         Err(StreamError::Unavailable(e)) => {
//!             eprintln!("unavailable, trying again: {e}");
//!             tokio::time::sleep(std::time::Duration::from_secs(1)).await;
//!             continue;
//!         }
//!         // Settings that cannot work (Avro and no registry): stop.
//!         Err(e) => return Err(e.into()),
//!     };
//!     let event = delivery.event();
//!     println!("{} #{} {}", event.job_id(), event.sequence(), event.event_type());
//!     events.ack(&delivery);
//! }
//! # }
//! ```
//!
//! **Exactly-once effects downstream.** Kafka delivers at least once and
//! the fleet may publish an event twice, so the stream's in-memory
//! de-duplication is not enough across restarts. Keep the last sequence
//! applied for each job in your own database, read and write it in the
//! same transaction as the event's effect, judge each event with
//! [`classify`], and acknowledge only after that transaction commits. A
//! consumer killed between its commit and the acknowledgement reads the
//! event again and finds it applied. `examples/rust/src/bin/outcomes.rs`
//! in the repository does exactly that with Postgres.

#[cfg(feature = "kafka")]
mod acks;
mod bulk;
#[cfg(feature = "kafka")]
mod ends;
mod jobs;
mod order;
mod outcome;
#[cfg(feature = "kafka")]
mod produce;
#[cfg(feature = "kafka")]
mod stream;
mod submit;
mod submit_error;
mod waiting;

pub use flotilla_contracts::{WorkflowRunEvent, WorkflowRunEventType, WorkflowRunSignal};
#[cfg(feature = "kafka")]
pub use flotilla_runtime::BrokerConfig;
#[cfg(feature = "kafka")]
pub use flotilla_runtime::kafka::GroupProtocol;
#[cfg(feature = "kafka")]
pub use flotilla_runtime::registry::RegistryConfig;
pub use jobs::{Job, JobFilter, JobPage, Jobs, JobsError, ROUTES as JOBS_ROUTES};
pub use order::{JobSequences, Verdict, classify};
pub use outcome::WaitError;
pub use secrecy::SecretString;
#[cfg(feature = "kafka")]
pub use stream::{Delivery, EventStream, EventStreamOptions, StartAt, StreamError};
pub use submit::{Receipt, Submission, SubmitError, Submitter};
