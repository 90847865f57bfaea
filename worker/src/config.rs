//! Settings of the worker binary: every one a flag and an environment variable.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// A Flotilla fleet member: consumes run requests, claims and runs jobs.
#[derive(Debug, Parser)]
#[command(
    name = "flotilla-worker",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub worker: WorkerConfig,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply the database migrations and exit.
    Migrate {
        #[command(flatten)]
        database: DatabaseConfig,
    },
}

#[derive(Debug, Clone, Args)]
pub struct WorkerConfig {
    #[command(flatten)]
    pub database: DatabaseConfig,
    #[command(flatten)]
    pub kafka: KafkaConfig,
    #[command(flatten)]
    pub telemetry: crate::telemetry::TelemetryConfig,

    /// Lease owner written on claimed rows; defaults to the host name.
    #[arg(long, env = "FLOTILLA_WORKER_ID")]
    pub worker_id: Option<String>,

    #[command(flatten)]
    pub engine: EngineConfig,
    #[command(flatten)]
    pub http: HttpConfig,

    /// How long in-flight work may take to finish after SIGTERM.
    #[arg(long, env = "FLOTILLA_SHUTDOWN_GRACE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,
}

impl WorkerConfig {
    /// The worker id: the configured one, else the host name. Never blank.
    ///
    /// # Errors
    /// A blank configured id, or no host name to fall back on.
    pub fn worker_id(&self) -> anyhow::Result<String> {
        resolve_worker_id(self.worker_id.as_deref())
    }
}

/// Picks the worker id: configured, else the host name; refuses blank.
///
/// # Errors
/// The id (configured or the host name) is blank.
pub fn resolve_worker_id(configured: Option<&str>) -> anyhow::Result<String> {
    let id = match configured {
        Some(id) => id.to_owned(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_default(),
    };
    let id = id.trim();
    anyhow::ensure!(
        !id.is_empty(),
        "the worker id is blank: set FLOTILLA_WORKER_ID (it names the lease owner on claimed rows)"
    );
    Ok(id.to_owned())
}

#[derive(Debug, Clone, Args)]
pub struct DatabaseConfig {
    /// Postgres connection string.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,

    /// Most connections this process keeps open.
    #[arg(long, env = "FLOTILLA_DB_MAX_CONNECTIONS", default_value_t = 10)]
    pub db_max_connections: u32,

    /// How long to wait for a connection from the pool.
    #[arg(long, env = "FLOTILLA_DB_ACQUIRE_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub db_acquire_timeout: Duration,
}

/// Where the broker and the Schema Registry are: shared by the worker and the relay.
#[derive(Debug, Clone, Args)]
pub struct BrokerConfig {
    /// Kafka broker list.
    #[arg(
        long,
        env = "KAFKA_BOOTSTRAP_SERVERS",
        default_value = "localhost:9092"
    )]
    pub bootstrap_servers: String,

    /// Confluent-compatible Schema Registry; when unset, JSON on the wire.
    #[arg(long, env = "SCHEMA_REGISTRY_URL")]
    pub schema_registry_url: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct KafkaConfig {
    #[command(flatten)]
    pub broker: BrokerConfig,

    /// Topic of WorkflowRunRequest messages.
    #[arg(
        long,
        env = "FLOTILLA_REQUEST_TOPIC",
        default_value = "workflow-run-requests"
    )]
    pub request_topic: String,

    /// Topic of WorkflowRunEvent messages.
    #[arg(
        long,
        env = "FLOTILLA_EVENT_TOPIC",
        default_value = "workflow-run-events"
    )]
    pub event_topic: String,

    /// Consumer group of the request consumer.
    #[arg(
        long,
        env = "FLOTILLA_CONSUMER_GROUP",
        default_value = "flotilla-worker"
    )]
    pub consumer_group: String,

    /// Consume `workflow-run-requests` in this process.
    #[arg(long, env = "FLOTILLA_CONSUME_REQUESTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub consume_requests: bool,

    /// Most requests persisted in one database transaction.
    #[arg(long, env = "FLOTILLA_REQUEST_BATCH_SIZE", default_value_t = 500)]
    pub request_batch_size: usize,

    /// How long a batch waits to fill once its first request arrived.
    #[arg(long, env = "FLOTILLA_REQUEST_BATCH_WAIT", default_value = "100ms", value_parser = humantime::parse_duration)]
    pub request_batch_wait: Duration,

    /// Requests larger than this many bytes are dead-lettered.
    #[arg(long, env = "FLOTILLA_MAX_REQUEST_BYTES", default_value_t = 1024 * 1024)]
    pub max_request_bytes: usize,

    /// Partitions of the request and dead-letter topics when the worker creates them.
    #[arg(long, env = "FLOTILLA_TOPIC_PARTITIONS", default_value_t = 3)]
    pub topic_partitions: i32,

    /// How long to wait for the broker at start-up.
    #[arg(long, env = "FLOTILLA_KAFKA_CONNECT_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,
}

/// The run engine's settings.
#[derive(Debug, Clone, Args)]
pub struct EngineConfig {
    /// YAML (or JSON) file of targets: `targets: {<name>: {kind: http, base_url, timeout_ms, max_concurrent}}`.
    #[arg(long, env = "FLOTILLA_TARGETS_FILE")]
    pub targets_file: Option<std::path::PathBuf>,

    /// Directory of workflow definitions (`.json`, `.yaml`) registered at start-up.
    #[arg(long, env = "FLOTILLA_WORKFLOWS_DIR")]
    pub workflows_dir: Option<std::path::PathBuf>,

    /// Claim loops in this process (jobs run at once).
    #[arg(long, env = "FLOTILLA_WORKER_COUNT", default_value_t = 4)]
    pub worker_count: usize,

    /// Lease a claim holds without renewal; renewed every third of it.
    #[arg(long, env = "FLOTILLA_LEASE", default_value = "5m", value_parser = humantime::parse_duration)]
    pub lease: Duration,

    /// Base of the retry backoff `base × 2^(attempt−1)`.
    #[arg(long, env = "FLOTILLA_BACKOFF_BASE", default_value = "5s", value_parser = humantime::parse_duration)]
    pub backoff_base: Duration,

    /// How often the sweeper requeues jobs whose lease expired.
    #[arg(long, env = "FLOTILLA_SWEEP_INTERVAL", default_value = "5s", value_parser = humantime::parse_duration)]
    pub sweep_interval: Duration,

    /// Longest an idle claim loop waits before polling the queue again.
    #[arg(long, env = "FLOTILLA_IDLE_POLL_MAX", default_value = "500ms", value_parser = humantime::parse_duration)]
    pub idle_poll_max: Duration,
}

/// The HTTP API's settings.
#[derive(Debug, Clone, Args)]
pub struct HttpConfig {
    /// API, health and metrics listener.
    #[arg(long, env = "FLOTILLA_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    pub http_addr: std::net::SocketAddr,

    /// Comma-separated bearer tokens accepted on `/v1/*`.
    #[arg(
        long,
        env = "FLOTILLA_API_TOKENS",
        hide_env_values = true,
        default_value = ""
    )]
    pub api_tokens: String,

    /// Serve `/v1/*` without auth when no tokens are configured (never in production).
    #[arg(long, env = "FLOTILLA_INSECURE_NO_AUTH", default_value_t = false)]
    pub insecure_no_auth: bool,

    /// Largest request body accepted, in bytes (413 above).
    #[arg(long, env = "FLOTILLA_MAX_BODY_BYTES", default_value_t = 1024 * 1024)]
    pub max_body_bytes: usize,
}
