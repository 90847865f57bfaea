//! The event topic's partition count, watched. A job's events stay in
//! order because its key always maps to one partition: the relay chooses
//! it over the count the relays recorded (`event_topic`; the `placement`
//! module), not over the count the broker lists, so partitions added to the
//! topic change nothing until an operator accepts them
//! (`--accept-partition-change`, which records the new count: a job in
//! flight could then have its later events in another partition, read
//! before its earlier ones, so docs/operations.md says how to accept it
//! without losing any job's order). Until then the new partitions get no
//! events. A topic with fewer partitions than recorded (deleted and made
//! again) cannot take the recorded mapping: the relay stops publishing,
//! and says so in readiness, until the change is accepted.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::placement::RecordedCount;
use flotilla_runtime::BrokerConfig;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use sqlx::PgPool;

/// How long a metadata request may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(5);

/// The watch over one topic's partition count.
#[derive(Clone)]
pub struct PartitionGuard {
    topic: String,
    accept_change: bool,
    /// A client of its own, so the check never refreshes the producer's
    /// view of the topic.
    client: Arc<Mutex<Option<BaseConsumer>>>,
    broker: BrokerConfig,
    allowed: Arc<AtomicBool>,
    problem: Arc<Mutex<Option<String>>>,
    /// The count records are placed by: the recorded one, as last read.
    recorded: RecordedCount,
    /// The count the broker listed at the last check that read one.
    found: Arc<std::sync::atomic::AtomicI32>,
    /// The fewest in-sync replicas of any partition, at the last check.
    thinnest_isr: Arc<Mutex<Option<usize>>>,
    /// The topic's `min.insync.replicas`, read once.
    min_insync: Arc<std::sync::OnceLock<usize>>,
    /// A read of it is under way (in the background: an admin API that
    /// does not answer must not hold a publishing pass up).
    reading_min_insync: Arc<AtomicBool>,
}

impl std::fmt::Debug for PartitionGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionGuard")
            .field("topic", &self.topic)
            .field("accept_change", &self.accept_change)
            .finish_non_exhaustive()
    }
}

impl Drop for PartitionGuard {
    fn drop(&mut self) {
        // The last holder closes the client off the async runtime.
        if Arc::strong_count(&self.client) == 1
            && let Some(client) = self
                .client
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take()
        {
            std::thread::spawn(move || drop(client));
        }
    }
}

/// What a check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// The count matches the record (or was recorded now).
    Same(i32),
    /// Partitions were added and not accepted: records go on to the
    /// recorded ones, the new ones get none.
    Grown { recorded: i32, found: i32 },
    /// It changed and the change was accepted: the new count is recorded.
    Accepted { from: i32, to: i32 },
    /// Fewer partitions than recorded, not accepted: publishing stops.
    Refused { recorded: i32, found: i32 },
    /// The count could not be read; nothing changes.
    Unknown(String),
}

impl PartitionGuard {
    #[must_use]
    pub fn new(broker: BrokerConfig, topic: &str, accept_change: bool) -> Self {
        Self {
            topic: topic.to_owned(),
            accept_change,
            client: Arc::default(),
            broker,
            allowed: Arc::new(AtomicBool::new(true)),
            problem: Arc::default(),
            recorded: RecordedCount::default(),
            found: Arc::default(),
            thinnest_isr: Arc::default(),
            min_insync: Arc::default(),
            reading_min_insync: Arc::default(),
        }
    }

    /// When a partition of the topic has fewer replicas in sync than the
    /// topic's `min.insync.replicas` (the last check's view): the brokers
    /// hold every `acks=all` write to it, and refuse it with
    /// NOT_ENOUGH_REPLICAS, which librdkafka retries until the record times
    /// out. (in sync, required)
    #[must_use]
    pub fn short_of_replicas(&self) -> Option<(usize, usize)> {
        let thinnest = (*self
            .thinnest_isr
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner))?;
        let required = *self.min_insync.get()?;
        (thinnest < required).then_some((thinnest, required))
    }

    /// Starts reading the topic's `min.insync.replicas` in the background
    /// unless it is known or being read.
    fn learn_min_insync(&self) {
        if self.min_insync.get().is_some() || self.reading_min_insync.swap(true, Ordering::SeqCst) {
            return;
        }
        let guard = self.clone();
        tokio::spawn(async move {
            guard.read_min_insync().await;
            guard.reading_min_insync.store(false, Ordering::SeqCst);
        });
    }

    /// Reads the topic's `min.insync.replicas` (nothing on failure: the
    /// next check asks again).
    async fn read_min_insync(&self) {
        let Ok(admin) = self
            .broker
            .client()
            .create::<rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>>()
        else {
            return;
        };
        let options = rdkafka::admin::AdminOptions::new().request_timeout(Some(METADATA_TIMEOUT));
        let described = admin
            .describe_configs(
                [&rdkafka::admin::ResourceSpecifier::Topic(&self.topic)],
                &options,
            )
            .await;
        std::thread::spawn(move || drop(admin));
        let value = described.ok().and_then(|mut results| {
            results
                .pop()?
                .ok()?
                .get("min.insync.replicas")?
                .value
                .clone()
        });
        if let Some(required) = value.and_then(|v| v.parse().ok()) {
            let _ = self.min_insync.set(required);
        }
    }

    /// The recorded count as this relay last read it, shared: the
    /// publisher places every record by it.
    #[must_use]
    pub fn recorded(&self) -> RecordedCount {
        self.recorded.clone()
    }

    /// The count the broker listed at the last check that could read it.
    #[must_use]
    pub fn found(&self) -> Option<i32> {
        Some(self.found.load(Ordering::SeqCst)).filter(|count| *count > 0)
    }

    /// Whether rows may be published now.
    #[must_use]
    pub fn allowed(&self) -> bool {
        self.allowed.load(Ordering::SeqCst)
    }

    /// Why publishing stopped, if it did.
    #[must_use]
    pub fn problem(&self) -> Option<String> {
        self.problem
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    async fn partition_count(&self) -> Result<i32, String> {
        let (client, broker, topic) =
            (self.client.clone(), self.broker.clone(), self.topic.clone());
        let thinnest_isr = self.thinnest_isr.clone();
        tokio::task::spawn_blocking(move || {
            let mut client = client
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if client.is_none() {
                *client = Some(broker.client().create().map_err(|e| e.to_string())?);
            }
            let metadata = client
                .as_ref()
                .expect("just made")
                .fetch_metadata(Some(&topic), METADATA_TIMEOUT)
                .map_err(|e| e.to_string())?;
            let found = metadata
                .topics()
                .iter()
                .find(|t| t.name() == topic && t.error().is_none());
            *thinnest_isr
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) =
                found.and_then(|t| t.partitions().iter().map(|p| p.isr().len()).min());
            found
                .map(|t| i32::try_from(t.partitions().len()).unwrap_or(i32::MAX))
                .filter(|count| *count > 0)
                .ok_or_else(|| format!("the broker lists no partitions of {topic}"))
        })
        .await
        .map_err(|e| format!("the metadata read stopped: {e}"))?
    }

    /// Reads the count and compares it with the record: records it when
    /// there is none (or the change is accepted), stops publishing when it
    /// changed otherwise.
    ///
    /// # Errors
    /// Database errors.
    pub async fn check(&self, pool: &PgPool) -> Result<Checked, sqlx::Error> {
        self.learn_min_insync();
        let found = match self.partition_count().await {
            Ok(found) => found,
            Err(e) => {
                // Nothing to compare, but the recorded count is still the
                // one to place records by (the first check of a relay
                // that cannot read the broker's metadata learns it here).
                let recorded = flotilla_store::sql::session(pool, async |conn| {
                    flotilla_store::topics::recorded_partitions(conn, &self.topic).await
                })
                .await?;
                if let Some(recorded) = recorded {
                    self.recorded.set(recorded);
                }
                return Ok(Checked::Unknown(e));
            }
        };
        let previously_found = self.found.swap(found, Ordering::SeqCst);
        let checked = flotilla_store::sql::session(pool, async |conn| {
            self.compare_recorded(conn, found).await
        })
        .await?;
        if let Checked::Grown { recorded, found } = checked
            && previously_found != found
        {
            tracing::warn!(topic = %self.topic, recorded, found,
                "the event topic has more partitions than recorded: events go on to the recorded ones, the new ones get none until the change is accepted (see \"Growing the event topic\" in docs/operations.md)");
        }
        Ok(checked)
    }

    /// Compares the partitions `found` with those recorded for the topic,
    /// recording them where none are (or the change is accepted).
    async fn compare_recorded(
        &self,
        conn: &mut sqlx::PgConnection,
        found: i32,
    ) -> Result<Checked, sqlx::Error> {
        let recorded = flotilla_store::topics::recorded_partitions(conn, &self.topic).await?;
        let (checked, placed_by) = match recorded {
            None => {
                flotilla_store::topics::record_partitions(conn, &self.topic, found).await?;
                (Checked::Same(found), found)
            }
            Some(recorded) if recorded == found => (Checked::Same(found), found),
            Some(recorded) if self.accept_change => {
                flotilla_store::topics::record_partitions(conn, &self.topic, found).await?;
                tracing::warn!(topic = %self.topic, from = recorded, to = found,
                    "the event topic's partition count changed; accepted and recorded");
                let accepted = Checked::Accepted {
                    from: recorded,
                    to: found,
                };
                (accepted, found)
            }
            // The recorded partitions all exist: records go on to them.
            Some(recorded) if recorded < found => (Checked::Grown { recorded, found }, recorded),
            Some(recorded) => (Checked::Refused { recorded, found }, recorded),
        };
        self.recorded.set(placed_by);
        let problem = match &checked {
            Checked::Refused { recorded, found } => Some(format!(
                "event topic {} has {found} partitions, {recorded} recorded: a job's events could not stay in the partition of its earlier ones, so nothing is published until the change is accepted (--accept-partition-change, FLOTILLA_ACCEPT_PARTITION_CHANGE=true; see \"Growing the event topic\" in docs/operations.md)",
                self.topic
            )),
            _ => None,
        };
        if let Some(problem) = &problem
            && self.allowed()
        {
            tracing::error!(topic = %self.topic, %problem, "publishing stopped");
            metrics::counter!("flotilla_relay_partition_changes_refused_total").increment(1);
        }
        self.allowed.store(problem.is_none(), Ordering::SeqCst);
        *self
            .problem
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = problem;
        Ok(checked)
    }
}
