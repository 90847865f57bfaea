//! The consumer's rebalance and commit callbacks.
//!
//! Offsets are *stored* only for messages whose rows (or dead-letter records)
//! are durable, so committing the stored offsets is always safe: before
//! partitions are revoked, the stored offsets are committed so the next
//! owner resumes right after the last durable message. The commit is
//! asynchronous: the callback runs inside the consumer's poll on an async
//! runtime thread, and a synchronous commit there waits (up to a session
//! timeout) while the group coordinator's broker is down, stalling every
//! task that thread runs, job heartbeats among them (review finding K7). A
//! commit that has not landed when the next owner starts costs a re-read of
//! requests that are rows already, which persisting recognises.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use rdkafka::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::topic_partition_list::TopicPartitionList;

/// The callbacks' state: whether the consumer is riding out an outage (then
/// every partition assigned meanwhile is paused on arrival too).
#[derive(Debug, Default)]
pub struct RequestConsumerContext {
    outage: AtomicBool,
    /// Partitions assigned and not yet checked against the offsets kept in
    /// the database (`offsets.rs`).
    fresh: Mutex<HashSet<(String, i32)>>,
    /// Told when partitions are assigned, so an idle consumer checks them.
    assigned: tokio::sync::Notify,
    /// The topics this consumer has held partitions of: a topic left with
    /// none shows 0 rather than its last count.
    held_topics: Mutex<HashSet<String>>,
    /// Dropped with the context, when librdkafka has closed the consumer
    /// and destroyed it: its receivers learn that the member has left.
    destroyed: tokio::sync::watch::Sender<()>,
}

impl RequestConsumerContext {
    /// A receiver whose sender goes with the consumer (see `destroyed`).
    pub(crate) fn destroyed(&self) -> tokio::sync::watch::Receiver<()> {
        self.destroyed.subscribe()
    }

    pub(crate) fn set_outage(&self, on: bool) {
        self.outage.store(on, Ordering::SeqCst);
    }

    /// Resolves once partitions were assigned (at once if they were since
    /// the last call).
    pub(crate) async fn assigned(&self) {
        self.assigned.notified().await;
    }

    /// The partitions assigned since they were last checked.
    pub(crate) fn fresh(&self) -> HashSet<(String, i32)> {
        self.fresh_partitions().clone()
    }

    /// These partitions were checked: their next messages read on.
    pub(crate) fn checked(&self, partitions: &[(String, i32)]) {
        let mut fresh = self.fresh_partitions();
        for partition in partitions {
            fresh.remove(partition);
        }
    }

    fn fresh_partitions(&self) -> std::sync::MutexGuard<'_, HashSet<(String, i32)>> {
        self.fresh
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets `flotilla_consumer_assigned_partitions` per topic: the
    /// request, signal and reply topics each show their own count.
    fn show_assignment(&self, assignment: &TopicPartitionList) {
        let mut counts: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        for e in assignment.elements() {
            *counts.entry(e.topic().to_owned()).or_default() += 1;
        }
        let mut held = self
            .held_topics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        held.extend(counts.keys().cloned());
        for topic in held.iter() {
            let count = counts.get(topic).copied().unwrap_or(0);
            #[allow(clippy::cast_precision_loss)]
            metrics::gauge!("flotilla_consumer_assigned_partitions", "topic" => topic.clone())
                .set(count as f64);
        }
    }

    fn note_assignment(&self, rebalance: &Rebalance<'_>) {
        let mut fresh = self.fresh_partitions();
        match rebalance {
            Rebalance::Assign(partitions) => {
                for e in partitions.elements() {
                    fresh.insert((e.topic().to_owned(), e.partition()));
                }
                self.assigned.notify_one();
            }
            Rebalance::Revoke(partitions) => {
                for e in partitions.elements() {
                    fresh.remove(&(e.topic().to_owned(), e.partition()));
                }
            }
            Rebalance::Error(_) => {}
        }
    }
}

impl ClientContext for RequestConsumerContext {
    /// librdkafka's statistics (every `statistics.interval.ms`): the lag of
    /// each assigned partition, as the consumer itself sees it.
    fn stats(&self, statistics: rdkafka::Statistics) {
        for (topic, data) in &statistics.topics {
            for (partition, stats) in &data.partitions {
                // -1 is "unknown" (not assigned, or no offset yet).
                if *partition >= 0 && stats.consumer_lag >= 0 {
                    #[allow(clippy::cast_precision_loss)]
                    metrics::gauge!(
                        "flotilla_consumer_lag",
                        "topic" => topic.clone(),
                        "partition" => partition.to_string(),
                    )
                    .set(stats.consumer_lag as f64);
                }
            }
        }
    }
}

impl ConsumerContext for RequestConsumerContext {
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        self.note_assignment(rebalance);
        // What this worker holds after any kind of rebalance (eager or
        // incremental): a worker holding nothing is idle by assignment.
        if let Ok(assignment) = consumer.assignment() {
            self.show_assignment(&assignment);
        }
        if let (Rebalance::Assign(partitions), true) =
            (rebalance, self.outage.load(Ordering::SeqCst))
        {
            tracing::info!(partitions = %describe(partitions), "assigned during an outage; paused");
            if let Err(e) = consumer.pause(partitions) {
                tracing::warn!(error = %e, "pausing newly assigned partitions failed");
            }
        }
    }

    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(partitions) => {
                tracing::info!(partitions = %describe(partitions), "partitions revoked; committing what is durable");
                match consumer.commit_consumer_state(CommitMode::Async) {
                    Ok(()) => {}
                    // Nothing stored since the last commit.
                    Err(rdkafka::error::KafkaError::ConsumerCommit(
                        rdkafka::types::RDKafkaErrorCode::NoOffset,
                    )) => {}
                    Err(e) => tracing::warn!(error = %e, "commit before revocation failed"),
                }
            }
            Rebalance::Assign(partitions) => {
                tracing::info!(partitions = %describe(partitions), "partitions assigned");
            }
            Rebalance::Error(e) => tracing::error!(error = %e, "rebalance error"),
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        match result {
            Ok(()) => tracing::debug!(offsets = %describe(offsets), "offsets committed"),
            Err(rdkafka::error::KafkaError::ConsumerCommit(
                rdkafka::types::RDKafkaErrorCode::NoOffset,
            )) => {}
            Err(e) => {
                tracing::warn!(error = %e, offsets = %describe(offsets), "offset commit failed")
            }
        }
    }
}

/// `topic/partition@offset, …` for logs.
pub(crate) fn describe(partitions: &TopicPartitionList) -> String {
    partitions
        .elements()
        .iter()
        .map(|e| match e.offset().to_raw() {
            Some(offset) if offset >= 0 => format!("{}/{}@{offset}", e.topic(), e.partition()),
            _ => format!("{}/{}", e.topic(), e.partition()),
        })
        .collect::<Vec<_>>()
        .join(", ")
}
