//! Settings of the relay binary: every one a flag and an environment
//! variable, each default read from one constant.

use std::time::Duration;

use clap::builder::{RangedI64ValueParser, RangedU64ValueParser};
use clap::{Args, Parser, Subcommand};
use flotilla_contracts::topics;
use flotilla_runtime::BrokerConfig;
use flotilla_runtime::kafka::TopicLayout;
use flotilla_runtime::settings::{DAY, HOUR, MILLISECOND, SECOND, YEAR, duration_between};
use flotilla_runtime::telemetry::TelemetryConfig;
use flotilla_store::DatabaseConfig;

/// Where `/healthz`, `/readyz` and `/metrics` listen, unless configured.
pub const DEFAULT_HTTP_ADDR: &str = "0.0.0.0:8082";
/// Most rows one read of pending rows takes, unless configured.
pub const DEFAULT_BATCH_SIZE: i64 = 500;
/// Longest an idle relay waits before looking again, unless configured.
pub const DEFAULT_IDLE_POLL_MAX: Duration = Duration::from_millis(100);
/// How long a bucket lease lasts without renewal, unless configured. Its
/// third is the producer's send window ([`RelaySettings::send_window`]),
/// which must outlast a broker failover: on a KRaft cluster a SIGKILLed
/// broker stalls every `acks=all` write for about 11.5 s (the controller
/// fences it after `broker.session.timeout.ms`, 9 s, then the in-sync
/// replica sets shrink), and a broker frozen past that session held
/// acknowledgements for up to 14.9 s in `worker/tests/chaos/brokers.rs`
/// (a frozen leader answers nothing until the producer's request times
/// out), so 60 s gives a 20 s window. A shorter window fails records the
/// broker will still write, and their resends are new records: repeats on
/// the topic.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
/// Largest record the producer sends, unless configured.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = topics::DEFAULT_MAX_MESSAGE_BYTES;
/// How long published rows are kept after they were written, unless configured.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Rows one retention statement deletes, shared among the 64 buckets.
pub const DEFAULT_RETENTION_BATCH: i64 = 1000;
/// How often retention runs.
pub const DEFAULT_RETENTION_INTERVAL: Duration = Duration::from_secs(60);
/// How long in-flight deliveries may take after SIGTERM, unless configured.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

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
    /// Send FAILED outbox rows (all, or one job's) again and exit.
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
    #[arg(long, env = "FLOTILLA_EVENT_TOPIC", default_value = topics::EVENT_TOPIC)]
    pub event_topic: String,
    /// How the event topic is created when missing.
    #[command(flatten)]
    pub topics: TopicLayout,
    /// Health, readiness and metrics listener.
    #[arg(long, env = "FLOTILLA_RELAY_HTTP_ADDR", default_value = DEFAULT_HTTP_ADDR)]
    pub http_addr: std::net::SocketAddr,
    /// This relay's name in the bucket leases; defaults to host name and process id.
    #[arg(long, env = "FLOTILLA_RELAY_ID")]
    pub relay_id: Option<String>,
    /// Most rows one read of pending rows takes (four times this many may be in flight).
    #[arg(long, env = "FLOTILLA_RELAY_BATCH_SIZE", default_value_t = DEFAULT_BATCH_SIZE, value_parser = RangedI64ValueParser::<i64>::new().range(1..=100_000))]
    pub batch_size: i64,
    /// Longest an idle relay waits before looking again.
    #[arg(long, env = "FLOTILLA_RELAY_IDLE_POLL_MAX", default_value_t = DEFAULT_IDLE_POLL_MAX.into(), value_parser = duration_between(MILLISECOND, HOUR))]
    pub idle_poll_max: humantime::Duration,
    /// Listen for the workers' wake-ups (`LISTEN flotilla_outbox`, one
    /// connection of its own), so an idle relay publishes a commit's events
    /// at once; off behind a pooler in transaction mode.
    #[arg(long, env = "FLOTILLA_RELAY_LISTEN_FOR_EVENTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub listen_for_events: bool,
    /// How long a bucket lease lasts without renewal.
    #[arg(long, env = "FLOTILLA_RELAY_LEASE", default_value_t = DEFAULT_LEASE.into(), value_parser = duration_between(SECOND, HOUR))]
    pub lease: humantime::Duration,
    /// How long the producer tries to deliver one record: a third of the
    /// lease unless set, and never more (see `RelaySettings::send_window`).
    #[arg(long, env = "FLOTILLA_RELAY_DELIVERY_TIMEOUT", value_parser = duration_between(SECOND, DAY))]
    pub delivery_timeout: Option<humantime::Duration>,
    /// Largest record the producer sends; bigger rows fail (and land FAILED).
    #[arg(long, env = "FLOTILLA_RELAY_MAX_MESSAGE_BYTES", default_value_t = DEFAULT_MAX_MESSAGE_BYTES, value_parser = RangedU64ValueParser::<usize>::new().range(1..=1_000_000_000))]
    pub max_message_bytes: usize,
    /// How long published rows are kept after they were written.
    #[arg(long, env = "FLOTILLA_OUTBOX_RETENTION", default_value_t = DEFAULT_RETENTION.into(), value_parser = duration_between(SECOND, YEAR * 10))]
    pub retention: humantime::Duration,
    /// How long in-flight deliveries may take after SIGTERM.
    #[arg(long, env = "FLOTILLA_SHUTDOWN_GRACE", default_value_t = DEFAULT_SHUTDOWN_GRACE.into(), value_parser = duration_between(Duration::ZERO, HOUR))]
    pub shutdown_grace: humantime::Duration,
    /// An idempotent producer: the broker drops a record the producer sent
    /// again after a lost acknowledgement (a leader's failover), so a
    /// failover writes no repeats. Off only for a broker that does not
    /// check producer sequence numbers (some Kafka-compatible servers,
    /// librdkafka's mock cluster), where it would lose records.
    #[arg(long, env = "FLOTILLA_RELAY_IDEMPOTENCE", default_value_t = true, action = clap::ArgAction::Set)]
    pub idempotence: bool,
    /// Accept a changed partition count of the event topic (and record it,
    /// so events are placed by it): without it added partitions get no
    /// events, and a relay that finds fewer than recorded publishes nothing,
    /// since a job in flight could have its events split across partitions.
    #[arg(long, env = "FLOTILLA_ACCEPT_PARTITION_CHANGE", default_value_t = false, action = clap::ArgAction::Set)]
    pub accept_partition_change: bool,
}

/// The relay's settings as the library takes them.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    pub broker: BrokerConfig,
    pub event_topic: String,
    pub relay_id: String,
    pub batch_size: i64,
    pub idle_poll_max: Duration,
    /// First wait of an idle relay, doubling up to `idle_poll_max`.
    pub idle_poll_min: Duration,
    /// Whether to listen for the workers' wake-ups (`flotilla_store::wake`).
    pub listen_for_events: bool,
    pub lease: Duration,
    /// The producer's delivery timeout; `None`: a third of the lease.
    pub delivery_timeout: Option<Duration>,
    pub max_message_bytes: usize,
    pub retention: Duration,
    pub retention_batch: i64,
    pub retention_interval: Duration,
    /// Whether a changed partition count of the event topic is accepted.
    pub accept_partition_change: bool,
    /// Whether the producer is idempotent (see [`RelayArgs::idempotence`]).
    pub idempotence: bool,
}

impl RelaySettings {
    #[must_use]
    pub fn new(broker: BrokerConfig, event_topic: &str, relay_id: &str) -> Self {
        Self {
            broker,
            event_topic: event_topic.to_owned(),
            relay_id: relay_id.to_owned(),
            batch_size: DEFAULT_BATCH_SIZE,
            idle_poll_max: DEFAULT_IDLE_POLL_MAX,
            idle_poll_min: crate::DEFAULT_IDLE_POLL_MIN,
            listen_for_events: true,
            lease: DEFAULT_LEASE,
            delivery_timeout: None,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            retention: DEFAULT_RETENTION,
            retention_batch: DEFAULT_RETENTION_BATCH,
            retention_interval: DEFAULT_RETENTION_INTERVAL,
            accept_partition_change: false,
            idempotence: true,
        }
    }

    /// How long the producer may hold one record before it fails it: a
    /// third of the bucket lease, or the delivery timeout when one is set
    /// and shorter (so a longer lease lengthens the window too). A
    /// row is handed to the producer only while its bucket is surely held
    /// that much longer ([`crate::buckets::HeldBuckets::holds_for`]), so a
    /// relay that stalls or is cut off with records inside its producer
    /// cannot deliver them after its buckets may have passed to another
    /// relay (after that relay's later events): the producer fails them
    /// first. Renewals come every third of the lease, so while the relay
    /// runs two thirds of it are left, less the time a renewal takes: a
    /// third of the lease is the margin for slow renewals.
    #[must_use]
    pub fn send_window(&self) -> Duration {
        let third = self.lease / 3;
        self.delivery_timeout
            .map_or(third, |timeout| timeout.min(third))
    }
}

impl From<RelayArgs> for RelaySettings {
    fn from(args: RelayArgs) -> Self {
        let relay_id = args
            .relay_id
            .filter(|id| !id.trim().is_empty())
            .unwrap_or_else(|| {
                let host = flotilla_runtime::identity::host_name();
                let host = if host.is_empty() {
                    "relay".into()
                } else {
                    host
                };
                format!("{host}-{}", std::process::id())
            });
        let mut settings = Self::new(args.broker, &args.event_topic, &relay_id);
        settings.batch_size = args.batch_size.max(1);
        settings.idle_poll_max = *args.idle_poll_max;
        settings.listen_for_events = args.listen_for_events;
        settings.lease = *args.lease;
        settings.delivery_timeout = args.delivery_timeout.map(Into::into);
        settings.max_message_bytes = args.max_message_bytes;
        settings.retention = *args.retention;
        settings.accept_partition_change = args.accept_partition_change;
        settings.idempotence = args.idempotence;
        settings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The send window is a third of the lease unless a shorter delivery
    /// timeout is set: a longer lease lengthens it, and it never outgrows
    /// the third that keeps a stalled relay's records from landing after
    /// its heir's.
    #[test]
    fn the_send_window_follows_the_lease() {
        let mut settings = RelaySettings::new(BrokerConfig::new("x:9092"), "events", "r");
        settings.lease = Duration::from_secs(60);
        assert_eq!(settings.send_window(), Duration::from_secs(20));
        settings.delivery_timeout = Some(Duration::from_secs(5));
        assert_eq!(settings.send_window(), Duration::from_secs(5));
        settings.lease = Duration::from_secs(3);
        assert_eq!(settings.send_window(), Duration::from_secs(1));
    }

    /// The wake-up switch takes `true` or `false`, is on when unset, and
    /// a word that is neither is refused naming the flag, never read as
    /// one of them.
    #[test]
    fn listening_for_events_is_a_strict_switch_on_by_default() {
        let parse = |args: &[&str]| {
            let base = ["flotilla-relay", "--database-url", "postgres://unused"];
            Cli::try_parse_from(base.iter().chain(args)).map(|cli| cli.relay.listen_for_events)
        };
        assert!(parse(&[]).unwrap());
        assert!(!parse(&["--listen-for-events", "false"]).unwrap());
        assert!(parse(&["--listen-for-events", "true"]).unwrap());
        let refused = parse(&["--listen-for-events", "maybe"])
            .unwrap_err()
            .to_string();
        assert!(refused.contains("--listen-for-events"), "{refused}");
    }
}
