//! Offsets kept with the rows (docs/architecture.md, "Offsets kept with the
//! rows"). Once a batch is durable its offsets are written to Postgres
//! (`consumer_offset`), in a transaction after the batch's own, so the
//! write-ahead log holds them after the rows they stand for; then stored
//! and committed to Kafka as before. A partition newly assigned is checked
//! against them at once, before any batch of its is persisted: when the
//! database's offset is behind the group's committed one in Kafka (a
//! failover lost the last commits, their offsets with them, while Kafka
//! kept its own), the partition is sought back to the database's and those
//! messages are read again; when Kafka has no committed offset for it (a
//! renamed group, or one whose offsets expired or were deleted), it is
//! sought to the database's rather than read from the topic's start. A member that keeps its partitions through the
//! failover finds the database holding less than it wrote last, at its
//! next batch or at its next audit (every few seconds, so a partition that
//! gets no new message after the failover is not left behind), and goes
//! back the same way.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use flotilla_store::consumer_offsets::{self, PartitionOffset};
use rdkafka::Message as _;
use rdkafka::consumer::Consumer as _;
use rdkafka::{Offset, TopicPartitionList};

use crate::{Outage, Received, RequestConsumer};

/// How long one seek may take.
const SEEK_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a member checks, with no batch to bring it about, that the
/// database still holds the offsets it wrote (see
/// [`RequestConsumer::audit_kept_offsets`]): one small read per interval.
pub(crate) const AUDIT_INTERVAL: Duration = Duration::from_secs(3);

/// A topic and a partition.
pub(crate) type Partition = (String, i32);

/// A seek of `partition` that failed, as the outage it is.
fn seek_failed(partition: &Partition, error: rdkafka::error::KafkaError) -> Outage {
    Outage::Seek {
        partition: format!("{}/{}", partition.0, partition.1),
        error,
    }
}

/// The next offset to read per partition, after `batch`.
pub(crate) fn next_offsets(batch: &[Received]) -> BTreeMap<Partition, i64> {
    let mut next: BTreeMap<Partition, i64> = BTreeMap::new();
    for message in batch {
        let entry = next
            .entry((message.topic().to_owned(), message.partition()))
            .or_default();
        *entry = (*entry).max(message.offset() + 1);
    }
    next
}

impl RequestConsumer {
    /// Writes the offsets after `batch` (durable by now) to the database,
    /// after checking that the database still holds what this consumer
    /// wrote last for those partitions. One where it holds less lost
    /// commits under this member (a failover with no rebalance): it is
    /// sought back to the database's offset and returned, its offsets not
    /// written, so the caller commits nothing of it and the lost messages
    /// are read again. A failure to read or write costs nothing but a batch
    /// read again after a rebalance (the database then stands behind
    /// Kafka), so it is logged and counted, never retried in the way of the
    /// next batch.
    pub(crate) async fn keep_offsets(&self, batch: &[Received]) -> HashSet<Partition> {
        let next = next_offsets(batch);
        let partitions: Vec<Partition> = next.keys().cloned().collect();
        let went_back = match self.go_back_where_the_database_is_behind(&partitions).await {
            Ok(went_back) => went_back,
            Err(e) => {
                metrics::counter!("flotilla_consumer_offsets_unkept_total").increment(1);
                tracing::warn!(error = %e, "reading the database's offsets failed; the batch's are not kept there");
                return HashSet::new();
            }
        };
        let offsets: Vec<PartitionOffset> = next
            .into_iter()
            .filter(|(partition, _)| !went_back.contains(partition))
            .map(|((topic, partition), next_offset)| PartitionOffset {
                topic,
                partition,
                next_offset,
            })
            .collect();
        match consumer_offsets::record(self.engine.pool(), &self.settings.group, &offsets).await {
            Ok(()) => {
                let mut kept = self.kept_offsets();
                for o in offsets {
                    kept.insert((o.topic, o.partition), o.next_offset);
                }
            }
            Err(e) => {
                metrics::counter!("flotilla_consumer_offsets_unkept_total").increment(1);
                tracing::warn!(error = %e, "keeping the batch's offsets in the database failed; it may be read again after a rebalance");
            }
        }
        went_back
    }

    /// Every [`AUDIT_INTERVAL`], with no batch to bring it about: checks
    /// that the database still holds the offsets this member wrote last for
    /// the partitions it holds, and seeks back those where it holds less.
    /// Without it a partition that gets no new message after a failover
    /// would never find its lost requests. A database that does not answer
    /// is checked again at the next audit.
    pub(crate) async fn audit_kept_offsets(&self) -> HashSet<Partition> {
        self.forget_unassigned();
        let partitions: Vec<Partition> = self.kept_offsets().keys().cloned().collect();
        if partitions.is_empty() {
            return HashSet::new();
        }
        match self.go_back_where_the_database_is_behind(&partitions).await {
            Ok(went_back) => went_back,
            Err(e) => {
                tracing::debug!(error = %e, "auditing the database's offsets failed; trying at the next audit");
                HashSet::new()
            }
        }
    }

    /// Reads the database's offsets of `partitions` and seeks back those
    /// where it stands behind what this member wrote last
    /// ([`RequestConsumer::go_back_where_behind`]); what this member wrote
    /// of those is forgotten (it is ahead of the database now, and would
    /// send the partition back again at every check). Returns them.
    ///
    /// # Errors
    /// The database's offsets could not be read: nothing was sought.
    async fn go_back_where_the_database_is_behind(
        &self,
        partitions: &[Partition],
    ) -> Result<HashSet<Partition>, sqlx::Error> {
        let held: BTreeMap<Partition, i64> =
            consumer_offsets::next_offsets(self.engine.pool(), &self.settings.group, partitions)
                .await?
                .into_iter()
                .map(|o| ((o.topic, o.partition), o.next_offset))
                .collect();
        let went_back = self.go_back_where_behind(partitions, &held);
        let mut kept = self.kept_offsets();
        for partition in &went_back {
            kept.remove(partition);
        }
        Ok(went_back)
    }

    /// Forgets what this member wrote and where it started for partitions
    /// it no longer holds: they are no measure of anything now, and a seek
    /// on one would fail at every audit.
    fn forget_unassigned(&self) {
        let Ok(assignment) = self.consumer.assignment() else {
            return;
        };
        let held: HashSet<Partition> = assignment
            .elements()
            .iter()
            .map(|e| (e.topic().to_owned(), e.partition()))
            .collect();
        self.kept_offsets()
            .retain(|partition, _| held.contains(partition));
        self.started_offsets()
            .retain(|partition, _| held.contains(partition));
        self.unanchored_partitions()
            .retain(|partition| held.contains(partition));
    }

    /// Seeks back each of `partitions` where the database (`held`) stands
    /// behind the offset this member wrote last; returns those sought back.
    /// A partition the database has no offset for at all is as much a
    /// loss, with nothing to go back to: said loudly, and it reads on.
    fn go_back_where_behind(
        &self,
        partitions: &[Partition],
        held: &BTreeMap<Partition, i64>,
    ) -> HashSet<Partition> {
        let mut went_back = HashSet::new();
        let kept = self.kept_offsets();
        for partition in partitions {
            let Some(&mine) = kept.get(partition) else {
                continue;
            };
            match held.get(partition) {
                Some(&database) if database < mine => {
                    // A seek that fails reads on; the next batch or audit
                    // finds the database still behind and tries again.
                    match self.seek_back(partition, database, mine) {
                        Ok(()) => {
                            went_back.insert(partition.clone());
                        }
                        Err(e) => tracing::warn!(error = %e, topic = %partition.0,
                            partition = partition.1, "seeking back to the database's offset failed"),
                    }
                }
                Some(_) => {}
                // Even the offset written at assignment is lost: back to
                // where this member started the partition.
                None => match self.started_at(partition) {
                    Some(start) => match self.seek_back(partition, start, mine) {
                        Ok(()) => {
                            went_back.insert(partition.clone());
                        }
                        Err(e) => tracing::warn!(error = %e, topic = %partition.0,
                            partition = partition.1, "seeking back to where this member started failed"),
                    },
                    None => tracing::error!(topic = %partition.0, partition = partition.1, mine,
                        "the database holds no offset for a partition this member wrote one for: it lost commits, and there is no offset to go back to"),
                },
            }
        }
        went_back
    }

    /// Where this member started reading `partition` when it was assigned.
    fn started_at(&self, partition: &Partition) -> Option<i64> {
        self.started_offsets().get(partition).copied()
    }

    fn kept_offsets(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<Partition, i64>> {
        self.kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Seeks `partition` back to the database's offset, `database`, from
    /// `ahead` (Kafka's committed one, or the one this member wrote last),
    /// counted and said.
    ///
    /// # Errors
    /// The seek failed: the partition reads on from where it was.
    fn seek_back(
        &self,
        partition: &Partition,
        database: i64,
        ahead: i64,
    ) -> Result<(), rdkafka::error::KafkaError> {
        self.seek_to(partition, database)?;
        metrics::counter!("flotilla_consumer_rewinds_total", "topic" => partition.0.clone())
            .increment(1);
        tracing::warn!(topic = %partition.0, partition = partition.1, database, ahead,
            "the database's offset is behind (it lost its last commits?): reading those messages again");
        Ok(())
    }

    fn seek_to(
        &self,
        partition: &Partition,
        offset: i64,
    ) -> Result<(), rdkafka::error::KafkaError> {
        self.seek_at(partition, Offset::Offset(offset))
    }

    fn seek_at(
        &self,
        partition: &Partition,
        offset: Offset,
    ) -> Result<(), rdkafka::error::KafkaError> {
        self.consumer
            .seek(&partition.0, partition.1, offset, SEEK_TIMEOUT)
    }

    /// Seeks `partition` to `offset` on assignment; a failure is an outage
    /// (checked again, the batch held back meanwhile).
    pub(crate) fn seek_or_hold(&self, partition: &Partition, offset: Offset) -> Result<(), Outage> {
        self.seek_at(partition, offset)
            .map_err(|error| seek_failed(partition, error))
    }

    /// Seeks `partition`, which has no committed offset in Kafka, to the
    /// database's offset, `database`, and stores it for the next commit,
    /// said.
    ///
    /// # Errors
    /// The seek failed: the partition reads on from where it was.
    fn resume_at_database(
        &self,
        partition: &Partition,
        database: i64,
    ) -> Result<(), rdkafka::error::KafkaError> {
        self.seek_to(partition, database)?;
        // Kafka learns it too (committed with the next batch, or by the
        // timer), so its lag and its tools see where the group is even
        // before the partition's next message.
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(&partition.0, partition.1, Offset::Offset(database))?;
        self.consumer.store_offsets(&list)?;
        tracing::warn!(topic = %partition.0, partition = partition.1, database,
            "the group has no committed offset in Kafka for this partition (a new or renamed group, or its offsets expired or were deleted): resuming at the database's, not at the topic's start");
        Ok(())
    }

    /// Drops from `batch`, and from what an outage set aside, the messages
    /// of partitions sought: the seek delivers from there.
    pub(crate) fn drop_read_again(
        &self,
        batch: &mut Vec<Received>,
        partitions: &HashSet<Partition>,
    ) {
        if partitions.is_empty() {
            return;
        }
        let read_again = |m: &Received| partitions.contains(&(m.topic().to_owned(), m.partition()));
        batch.retain(|m| !read_again(m));
        self.carried
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|m| !read_again(m));
    }

    /// Checks the partitions assigned since the last check: one whose
    /// offset in the database is behind the group's committed offset in
    /// Kafka is sought back to it, and one Kafka has no committed offset
    /// for is sought to the database's (without it the consumer would
    /// start at the topic's start, `auto.offset.reset`, and read its whole
    /// retention again). Returns those sought: their messages already in a
    /// batch are to be dropped (the seek delivers from there). A partition
    /// at or ahead of Kafka's reads on (reading again is harmless, and an
    /// operator who moved the group back to replay means it). A partition
    /// the database has no offset for is noted, for `anchor` to give it one
    /// before its first batch is persisted.
    ///
    /// # Errors
    /// The database, the committed offsets or the seek failed: checked
    /// again, the batch held back meanwhile.
    pub(crate) async fn rewind(&self) -> Result<HashSet<Partition>, Outage> {
        let fresh: Vec<Partition> = self.consumer.context().fresh().into_iter().collect();
        if fresh.is_empty() {
            return Ok(HashSet::new());
        }
        let kept = consumer_offsets::next_offsets(self.engine.pool(), &self.settings.group, &fresh)
            .await
            .map_err(|e| Outage::Store(e.into()))?;
        let mut sought = HashSet::new();
        if !kept.is_empty() {
            let partitions: Vec<Partition> = kept
                .iter()
                .map(|o| (o.topic.clone(), o.partition))
                .collect();
            let committed = self.committed(&partitions).await?;
            for kept in &kept {
                let key = (kept.topic.clone(), kept.partition);
                let seek = match committed.get(&key) {
                    Some(&kafka) if kept.next_offset < kafka => {
                        self.seek_back(&key, kept.next_offset, kafka)
                    }
                    Some(_) => continue,
                    None => self.resume_at_database(&key, kept.next_offset),
                };
                seek.map_err(|error| seek_failed(&key, error))?;
                sought.insert(key);
            }
        }
        let anchored: HashSet<Partition> =
            kept.into_iter().map(|o| (o.topic, o.partition)).collect();
        let unkept: Vec<Partition> = fresh
            .iter()
            .filter(|partition| !anchored.contains(*partition))
            .cloned()
            .collect();
        sought.extend(self.start_replies(&unkept).await?);
        sought.extend(self.read_lost_from_the_start(&unkept).await?);
        self.consumer.context().checked(&fresh);
        // Assigned anew: what this member wrote before it held them last,
        // and where it started them, are no measure of the database now.
        let mut kept = self.kept_offsets();
        let mut started = self.started_offsets();
        let mut unanchored = self.unanchored_partitions();
        for partition in &fresh {
            kept.remove(partition);
            started.remove(partition);
            if anchored.contains(partition) {
                unanchored.remove(partition);
            } else {
                unanchored.insert(partition.clone());
            }
        }
        Ok(sought)
    }

    /// Seeks to their start the request and signal partitions among
    /// `unkept` (fresh, with no offset in the database) that Kafka has a
    /// committed offset for, while the database keeps offsets of other
    /// partitions of their topic: the group read them before, so the
    /// database had their offsets too, the anchor written before their
    /// first batch at least, and lost them all with their rows (a failover
    /// to a standby that received none of it). Returns those sought.
    ///
    /// # Errors
    /// The database, the committed offsets or a seek failed: checked
    /// again, the batch held back meanwhile.
    async fn read_lost_from_the_start(
        &self,
        unkept: &[Partition],
    ) -> Result<HashSet<Partition>, Outage> {
        let candidates: Vec<Partition> = unkept
            .iter()
            .filter(|(topic, _)| !self.settings.is_reply_topic(topic))
            .cloned()
            .collect();
        if candidates.is_empty() {
            return Ok(HashSet::new());
        }
        let topics = consumer_offsets::topics_kept(self.engine.pool(), &self.settings.group)
            .await
            .map_err(|e| Outage::Store(e.into()))?;
        let candidates: Vec<Partition> = candidates
            .into_iter()
            .filter(|(topic, _)| topics.contains(topic))
            .collect();
        if candidates.is_empty() {
            return Ok(HashSet::new());
        }
        let committed = self.committed(&candidates).await?;
        let mut sought = HashSet::new();
        for (partition, kafka) in committed {
            self.seek_or_hold(&partition, Offset::Beginning)?;
            metrics::counter!("flotilla_consumer_rewinds_total", "topic" => partition.0.clone())
                .increment(1);
            tracing::warn!(topic = %partition.0, partition = partition.1, kafka,
                "the database keeps no offset of this partition, though Kafka's is at {kafka} and it keeps the topic's other partitions' (a failover lost its whole history?): reading it again from its start");
            sought.insert(partition);
        }
        Ok(sought)
    }

    /// Before `batch` is persisted: notes where this member started each
    /// of its partitions it had not read since their assignment (the
    /// batch's first offset of it), and gives a partition the database has
    /// no offset for one there, so a failover that loses its first batches
    /// still leaves an offset behind Kafka's to go back to.
    ///
    /// # Errors
    /// The database failed: tried again, the batch held back meanwhile.
    pub(crate) async fn anchor(&self, batch: &[Received]) -> Result<(), Outage> {
        let mut first: BTreeMap<Partition, i64> = BTreeMap::new();
        for message in batch {
            let entry = first
                .entry((message.topic().to_owned(), message.partition()))
                .or_insert(message.offset());
            *entry = (*entry).min(message.offset());
        }
        {
            let mut started = self.started_offsets();
            for (partition, offset) in &first {
                started.entry(partition.clone()).or_insert(*offset);
            }
        }
        let anchors: Vec<PartitionOffset> = {
            let unanchored = self.unanchored_partitions();
            first
                .iter()
                .filter(|(partition, _)| unanchored.contains(*partition))
                .map(|((topic, partition), offset)| PartitionOffset {
                    topic: topic.clone(),
                    partition: *partition,
                    next_offset: *offset,
                })
                .collect()
        };
        if anchors.is_empty() {
            return Ok(());
        }
        consumer_offsets::record(self.engine.pool(), &self.settings.group, &anchors)
            .await
            .map_err(|e| Outage::Store(e.into()))?;
        let mut unanchored = self.unanchored_partitions();
        for anchor in anchors {
            unanchored.remove(&(anchor.topic, anchor.partition));
        }
        Ok(())
    }

    fn started_offsets(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<Partition, i64>> {
        self.started
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn unanchored_partitions(&self) -> std::sync::MutexGuard<'_, HashSet<Partition>> {
        self.unanchored
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The group's committed offsets in Kafka for these partitions (those
    /// without one left out), asked off the async runtime.
    pub(crate) async fn committed(
        &self,
        partitions: &[Partition],
    ) -> Result<BTreeMap<Partition, i64>, Outage> {
        let mut list = TopicPartitionList::new();
        for (topic, partition) in partitions {
            list.add_partition(topic, *partition);
        }
        let consumer = self.consumer.clone();
        let asked =
            tokio::task::spawn_blocking(move || consumer.committed_offsets(list, SEEK_TIMEOUT))
                .await
                .map_err(|e| Outage::Committed(e.to_string()))?
                .map_err(|e| Outage::Committed(e.to_string()))?;
        Ok(asked
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(offset) => Some(((e.topic().to_owned(), e.partition()), offset)),
                _ => None,
            })
            .collect())
    }
}
