//! Settings of the worker binary: every one a flag and an environment
//! variable, each default read from the constant its owner declares.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{RangedI64ValueParser, RangedU64ValueParser};
use clap::{Args, Parser, Subcommand};
use flotilla_contracts::topics;
use flotilla_runtime::BrokerConfig;
use flotilla_runtime::kafka::{GroupProtocol, TopicLayout};
use flotilla_runtime::settings::{DAY, HOUR, MILLISECOND, SECOND, duration_between};
use flotilla_runtime::telemetry::TelemetryConfig;
use flotilla_store::DatabaseConfig;
use secrecy::SecretString;

use crate::engine::Switch;
use crate::{api, engine, ingest};

/// How long in-flight work may take to finish after SIGTERM, unless configured.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// Where the API listens, unless configured.
pub const DEFAULT_HTTP_ADDR: &str = "0.0.0.0:8080";
/// Where the API listens without auth, unless an address is given: this
/// machine only.
pub const DEFAULT_NO_AUTH_HTTP_ADDR: &str = "127.0.0.1:8080";
/// How long to wait for the broker at start-up, unless configured.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

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

// Parsed once, at start: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply the database migrations and exit.
    Migrate {
        #[command(flatten)]
        database: DatabaseConfig,
    },
    /// A consumer group's offsets, kept in Kafka and in the database.
    Offsets {
        #[command(subcommand)]
        action: OffsetsCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum OffsetsCommand {
    /// Move a group's offsets on a topic in Kafka and in the database
    /// together (to skip a backlog, or to replay), refused while the group
    /// has members. Kafka's own tool moves only Kafka's, which the next
    /// assignment undoes when the database's are behind.
    Set(SetOffsets),
}

/// `flotilla-worker offsets set`.
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["to_latest", "to_offset"])))]
pub struct SetOffsets {
    /// The consumer group (the workers' `FLOTILLA_CONSUMER_GROUP`, or its
    /// reply consumer's group).
    #[arg(long)]
    pub group: String,
    /// The topic whose offsets move.
    #[arg(long)]
    pub topic: String,
    /// Only this partition; unset: every partition of the topic.
    #[arg(long, value_parser = RangedI64ValueParser::<i32>::new().range(0..))]
    pub partition: Option<i32>,
    /// To the end of each partition: what is there now is skipped.
    #[arg(long)]
    pub to_latest: bool,
    /// To this offset (between the partition's first kept offset and its end).
    #[arg(long, value_parser = RangedI64ValueParser::<i64>::new().range(0..))]
    pub to_offset: Option<i64>,
    #[command(flatten)]
    pub database: DatabaseConfig,
    #[command(flatten)]
    pub broker: BrokerConfig,
}

#[derive(Debug, Clone, Args)]
pub struct WorkerConfig {
    #[command(flatten)]
    pub database: DatabaseConfig,
    #[command(flatten)]
    pub broker: BrokerConfig,
    #[command(flatten)]
    pub consumer: ConsumerConfig,
    #[command(flatten)]
    pub telemetry: TelemetryConfig,

    /// Lease owner written on claimed rows; defaults to the host name.
    #[arg(long, env = "FLOTILLA_WORKER_ID")]
    pub worker_id: Option<String>,

    #[command(flatten)]
    pub engine: EngineConfig,
    #[command(flatten)]
    pub http: HttpConfig,

    /// How long in-flight work may take to finish after SIGTERM; the worker
    /// exits by then whatever is still running.
    #[arg(long, env = "FLOTILLA_SHUTDOWN_GRACE", default_value_t = DEFAULT_SHUTDOWN_GRACE.into(), value_parser = duration_between(Duration::ZERO, HOUR))]
    pub shutdown_grace: humantime::Duration,
}

/// The request consumer's settings.
#[derive(Debug, Clone, Args)]
pub struct ConsumerConfig {
    /// Topic of WorkflowRunRequest messages.
    #[arg(long, env = "FLOTILLA_REQUEST_TOPIC", default_value = topics::REQUEST_TOPIC)]
    pub request_topic: String,

    /// Topic of WorkflowRunSignal messages, consumed beside the requests
    /// (same group, same batches); empty: none.
    #[arg(long, env = "FLOTILLA_SIGNAL_TOPIC", default_value = topics::SIGNAL_TOPIC)]
    pub signal_topic: String,

    /// Consumer group of the request consumer.
    #[arg(long, env = "FLOTILLA_CONSUMER_GROUP", default_value = topics::CONSUMER_GROUP)]
    pub consumer_group: String,

    /// Consumer group of the reply consumer, which reads the Kafka targets'
    /// reply topics apart from the requests; unset: `<consumer group>-replies`.
    #[arg(long, env = "FLOTILLA_REPLY_CONSUMER_GROUP")]
    pub reply_consumer_group: Option<String>,

    /// Static group membership keyed on the worker id (`group.instance.id`):
    /// a worker restarted with its id gets its partitions back at once. Two
    /// live workers must never share an id then. Unset: on under the
    /// classic group protocol, off under the consumer protocol (where it is
    /// refused: see `ConsumerConfig::membership`).
    #[arg(long, env = "FLOTILLA_STATIC_MEMBERSHIP", action = clap::ArgAction::Set)]
    pub static_membership: Option<bool>,

    /// The consumer group protocol: `classic` (client-side cooperative
    /// assignment; every Kafka) or `consumer` (KIP-848: the broker assigns
    /// partitions and owns the session timeout; Kafka 4.0 and later).
    #[arg(long, env = "FLOTILLA_GROUP_PROTOCOL", value_enum, default_value_t = GroupProtocol::Classic)]
    pub group_protocol: GroupProtocol,

    /// Consume the request topic in this process.
    #[arg(long, env = "FLOTILLA_CONSUME_REQUESTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub consume_requests: bool,

    /// Most requests persisted in one database transaction.
    #[arg(long, env = "FLOTILLA_REQUEST_BATCH_SIZE", default_value_t = ingest::DEFAULT_BATCH_SIZE, value_parser = RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    pub request_batch_size: usize,

    /// A batch closes once its requests hold this many bytes (memory bound).
    #[arg(long, env = "FLOTILLA_REQUEST_BATCH_BYTES", default_value_t = ingest::DEFAULT_BATCH_BYTES, value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    pub request_batch_bytes: usize,

    /// How long a batch waits to fill once its first request arrived (0:
    /// it takes what has arrived).
    #[arg(long, env = "FLOTILLA_REQUEST_BATCH_WAIT", default_value_t = ingest::DEFAULT_BATCH_WAIT.into(), value_parser = duration_between(Duration::ZERO, Duration::from_secs(60)))]
    pub request_batch_wait: humantime::Duration,

    /// Requests larger than this many bytes are dead-lettered.
    #[arg(long, env = "FLOTILLA_MAX_REQUEST_BYTES", default_value_t = ingest::DEFAULT_MAX_REQUEST_BYTES, value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_request_bytes: usize,

    /// How the request and dead-letter topics are created when missing.
    #[command(flatten)]
    pub topics: TopicLayout,

    /// How long to wait for the broker at start-up.
    #[arg(long, env = "FLOTILLA_KAFKA_CONNECT_TIMEOUT", default_value_t = DEFAULT_CONNECT_TIMEOUT.into(), value_parser = duration_between(MILLISECOND, HOUR))]
    pub connect_timeout: humantime::Duration,

    /// How long the request consumer may stay paused by an outage (the
    /// database, the registry, the dead-letter topic) before `/readyz`
    /// fails, naming it.
    #[arg(long, env = "FLOTILLA_CONSUMER_PAUSED_UNREADY_AFTER", default_value_t = ingest::DEFAULT_PAUSED_UNREADY_AFTER.into(), value_parser = duration_between(SECOND, DAY))]
    pub paused_unready_after: humantime::Duration,
}

/// The run engine's settings.
#[derive(Debug, Clone, Args)]
pub struct EngineConfig {
    /// YAML (or JSON) file of targets: `targets: {<name>: {kind: http, base_url, timeout_ms, max_concurrent}}`.
    #[arg(long, env = "FLOTILLA_TARGETS_FILE")]
    pub targets_file: Option<PathBuf>,

    /// Directory of workflow definitions (`.json`, `.yaml`) registered at start-up.
    #[arg(long, env = "FLOTILLA_WORKFLOWS_DIR")]
    pub workflows_dir: Option<PathBuf>,

    /// Claim loops in this process (jobs run at once); 0 runs none (a member
    /// that only serves the API and consumes requests).
    #[arg(long, env = "FLOTILLA_WORKER_COUNT", default_value_t = engine::DEFAULT_CLAIM_LOOPS, value_parser = RangedU64ValueParser::<usize>::new().range(0..=1024))]
    pub worker_count: usize,

    /// Database connections reserved for lease renewals and fenced writes,
    /// beside `FLOTILLA_DB_MAX_CONNECTIONS`: heartbeats never wait behind
    /// the API, the console or a claim.
    #[arg(long, env = "FLOTILLA_DB_RESERVED_CONNECTIONS", default_value_t = engine::DEFAULT_RESERVED_CONNECTIONS, value_parser = RangedU64ValueParser::<u32>::new().range(2..=1000))]
    pub db_reserved_connections: u32,

    /// Lease a claim holds without renewal; renewed every quarter of it. A
    /// killed worker's jobs are resumed after about this plus a sweep interval.
    #[arg(long, env = "FLOTILLA_LEASE", default_value_t = engine::DEFAULT_LEASE.into(), value_parser = duration_between(SECOND, DAY))]
    pub lease: humantime::Duration,

    /// Lapsed leases in a row after which a job goes DEAD (a lapse spends no attempt).
    #[arg(long, env = "FLOTILLA_MAX_LEASE_LOSSES", default_value_t = engine::DEFAULT_MAX_LEASE_LOSSES, value_parser = RangedI64ValueParser::<i32>::new().range(1..=1000))]
    pub max_lease_losses: i32,

    /// How long a job this worker hands back (it lacks one of the job's
    /// targets) may wait for a worker that has them before it fails.
    #[arg(long, env = "FLOTILLA_MISSING_TARGET_WAIT", default_value_t = engine::DEFAULT_MISSING_TARGET_WAIT.into(), value_parser = duration_between(SECOND, DAY))]
    pub missing_target_wait: humantime::Duration,

    /// Base of the retry backoff `base × 2^(attempt−1)`, capped at
    /// `--backoff-max` and jittered within its upper half.
    #[arg(long, env = "FLOTILLA_BACKOFF_BASE", default_value_t = engine::DEFAULT_BACKOFF_BASE.into(), value_parser = duration_between(MILLISECOND, DAY))]
    pub backoff_base: humantime::Duration,

    /// The longest pause between a job's attempts.
    #[arg(long, env = "FLOTILLA_BACKOFF_MAX", default_value_t = engine::DEFAULT_BACKOFF_MAX.into(), value_parser = duration_between(MILLISECOND, DAY))]
    pub backoff_max: humantime::Duration,

    /// How often the sweeper requeues jobs whose lease expired.
    #[arg(long, env = "FLOTILLA_SWEEP_INTERVAL", default_value_t = engine::DEFAULT_SWEEP_INTERVAL.into(), value_parser = duration_between(MILLISECOND, HOUR))]
    pub sweep_interval: humantime::Duration,

    /// Largest event the relay publishes (its `--max-message-bytes`): a
    /// result whose COMPLETED event would be larger fails the job instead.
    #[arg(long, env = "FLOTILLA_MAX_EVENT_BYTES", default_value_t = topics::DEFAULT_MAX_MESSAGE_BYTES, value_parser = RangedU64ValueParser::<usize>::new().range(4096..=1_000_000_000))]
    pub max_event_bytes: usize,

    /// The most bytes one job's stored answers (its checkpoints) may take:
    /// the answer that would cross it ends the job with a verdict. Every
    /// claim reads them all, and Postgres builds no value past 256 MB.
    #[arg(long, env = "FLOTILLA_MAX_STORED_BYTES", default_value_t = crate::engine::DEFAULT_MAX_STORED_BYTES, value_parser = clap::value_parser!(u64).range(1_048_576..=200 * 1_048_576))]
    pub max_stored_bytes: u64,

    /// The most jobs one family (a job nobody started and every job started
    /// under it, at any depth) may hold, the root included: a `start` step
    /// past it fails its job with a verdict.
    #[arg(long, env = "FLOTILLA_MAX_FAMILY_JOBS", default_value_t = crate::engine::DEFAULT_MAX_FAMILY_JOBS, value_parser = clap::value_parser!(i32).range(2..=1_000_000))]
    pub max_family_jobs: i32,

    /// Longest an idle claim loop waits before polling the queue again.
    #[arg(long, env = "FLOTILLA_IDLE_POLL_MAX", default_value_t = engine::DEFAULT_IDLE_POLL_MAX.into(), value_parser = duration_between(MILLISECOND, HOUR))]
    pub idle_poll_max: humantime::Duration,

    /// Listen for other processes' wake-ups (one connection of its own,
    /// `LISTEN`): an idle claim loop starts on work submitted elsewhere at
    /// once instead of at its next poll. Off behind a pooler in
    /// transaction mode, which does not pass notifications on.
    #[arg(long, env = "FLOTILLA_LISTEN_FOR_WORK", default_value_t = true, action = clap::ArgAction::Set)]
    pub listen_for_work: bool,

    /// Eager start: a job submitted to this worker (API or request topic)
    /// while one of its claim loops waits is written already claimed by
    /// it and run at once, one transaction and no wake-up before its first
    /// step. Never more than the loops waiting; jobs of a concurrency key or
    /// a debounce window, or calling a target this worker lacks, are queued
    /// as before.
    #[arg(long, env = "FLOTILLA_EAGER_START", default_value_t = true, action = clap::ArgAction::Set)]
    pub eager_start: bool,

    /// Iterations (of `map`, `filter`, `all`, `exists`) one CEL evaluation
    /// may run; past it the job fails with its verdict.
    #[arg(long, env = "FLOTILLA_EXPRESSION_MAX_STEPS", default_value_t = crate::workflow::DEFAULT_BUDGET.steps, value_parser = RangedU64ValueParser::<u64>::new().range(1..))]
    pub expression_max_steps: u64,

    /// Bytes one CEL evaluation may build with `+` (strings, lists, maps).
    #[arg(long, env = "FLOTILLA_EXPRESSION_MAX_BYTES", default_value_t = crate::workflow::DEFAULT_BUDGET.bytes, value_parser = RangedU64ValueParser::<u64>::new().range(1..))]
    pub expression_max_bytes: u64,

    /// How long one CEL evaluation may run.
    #[arg(long, env = "FLOTILLA_EXPRESSION_TIMEOUT", default_value_t = crate::workflow::DEFAULT_BUDGET.time.into(), value_parser = duration_between(MILLISECOND, Duration::from_secs(60)))]
    pub expression_timeout: humantime::Duration,

    /// A job of a stored workflow points at its version instead of copying
    /// the definition into its row. `auto`: once no worker of an earlier
    /// release (which reads only the copy) is alive, for the whole database;
    /// `true`: refuse to start while one is; `false`: keep copying.
    #[arg(long, env = "FLOTILLA_DEFINITION_BY_REFERENCE", value_enum, default_value_t = Switch::Auto)]
    pub definition_by_reference: Switch,
    /// Start each run's checkpoints as rows of their own, so a step's write
    /// never rewrites the responses before it, instead of appending to the
    /// run row's array. `auto`: once no worker of an earlier release (which
    /// reads only the array) is alive, for the whole database; `true`:
    /// refuse to start while one is; `false`: keep the array.
    #[arg(long, env = "FLOTILLA_CHECKPOINT_ROWS", value_enum, default_value_t = Switch::Auto)]
    pub checkpoint_rows: Switch,

    /// How long finished runs are kept.
    #[command(flatten)]
    pub retention: RetentionConfig,
}

/// Retention of finished runs (docs/operations.md, "Retention").
#[derive(Debug, Clone, Args)]
pub struct RetentionConfig {
    /// Remove finished runs past their retention (one member of the fleet
    /// at a time, in small batches); `false`: keep every run.
    #[arg(long, env = "FLOTILLA_RETENTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub retention: bool,

    /// How long a COMPLETED run is kept after it finished.
    #[arg(long, env = "FLOTILLA_RETAIN_COMPLETED", default_value_t = engine::services::retention::DEFAULT_KEEP_COMPLETED.into(), value_parser = retention_between())]
    pub retain_completed: humantime::Duration,

    /// How long a FAILED or DEAD run is kept after it finished.
    #[arg(long, env = "FLOTILLA_RETAIN_FAILED", default_value_t = engine::services::retention::DEFAULT_KEEP_FAILED.into(), value_parser = retention_between())]
    pub retain_failed: humantime::Duration,

    /// How long a CANCELLED run is kept after it finished.
    #[arg(long, env = "FLOTILLA_RETAIN_CANCELLED", default_value_t = engine::services::retention::DEFAULT_KEEP_FAILED.into(), value_parser = retention_between())]
    pub retain_cancelled: humantime::Duration,

    /// Per workflow and final state, before the fleet's:
    /// `<workflow>:<STATE>=<duration>[,…][;<workflow>:…]`, e.g.
    /// `payments:COMPLETED=90d,FAILED=1y;reports:COMPLETED=1d`.
    #[arg(long, env = "FLOTILLA_RETAIN_BY_WORKFLOW", default_value = "", value_parser = parse_by_workflow)]
    pub retain_by_workflow: ByWorkflow,

    /// How long a removed run's job id is still answered as a repeat
    /// (its id and request digest are kept that long).
    #[arg(long, env = "FLOTILLA_REMOVED_ID_HORIZON", default_value_t = engine::services::retention::DEFAULT_REMOVED_HORIZON.into(), value_parser = retention_between())]
    pub removed_id_horizon: humantime::Duration,

    /// Runs one retention batch removes.
    #[arg(long, env = "FLOTILLA_RETENTION_BATCH", default_value_t = engine::services::retention::DEFAULT_BATCH, value_parser = clap::value_parser!(i64).range(1..=10_000))]
    pub retention_batch: i64,

    /// How often retention runs.
    #[arg(long, env = "FLOTILLA_RETENTION_INTERVAL", default_value_t = engine::services::retention::DEFAULT_INTERVAL.into(), value_parser = duration_between(SECOND, DAY))]
    pub retention_interval: humantime::Duration,
}

/// Per-workflow retention, as parsed (clap wants a `Clone` value type).
#[derive(Debug, Clone, Default)]
pub struct ByWorkflow(pub Vec<engine::services::retention::WorkflowRetention>);

/// A retention or horizon within the bounds every retention keeps to.
fn retention_between()
-> impl Fn(&str) -> Result<humantime::Duration, String> + Clone + Send + Sync + 'static {
    let (shortest, longest) = engine::services::retention::KEEP_BOUNDS;
    duration_between(shortest, longest)
}

fn parse_by_workflow(text: &str) -> Result<ByWorkflow, String> {
    engine::services::retention::parse_by_workflow(text).map(ByWorkflow)
}

/// The HTTP API's settings.
#[derive(Debug, Clone, Args)]
pub struct HttpConfig {
    /// API, health and metrics listener [default: 0.0.0.0:8080; with
    /// --insecure-no-auth, 127.0.0.1:8080].
    #[arg(long, env = "FLOTILLA_HTTP_ADDR")]
    pub http_addr: Option<SocketAddr>,

    /// A second listener for `/healthz`, `/readyz` and `/metrics` only, so
    /// probes keep their seat when clients fill the API's connections
    /// (unset: those routes on the API's listener only).
    #[arg(long, env = "FLOTILLA_HEALTH_ADDR")]
    pub health_addr: Option<SocketAddr>,

    /// Comma-separated bearer tokens accepted on `/v1/*`, each with its
    /// scopes after its last `:` (`ci:read+submit`; scopes read, submit,
    /// answer, operate, define; none listed: all). Secrets: never printed.
    #[arg(long, env = "FLOTILLA_API_TOKENS", hide_env_values = true, value_parser = flotilla_store::pool::parse_secret)]
    pub api_tokens: Option<SecretString>,

    /// Serve `/v1/*` without auth when no tokens are configured (never in
    /// production); binds 127.0.0.1 unless FLOTILLA_HTTP_ADDR is given.
    #[arg(long, env = "FLOTILLA_INSECURE_NO_AUTH", default_value_t = false)]
    pub insecure_no_auth: bool,

    /// Accept submissions with inline definitions (from tokens with the
    /// `define` scope); `false` allows stored workflows only.
    #[arg(long, env = "FLOTILLA_INLINE_DEFINITIONS", default_value_t = true, action = clap::ArgAction::Set)]
    pub inline_definitions: bool,

    /// Host names `/v1` answers to besides IP addresses and `localhost`
    /// (comma-separated); checked when set, and always without auth.
    #[arg(long, env = "FLOTILLA_HTTP_ALLOWED_HOSTS", value_delimiter = ',')]
    pub http_allowed_hosts: Vec<String>,

    /// How long a client may take to send a request's headers.
    #[arg(long, env = "FLOTILLA_HTTP_HEADER_READ_TIMEOUT", default_value_t = api::server::DEFAULT_HEADER_READ_TIMEOUT.into(), value_parser = duration_between(MILLISECOND, HOUR))]
    pub http_header_read_timeout: humantime::Duration,

    /// How long one request may take, its body included (503 after).
    #[arg(long, env = "FLOTILLA_HTTP_REQUEST_TIMEOUT", default_value_t = api::server::DEFAULT_REQUEST_TIMEOUT.into(), value_parser = duration_between(MILLISECOND, HOUR))]
    pub http_request_timeout: humantime::Duration,

    /// Connections the API holds open at once; past it, it stops accepting.
    #[arg(long, env = "FLOTILLA_HTTP_MAX_CONNECTIONS", default_value_t = api::server::DEFAULT_MAX_CONNECTIONS, value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    pub http_max_connections: usize,

    /// Largest request body accepted, in bytes (413 above).
    #[arg(long, env = "FLOTILLA_MAX_BODY_BYTES", default_value_t = api::DEFAULT_BODY_LIMIT, value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_body_bytes: usize,
}

impl HttpConfig {
    /// Where the API listens: the address given, or the default (this
    /// machine only when serving without auth).
    ///
    /// # Panics
    /// Never: the defaults are valid addresses.
    #[must_use]
    pub fn listen_addr(&self) -> SocketAddr {
        self.http_addr.unwrap_or_else(|| {
            let default = if self.insecure_no_auth {
                DEFAULT_NO_AUTH_HTTP_ADDR
            } else {
                DEFAULT_HTTP_ADDR
            };
            default.parse().expect("the default addresses are valid")
        })
    }
}

impl ConsumerConfig {
    /// Whether the workers join as static members: what
    /// `FLOTILLA_STATIC_MEMBERSHIP` says, or the protocol's default.
    ///
    /// # Errors
    /// Static membership asked for under the consumer group protocol: a
    /// member restarted after a crash is refused (UNRELEASED_INSTANCE_ID,
    /// fatal to librdkafka's consumer) until its earlier self's session
    /// expires, so a crashed worker would come back with a dead consumer.
    pub fn membership(&self) -> Result<bool, String> {
        match (self.group_protocol, self.static_membership) {
            (GroupProtocol::Consumer, Some(true)) => Err(
                "FLOTILLA_STATIC_MEMBERSHIP=true is refused under FLOTILLA_GROUP_PROTOCOL=consumer: \
                 Kafka refuses a static member restarted after a crash until its earlier self's \
                 session expires (UNRELEASED_INSTANCE_ID), which is fatal to the consumer; \
                 use dynamic membership (FLOTILLA_STATIC_MEMBERSHIP=false) or the classic protocol"
                    .to_owned(),
            ),
            (protocol, asked) => Ok(asked.unwrap_or(protocol == GroupProtocol::Classic)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wake-up and eager-start switches take `true` or `false`, are on
    /// when unset, and a word that is neither is refused naming the flag.
    #[test]
    fn listening_for_work_and_eager_start_are_strict_switches_on_by_default() {
        type Read = fn(&Cli) -> bool;
        let switches: [(&str, Read); 2] = [
            ("--listen-for-work", |cli| cli.worker.engine.listen_for_work),
            ("--eager-start", |cli| cli.worker.engine.eager_start),
        ];
        for (flag, read) in switches {
            let parse = |args: &[&str]| {
                let base = ["flotilla-worker", "--database-url", "postgres://unused"];
                Cli::try_parse_from(base.iter().chain(args)).map(|cli| read(&cli))
            };
            assert!(parse(&[]).unwrap(), "{flag}");
            assert!(!parse(&[flag, "false"]).unwrap(), "{flag}");
            assert!(parse(&[flag, "true"]).unwrap(), "{flag}");
            let refused = parse(&[flag, "maybe"]).unwrap_err().to_string();
            assert!(refused.contains(flag), "{refused}");
        }
    }

    /// Static membership follows the group protocol unless told: on under
    /// the classic one, off under the consumer one, where asking for it is
    /// refused naming both settings.
    #[test]
    fn static_membership_defaults_by_protocol_and_is_refused_under_the_consumer_one() {
        let membership = |args: &[&str]| {
            let base = ["flotilla-worker", "--database-url", "postgres://unused"];
            Cli::try_parse_from(base.iter().chain(args))
                .unwrap()
                .worker
                .consumer
                .membership()
        };
        assert_eq!(membership(&[]), Ok(true));
        assert_eq!(membership(&["--static-membership", "false"]), Ok(false));
        assert_eq!(membership(&["--group-protocol", "consumer"]), Ok(false));
        let consumer_static = [
            "--group-protocol",
            "consumer",
            "--static-membership",
            "true",
        ];
        let refused = membership(&consumer_static).unwrap_err();
        assert!(
            refused.contains("FLOTILLA_STATIC_MEMBERSHIP=true")
                && refused.contains("FLOTILLA_GROUP_PROTOCOL=consumer"),
            "{refused}"
        );
    }
}
