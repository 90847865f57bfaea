//! [`EventStream`]: `workflow-run-events`, each job's events once and in
//! order, offsets committed only past what the caller acknowledged.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use flotilla_codec::{Codec, CodecError};
use flotilla_contracts::{DecodeError, WorkflowRunEvent, topics};
use flotilla_runtime::BrokerConfig;
use flotilla_runtime::kafka::GroupProtocol;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Message as _, OwnedMessage};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use uuid::Uuid;

use crate::acks::Acks;
use crate::order::{JobSequences, Verdict};

/// Where a group with no committed offset starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    /// The oldest event the topic still holds (a downstream system that
    /// must see every job).
    Earliest,
    /// Events published from now on (a dashboard, `flotilla tail`).
    Latest,
}

/// How an [`EventStream`] reads.
#[derive(Debug, Clone)]
pub struct EventStreamOptions {
    group: String,
    topic: String,
    start: StartAt,
    remember_jobs: usize,
    fetch_wait: Option<Duration>,
    instance_id: Option<String>,
    commits: bool,
    group_protocol: GroupProtocol,
}

impl EventStreamOptions {
    /// Reads `workflow-run-events` in consumer group `group`, from the
    /// earliest event when the group has no offset, remembering the last
    /// sequence of up to 100,000 jobs.
    #[must_use]
    pub fn new(group: &str) -> Self {
        Self {
            group: group.to_owned(),
            topic: topics::EVENT_TOPIC.to_owned(),
            start: StartAt::Earliest,
            remember_jobs: 100_000,
            fetch_wait: None,
            instance_id: None,
            commits: true,
            group_protocol: GroupProtocol::Classic,
        }
    }

    /// Reads `topic` instead.
    #[must_use]
    pub fn topic(mut self, topic: &str) -> Self {
        topic.clone_into(&mut self.topic);
        self
    }

    /// Where to start when the group has no committed offset.
    #[must_use]
    pub fn start_at(mut self, start: StartAt) -> Self {
        self.start = start;
        self
    }

    /// How many jobs' last sequence to keep for dropping repeats
    /// ([`JobSequences`]).
    #[must_use]
    pub fn remember_jobs(mut self, jobs: usize) -> Self {
        self.remember_jobs = jobs;
        self
    }

    /// Never commits offsets (a viewer in a throwaway group, such as
    /// `flotilla tail`): acknowledgements are still tracked, and
    /// [`EventStream::commit`] does nothing.
    #[must_use]
    pub fn without_commits(mut self) -> Self {
        self.commits = false;
        self
    }

    /// A static group member (`group.instance.id`): restarted with the
    /// same id, the consumer gets its partitions back at once, without a
    /// rebalance. Two live consumers must never share an id. Classic group
    /// protocol only: refused with [`GroupProtocol::Consumer`].
    #[must_use]
    pub fn static_member(mut self, id: &str) -> Self {
        self.instance_id = Some(id.to_owned());
        self
    }

    /// The consumer group protocol: classic (librdkafka's own assignors;
    /// the default) or KIP-848's consumer protocol (Kafka 4.0 and later:
    /// the broker assigns partitions and owns the session timeout, so
    /// `session.timeout.ms` and `heartbeat.interval.ms` are refused as
    /// pass-through properties). Every member of one group should use the
    /// same one.
    #[must_use]
    pub fn group_protocol(mut self, protocol: GroupProtocol) -> Self {
        self.group_protocol = protocol;
        self
    }

    /// How long the broker may hold a fetch that has nothing to return
    /// (`fetch.wait.max.ms`; librdkafka's default is 500 ms).
    #[must_use]
    pub fn fetch_wait(mut self, wait: Duration) -> Self {
        self.fetch_wait = Some(wait);
        self
    }
}

/// One event for the caller, with where it came from. Pass it to
/// [`EventStream::ack`] once its effects are durable.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    event: WorkflowRunEvent,
    partition: i32,
    offset: i64,
}

impl Delivery {
    /// The event.
    #[must_use]
    pub fn event(&self) -> &WorkflowRunEvent {
        &self.event
    }

    /// The event, taken out.
    #[must_use]
    pub fn into_event(self) -> WorkflowRunEvent {
        self.event
    }

    /// The partition and offset it was read from.
    #[must_use]
    pub fn position(&self) -> (i32, i64) {
        (self.partition, self.offset)
    }
}

/// What [`EventStream::next`] reports instead of an event. The stream goes
/// on after each of them.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// Events of a job were skipped: `expected` was due, `got` came. The
    /// event that came is in `delivery`; the stream goes on from it, and
    /// it is the caller's to apply and [`ack`](EventStream::ack) (or to
    /// stop on).
    #[error("job {job_id}: event {expected} never arrived (event {got} did)")]
    Gap {
        job_id: Uuid,
        expected: i64,
        got: i64,
        delivery: Box<Delivery>,
    },
    /// The record at this position is not a `WorkflowRunEvent` in either
    /// encoding and never will be. It is skipped (its offset counts as
    /// acknowledged); keep it somewhere if it matters.
    #[error("the record at partition {partition} offset {offset} is not an event: {reason}")]
    Undecodable {
        partition: i32,
        offset: i64,
        reason: String,
    },
    /// The broker or the registry could not be used just now; call
    /// [`EventStream::next`] again (the record in hand, if any, is decoded
    /// again).
    #[error("the event stream is unavailable: {0}")]
    Unavailable(String),
    /// The settings cannot work: from [`EventStream::subscribe`], or from
    /// [`EventStream::next`] an Avro record with no registry configured
    /// (the record stays in hand, unsettled, until a stream with the
    /// registry reads it).
    #[error("event stream settings: {0}")]
    Settings(String),
}

/// Consumes the event topic and yields each job's events once, in
/// sequence order, decoding Avro and JSON alike.
///
/// - A **repeat** (a sequence at or below the last one yielded for the job)
///   is dropped and counted ([`EventStream::repeats_dropped`]).
/// - A **gap** (a sequence skipped) is reported as [`StreamError::Gap`],
///   carrying the event that came.
/// - **Offsets** are stored for commit only up to the first event not yet
///   [acknowledged](EventStream::ack), and committed every second and when
///   partitions move or the stream closes; a consumer that dies before
///   acknowledging reads those events again. Repeats and undecodable
///   records count as acknowledged.
///
/// Repeats are recognised within this process only (see [`JobSequences`]);
/// across restarts, keep each job's last applied sequence with your own
/// write and check it with [`crate::classify`].
pub struct EventStream {
    consumer: Arc<StreamConsumer<Context>>,
    codec: Codec,
    topic: String,
    jobs: JobSequences,
    acks: Arc<Mutex<Acks>>,
    /// Partitions taken away since the stream last looked.
    revoked: Arc<Mutex<Vec<i32>>>,
    revocations: Arc<AtomicU64>,
    /// The record being judged, with the revocation count when it was
    /// read: kept here until it is yielded or settled, so a cancelled
    /// `next()` or a registry outage decodes it again.
    held: Option<(OwnedMessage, u64)>,
    commits: bool,
    repeats: u64,
    /// Set by [`EventStream::close`], which leaves the group itself.
    closed: bool,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream")
            .field("topic", &self.topic)
            .field("jobs", &self.jobs.len())
            .field("repeats", &self.repeats)
            .finish_non_exhaustive()
    }
}

/// What a rebalance took away: forgotten in the offsets at once, and in the
/// job memory by the stream before it judges its next record.
struct Context {
    acks: Arc<Mutex<Acks>>,
    revoked: Arc<Mutex<Vec<i32>>>,
    /// Counts revocations: a record read before one is another reading's.
    revocations: Arc<AtomicU64>,
}

impl ClientContext for Context {}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(partitions) = rebalance {
            let mut acks = self.acks.lock().unwrap_or_else(PoisonError::into_inner);
            let mut revoked = self.revoked.lock().unwrap_or_else(PoisonError::into_inner);
            for element in partitions.elements() {
                acks.forget(element.partition());
                revoked.push(element.partition());
            }
            self.revocations.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl EventStream {
    /// Joins `options`' consumer group on the broker `broker` names
    /// (its security settings and registry included) and subscribes.
    ///
    /// # Errors
    /// [`StreamError::Settings`] for settings that cannot work.
    pub fn subscribe(
        broker: &BrokerConfig,
        options: &EventStreamOptions,
    ) -> Result<Self, StreamError> {
        broker
            .validate()
            .and_then(|()| options.group_protocol.check(&broker.security))
            .map_err(|e| StreamError::Settings(e.to_string()))?;
        if options.instance_id.is_some() && options.group_protocol == GroupProtocol::Consumer {
            return Err(StreamError::Settings(
                "a static member under the consumer group protocol would be refused after a crash \
                 until its earlier self's session expired (UNRELEASED_INSTANCE_ID, fatal to the \
                 consumer): use one or the other"
                    .to_owned(),
            ));
        }
        let codec = Codec::from_config(&broker.registry)
            .map_err(|e| StreamError::Settings(e.to_string()))?;
        let mut config = broker.manual_commit_consumer(&options.group);
        // librdkafka commits what was stored, every second and when
        // partitions move; only acknowledged offsets are ever stored.
        config
            .set("enable.auto.commit", options.commits.to_string())
            .set("enable.auto.offset.store", "false")
            .set("auto.commit.interval.ms", "1000")
            .set(
                "auto.offset.reset",
                match options.start {
                    StartAt::Earliest => "earliest",
                    StartAt::Latest => "latest",
                },
            );
        // The assignor is left to librdkafka (and the group's other
        // members) under the classic protocol: a changed one would split a
        // group of this release and the one before during a rolling update.
        config.set("group.protocol", options.group_protocol.as_str());
        if let Some(id) = &options.instance_id {
            config.set("group.instance.id", id);
        }
        if let Some(wait) = options.fetch_wait {
            config.set("fetch.wait.max.ms", wait.as_millis().max(1).to_string());
        }
        let acks = Arc::new(Mutex::new(Acks::default()));
        let revoked = Arc::new(Mutex::new(Vec::new()));
        let revocations = Arc::new(AtomicU64::new(0));
        let consumer: StreamConsumer<Context> = config
            .create_with_context(Context {
                acks: Arc::clone(&acks),
                revoked: Arc::clone(&revoked),
                revocations: Arc::clone(&revocations),
            })
            .map_err(|e| StreamError::Settings(format!("creating the consumer: {e}")))?;
        consumer
            .subscribe(&[&options.topic])
            .map_err(|e| StreamError::Settings(format!("subscribing to {}: {e}", options.topic)))?;
        Ok(Self {
            consumer: Arc::new(consumer),
            codec,
            topic: options.topic.clone(),
            jobs: JobSequences::new(options.remember_jobs),
            acks,
            revoked,
            revocations,
            held: None,
            commits: options.commits,
            repeats: 0,
            closed: false,
        })
    }

    /// The next event that is neither a repeat nor undecodable, waiting
    /// for one. Cancel-safe: a call dropped while it waits (a timeout
    /// around it) loses nothing; the record in hand is judged again by the
    /// next call.
    ///
    /// # Errors
    /// See [`StreamError`]; each is about one record or one moment, and the
    /// next call goes on.
    pub async fn next(&mut self) -> Result<Delivery, StreamError> {
        loop {
            if self.held.is_none() {
                let message = self
                    .consumer
                    .recv()
                    .await
                    .map_err(|e| StreamError::Unavailable(e.to_string()))?
                    .detach();
                let read_at = self.revocations.load(Ordering::SeqCst);
                self.lock_acks().read(message.partition(), message.offset());
                self.held = Some((message, read_at));
            }
            let Some((message, read_at)) = &self.held else {
                continue;
            };
            let (partition, offset, read_at) = (message.partition(), message.offset(), *read_at);
            let decoded = match message.payload() {
                Some(payload) => self.codec.decode::<WorkflowRunEvent>(payload).await,
                None => Err(CodecError::Decode(DecodeError::Empty)),
            };
            // Jobs of partitions a rebalance took away are forgotten before
            // anything is judged, and a record read before the rebalance is
            // dropped unsettled: its partition is read again from the
            // group's last commit, by whichever member holds it now.
            self.forget_revoked();
            if self.revocations.load(Ordering::SeqCst) != read_at {
                self.held = None;
                continue;
            }
            let event = match decoded {
                Ok(event) => event,
                Err(e) if e.is_transient() => return Err(StreamError::Unavailable(e.to_string())),
                Err(e @ CodecError::NoRegistry(_)) => {
                    // Not the record's fault: it stays in hand, unsettled.
                    return Err(StreamError::Settings(format!(
                        "{e}: give the stream the fleet's registry (SCHEMA_REGISTRY_URL)"
                    )));
                }
                Err(e) => {
                    self.held = None;
                    self.settle(partition, offset);
                    return Err(StreamError::Undecodable {
                        partition,
                        offset,
                        reason: e.to_string(),
                    });
                }
            };
            self.held = None;
            let delivery = Delivery {
                partition,
                offset,
                event,
            };
            match self.jobs.observe(
                delivery.event.job_id(),
                delivery.event.sequence(),
                partition,
            ) {
                Verdict::Next => return Ok(delivery),
                Verdict::Repeat => {
                    self.repeats += 1;
                    self.settle(partition, offset);
                }
                Verdict::Gap { expected, got } => {
                    return Err(StreamError::Gap {
                        job_id: delivery.event.job_id(),
                        expected,
                        got,
                        delivery: Box::new(delivery),
                    });
                }
            }
        }
    }

    /// Forgets the jobs of partitions revoked since the last look.
    fn forget_revoked(&mut self) {
        let revoked =
            std::mem::take(&mut *self.revoked.lock().unwrap_or_else(PoisonError::into_inner));
        for taken in revoked {
            self.jobs.forget_partition(taken);
        }
    }

    /// `delivery`'s effects are durable: its offset, and every offset
    /// before it that is also done, may be committed.
    pub fn ack(&self, delivery: &Delivery) {
        self.settle(delivery.partition, delivery.offset);
    }

    /// Commits what was acknowledged now, waiting for the broker (for a
    /// clean stop; commits also happen by themselves every second).
    ///
    /// # Errors
    /// [`StreamError::Unavailable`] when the broker did not take it.
    pub async fn commit(&self) -> Result<(), StreamError> {
        if !self.commits {
            return Ok(());
        }
        let consumer = Arc::clone(&self.consumer);
        let result =
            tokio::task::spawn_blocking(move || consumer.commit_consumer_state(CommitMode::Sync))
                .await
                .map_err(|e| StreamError::Unavailable(format!("the commit task: {e}")))?;
        match result {
            Ok(()) => Ok(()),
            // Nothing acknowledged since the last commit.
            Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => Ok(()),
            Err(e) => Err(StreamError::Unavailable(format!("committing: {e}"))),
        }
    }

    /// Leaves the group after committing what was acknowledged, waiting
    /// for both. Dropping the stream also leaves, without waiting: a
    /// process that exits right after may not have committed its last
    /// acknowledgements (they are read again, as repeats).
    ///
    /// # Errors
    /// [`StreamError::Unavailable`] when the final commit failed.
    pub async fn close(mut self) -> Result<(), StreamError> {
        let committed = self.commit().await;
        self.closed = true;
        let consumer = Arc::clone(&self.consumer);
        drop(self);
        // The last reference: leaving the group happens here, off the
        // async runtime's threads.
        let _ = tokio::task::spawn_blocking(move || {
            consumer.unsubscribe();
            drop(consumer);
        })
        .await;
        committed
    }

    /// How many repeats were dropped so far.
    #[must_use]
    pub fn repeats_dropped(&self) -> u64 {
        self.repeats
    }

    /// How many events were read and are not yet acknowledged.
    #[must_use]
    pub fn outstanding(&self) -> usize {
        self.lock_acks().outstanding()
    }

    fn lock_acks(&self) -> std::sync::MutexGuard<'_, Acks> {
        self.acks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks an offset done and stores the partition's commit position
    /// when it moved.
    fn settle(&self, partition: i32, offset: i64) {
        let Some(position) = self.lock_acks().ack(partition, offset) else {
            return;
        };
        let mut list = TopicPartitionList::new();
        if list
            .add_partition_offset(&self.topic, partition, Offset::Offset(position))
            .is_err()
        {
            return;
        }
        // Refused only for a partition this member no longer holds: its
        // next member reads from the group's last commit.
        if let Err(e) = self.consumer.store_offsets(&list) {
            tracing::debug!(partition, position, error = %e, "offset not stored");
        }
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        // Leaving the group commits the stored offsets and can wait on the
        // broker: not on an async runtime's thread.
        let consumer = Arc::clone(&self.consumer);
        consumer.unsubscribe();
        std::thread::spawn(move || drop(consumer));
    }
}
