//! Where the reply consumer starts a partition that has no offset anywhere
//! (a new reply group, or one whose offsets are gone from Kafka and from
//! the database alike). The request consumer must read such a partition
//! from its start (`auto.offset.reset`), since every request there may be
//! owed a run; a reply matters only to a request still waiting for it, so
//! the reply consumer starts at the first record written since the
//! earliest such request was made (less [`REPLY_START_MARGIN`] for the
//! clocks of the worker and the responder), or at the end when none
//! waits: not at a retention's worth of replies, each dropped as stale.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use flotilla_store::runs::step_requests;
use rdkafka::consumer::Consumer as _;
use rdkafka::{Offset, TopicPartitionList};

use crate::offsets::Partition;
use crate::{Outage, RequestConsumer};

/// How far before the earliest waiting request a reply partition starts:
/// the responder stamps its records by its own clock.
pub(crate) const REPLY_START_MARGIN: Duration = Duration::from_secs(300);

/// How long the broker may take to say which offsets a time gives.
const TIMES_TIMEOUT: Duration = Duration::from_secs(10);

impl RequestConsumer {
    /// Seeks the reply partitions among `unkept` (fresh, with no offset in
    /// the database) that have no committed offset in Kafka either to the
    /// first record since the earliest waiting request; returns those
    /// sought.
    ///
    /// # Errors
    /// The database, the committed offsets, the broker's answer or a seek
    /// failed: checked again, the batch held back meanwhile.
    pub(crate) async fn start_replies(
        &self,
        unkept: &[Partition],
    ) -> Result<HashSet<Partition>, Outage> {
        let replies: Vec<Partition> = unkept
            .iter()
            .filter(|(topic, _)| self.settings.is_reply_topic(topic))
            .cloned()
            .collect();
        if replies.is_empty() {
            return Ok(HashSet::new());
        }
        let committed = self.committed(&replies).await?;
        let unstarted: Vec<Partition> = replies
            .into_iter()
            .filter(|partition| !committed.contains_key(partition))
            .collect();
        if unstarted.is_empty() {
            return Ok(HashSet::new());
        }
        // Compared with the records' timestamps: the wall clock, as theirs.
        let now = Utc::now();
        let waiting = step_requests::earliest_awaited(self.engine.pool())
            .await
            .map_err(|e| Outage::Store(e.into()))?;
        let since = waiting.map_or(now, |at| at.min(now)) - REPLY_START_MARGIN;
        let offsets = self.offsets_at(&unstarted, since).await?;
        let mut sought = HashSet::new();
        for (partition, offset) in offsets {
            self.seek_or_hold(&partition, offset)?;
            tracing::info!(topic = %partition.0, partition = partition.1, ?offset, %since,
                "a reply partition with no offset anywhere starts at the earliest waiting request, not at the topic's start");
            sought.insert(partition);
        }
        Ok(sought)
    }

    /// The first offset at or after `since` of each of `partitions`, or
    /// its end where no record is that recent: a number either way, read
    /// now, so a reply written before the first fetch is not passed by.
    async fn offsets_at(
        &self,
        partitions: &[Partition],
        since: DateTime<Utc>,
    ) -> Result<Vec<(Partition, Offset)>, Outage> {
        let mut list = TopicPartitionList::new();
        for (topic, partition) in partitions {
            list.add_partition_offset(topic, *partition, Offset::Offset(since.timestamp_millis()))
                .map_err(|e| Outage::OffsetsAt(e.to_string()))?;
        }
        let consumer = self.consumer.clone();
        tokio::task::spawn_blocking(move || {
            let answer = consumer.offsets_for_times(list, TIMES_TIMEOUT)?;
            let mut offsets = Vec::new();
            for element in answer.elements() {
                element.error()?;
                let partition = (element.topic().to_owned(), element.partition());
                let offset = match element.offset() {
                    Offset::Offset(offset) => offset,
                    // No record that recent: the end as it is now.
                    _ => {
                        consumer
                            .fetch_watermarks(&partition.0, partition.1, TIMES_TIMEOUT)?
                            .1
                    }
                };
                offsets.push((partition, Offset::Offset(offset)));
            }
            Ok::<_, rdkafka::error::KafkaError>(offsets)
        })
        .await
        .map_err(|e| Outage::OffsetsAt(e.to_string()))?
        .map_err(|e| Outage::OffsetsAt(e.to_string()))
    }
}
