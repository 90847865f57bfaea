//! Which partition of the event topic a job's events go to: the CRC32 of
//! the key (the job id) modulo the partition count the relays recorded
//! (`event_topic`, read by the partition guard), chosen here rather than
//! by the producer. The producer's own partitioner divides by the count in
//! its metadata, which follows the broker: after partitions were added, a
//! refresh of it would send a job's next event to another partition than
//! its earlier ones before any check could stop it. Here the mapping
//! changes only when an operator accepts the new count.
//!
//! The hash is librdkafka's `consistent_random` partitioner's (CRC32 with
//! the IEEE polynomial, the producers' pinned partitioner), so a topic the
//! relays published to before keeps every job's partition.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

/// The partition of `key` among `partitions` (at least one), as
/// librdkafka's `consistent_random` partitioner picks it for a non-empty
/// key. (Every event has one: the job id.)
#[must_use]
pub fn partition_for(key: &[u8], partitions: i32) -> i32 {
    let count = u32::try_from(partitions.max(1)).unwrap_or(1);
    i32::try_from(crc32fast::hash(key) % count).unwrap_or(0)
}

/// The event topic's recorded partition count as this relay last read it:
/// set by the partition guard, read by the publisher for each record.
#[derive(Debug, Clone, Default)]
pub struct RecordedCount(Arc<AtomicI32>);

impl RecordedCount {
    /// The count, once a check has read it (none before).
    #[must_use]
    pub fn get(&self) -> Option<i32> {
        Some(self.0.load(Ordering::SeqCst)).filter(|count| *count > 0)
    }

    pub(crate) fn set(&self, count: i32) {
        self.0.store(count, Ordering::SeqCst);
    }

    /// The partition of `key` under the recorded count, once known.
    #[must_use]
    pub fn partition_of(&self, key: &[u8]) -> Option<i32> {
        self.get().map(|count| partition_for(key, count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRC32 (IEEE)'s check value: the hash is the one librdkafka's
    /// `rd_crc32` computes (where the broker put keyed records is compared
    /// in relay/tests/relay/partitions.rs).
    #[test]
    fn the_hash_is_crc32_with_the_ieee_polynomial() {
        assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
        assert_eq!(
            partition_for(b"123456789", 7),
            i32::try_from(0xCBF4_3926_u32 % 7).unwrap()
        );
    }

    #[test]
    fn a_key_maps_below_the_count_and_no_count_maps_nothing() {
        for partitions in 1..=16 {
            let p = partition_for(b"0b9e8f56-5bde-4a43-9c1e-6b0e9a4c1f2d", partitions);
            assert!((0..partitions).contains(&p), "{p} of {partitions}");
        }
        let unknown = RecordedCount::default();
        assert_eq!(unknown.partition_of(b"job"), None);
        unknown.set(4);
        assert_eq!(unknown.partition_of(b"job"), Some(partition_for(b"job", 4)));
    }
}
