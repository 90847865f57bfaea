//! Settings of the relay binary: every one a flag and an environment variable.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use flotilla_worker::config::{BrokerConfig, DatabaseConfig};
use flotilla_worker::telemetry::TelemetryConfig;

/// Publishes every committed outbox row to the event topic, keyed by job id.
#[derive(Debug, Parser)]
#[command(
    name = "flotilla-relay",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub database: DatabaseConfig,
    #[command(flatten)]
    pub relay: RelayArgs,
    #[command(flatten)]
    pub telemetry: TelemetryConfig,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Put FAILED outbox rows (all, or one job's) back to PENDING and exit.
    ReplayFailed {
        #[command(flatten)]
        database: DatabaseConfig,
        /// Only this job's rows.
        #[arg(long)]
        job_id: Option<uuid::Uuid>,
    },
}

#[derive(Debug, Clone, Args)]
pub struct RelayArgs {
    #[command(flatten)]
    pub broker: BrokerConfig,
    /// Topic of WorkflowRunEvent messages.
    #[arg(
        long,
        env = "FLOTILLA_EVENT_TOPIC",
        default_value = "workflow-run-events"
    )]
    pub event_topic: String,
    /// Partitions of the event topic when the relay creates it.
    #[arg(long, env = "FLOTILLA_TOPIC_PARTITIONS", default_value_t = 3)]
    pub topic_partitions: i32,
    /// This relay's name in the bucket leases; defaults to host name and process id.
    #[arg(long, env = "FLOTILLA_RELAY_ID")]
    pub relay_id: Option<String>,
    /// Rows published per round.
    #[arg(long, env = "FLOTILLA_RELAY_BATCH_SIZE", default_value_t = 500)]
    pub batch_size: i64,
    /// Longest an idle relay waits before looking again.
    #[arg(long, env = "FLOTILLA_RELAY_IDLE_POLL_MAX", default_value = "100ms", value_parser = humantime::parse_duration)]
    pub idle_poll_max: Duration,
    /// How long a bucket lease lasts without renewal.
    #[arg(long, env = "FLOTILLA_RELAY_LEASE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub lease: Duration,
    /// Base of the backoff after a failed publish (`base × 2^(attempts−1)`).
    #[arg(long, env = "FLOTILLA_RELAY_BACKOFF_BASE", default_value = "1s", value_parser = humantime::parse_duration)]
    pub backoff_base: Duration,
    /// How long the producer tries to deliver one record.
    #[arg(long, env = "FLOTILLA_RELAY_DELIVERY_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub delivery_timeout: Duration,
    /// Largest record the producer sends; bigger rows fail (and land FAILED).
    #[arg(
        long,
        env = "FLOTILLA_RELAY_MAX_MESSAGE_BYTES",
        default_value_t = 1_000_000
    )]
    pub max_message_bytes: usize,
    /// How long PUBLISHED rows are kept.
    #[arg(long, env = "FLOTILLA_OUTBOX_RETENTION", default_value = "7days", value_parser = humantime::parse_duration)]
    pub retention: Duration,
    /// How long in-flight deliveries may take after SIGTERM.
    #[arg(long, env = "FLOTILLA_SHUTDOWN_GRACE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,
}

/// The relay's settings as the library takes them.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    pub bootstrap_servers: String,
    pub schema_registry_url: Option<String>,
    pub event_topic: String,
    pub relay_id: String,
    pub batch_size: i64,
    pub idle_poll_max: Duration,
    pub lease: Duration,
    pub backoff_base: Duration,
    pub delivery_timeout: Duration,
    pub max_message_bytes: usize,
    pub retention: Duration,
    pub retention_batch: i64,
    pub retention_interval: Duration,
}

impl RelaySettings {
    #[must_use]
    pub fn new(bootstrap_servers: &str, event_topic: &str, relay_id: &str) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.to_owned(),
            schema_registry_url: None,
            event_topic: event_topic.to_owned(),
            relay_id: relay_id.to_owned(),
            batch_size: 500,
            idle_poll_max: Duration::from_millis(100),
            lease: Duration::from_secs(10),
            backoff_base: Duration::from_secs(1),
            delivery_timeout: Duration::from_secs(30),
            max_message_bytes: 1_000_000,
            retention: Duration::from_secs(7 * 24 * 3600),
            retention_batch: 1000,
            retention_interval: Duration::from_secs(60),
        }
    }
}

impl From<RelayArgs> for RelaySettings {
    fn from(args: RelayArgs) -> Self {
        let relay_id = args
            .relay_id
            .filter(|id| !id.trim().is_empty())
            .unwrap_or_else(|| {
                let host = flotilla_worker::config::resolve_worker_id(None)
                    .unwrap_or_else(|_| "relay".into());
                format!("{host}-{}", std::process::id())
            });
        let mut settings = Self::new(&args.broker.bootstrap_servers, &args.event_topic, &relay_id);
        settings.schema_registry_url = args.broker.schema_registry_url;
        settings.batch_size = args.batch_size.max(1);
        settings.idle_poll_max = args.idle_poll_max;
        settings.lease = args.lease;
        settings.backoff_base = args.backoff_base;
        settings.delivery_timeout = args.delivery_timeout;
        settings.max_message_bytes = args.max_message_bytes;
        settings.retention = args.retention;
        settings
    }
}
