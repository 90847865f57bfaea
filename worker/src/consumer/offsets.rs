//! Offsets kept with the rows (docs/architecture.md, "Offsets kept with the
//! rows"). Once a batch is durable its offsets are written to Postgres
//! (`consumer_offset`), in a transaction after the batch's own, so the
//! write-ahead log holds them after the rows they stand for; then stored
//! and committed to Kafka as before. A partition newly assigned is checked
//! against them at once, before any batch of its is persisted: when the
//! database's offset is behind the group's committed one in Kafka (a
//! failover lost the last commits, their offsets with them, while Kafka
//! kept its own), the partition is sought back to the database's and those
//! messages are read again.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use flotilla_store::consumer_offsets::{self, PartitionOffset};
use rdkafka::Message as _;
use rdkafka::consumer::Consumer as _;
use rdkafka::{Offset, TopicPartitionList};

use super::{Outage, Received, RequestConsumer};

/// How long one seek may take.
const SEEK_TIMEOUT: Duration = Duration::from_secs(10);

/// A topic and a partition.
pub(super) type Partition = (String, i32);

/// The next offset to read per partition, after `batch`.
pub(super) fn next_offsets(batch: &[Received]) -> BTreeMap<Partition, i64> {
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
    /// Writes the offsets after `batch` (durable by now) to the database.
    /// A failure costs nothing but a batch read again after a rebalance
    /// (the database then stands behind Kafka), so it is logged and counted,
    /// never retried in the way of the next batch.
    pub(super) async fn keep_offsets(&self, batch: &[Received]) {
        let offsets: Vec<PartitionOffset> = next_offsets(batch)
            .into_iter()
            .map(|((topic, partition), next_offset)| PartitionOffset {
                topic,
                partition,
                next_offset,
            })
            .collect();
        if let Err(e) =
            consumer_offsets::record(self.engine.pool(), &self.settings.group, &offsets).await
        {
            metrics::counter!("flotilla_consumer_offsets_unkept_total").increment(1);
            tracing::warn!(error = %e, "keeping the batch's offsets in the database failed; it may be read again after a rebalance");
        }
    }

    /// Checks the partitions assigned since the last check: one whose
    /// offset in the database is behind the group's committed offset in
    /// Kafka is sought back to it. Returns those sought back: their
    /// messages already in a batch are to be dropped (the seek delivers
    /// them again). A partition the database has no offset for, or one at
    /// or ahead of Kafka's, reads on (reading again is harmless, and an
    /// operator who moved the group back to replay means it).
    ///
    /// # Errors
    /// The database, the committed offsets or the seek failed: checked
    /// again, the batch held back meanwhile.
    pub(super) async fn rewind(&self) -> Result<HashSet<Partition>, Outage> {
        let fresh: Vec<Partition> = self.consumer.context().fresh().into_iter().collect();
        if fresh.is_empty() {
            return Ok(HashSet::new());
        }
        let kept = consumer_offsets::next_offsets(self.engine.pool(), &self.settings.group, &fresh)
            .await
            .map_err(|e| Outage::Store(e.into()))?;
        let mut rewound = HashSet::new();
        if !kept.is_empty() {
            let committed = self.committed(&kept).await?;
            for kept in kept {
                let key = (kept.topic.clone(), kept.partition);
                let Some(&kafka) = committed.get(&key) else {
                    continue;
                };
                if kept.next_offset >= kafka {
                    continue;
                }
                self.consumer
                    .seek(
                        &kept.topic,
                        kept.partition,
                        Offset::Offset(kept.next_offset),
                        SEEK_TIMEOUT,
                    )
                    .map_err(|error| Outage::Seek {
                        partition: format!("{}/{}", kept.topic, kept.partition),
                        error,
                    })?;
                metrics::counter!("flotilla_consumer_rewinds_total", "topic" => kept.topic.clone())
                    .increment(1);
                tracing::warn!(topic = %kept.topic, partition = kept.partition,
                    database = kept.next_offset, kafka,
                    "the database's offset is behind Kafka's committed one (it lost its last commits?): reading those messages again");
                rewound.insert(key);
            }
        }
        self.consumer.context().checked(&fresh);
        Ok(rewound)
    }

    /// The group's committed offsets in Kafka for these partitions (those
    /// without one left out), asked off the async runtime.
    async fn committed(
        &self,
        partitions: &[PartitionOffset],
    ) -> Result<BTreeMap<Partition, i64>, Outage> {
        let mut list = TopicPartitionList::new();
        for p in partitions {
            list.add_partition(&p.topic, p.partition);
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
