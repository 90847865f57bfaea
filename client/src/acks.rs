//! Which offsets may be committed: per partition, everything below the
//! first offset read and not yet acknowledged.
//!
//! A caller may acknowledge out of order (it handles events concurrently);
//! a partition's commit position only moves over a run of acknowledged
//! offsets, so nothing unacknowledged is ever committed past.

use std::collections::{BTreeSet, HashMap};

/// Offsets read and not yet acknowledged, per partition.
#[derive(Debug, Default)]
pub(crate) struct Acks {
    partitions: HashMap<i32, Partition>,
}

#[derive(Debug, Default)]
struct Partition {
    outstanding: BTreeSet<i64>,
    /// The offset after the highest one read.
    next: i64,
}

impl Partition {
    /// The position to commit: the first offset still outstanding, or the
    /// one after the last read.
    fn position(&self) -> i64 {
        self.outstanding.first().copied().unwrap_or(self.next)
    }
}

impl Acks {
    /// `offset` of `partition` was read and is now outstanding.
    pub(crate) fn read(&mut self, partition: i32, offset: i64) {
        let entry = self.partitions.entry(partition).or_default();
        entry.outstanding.insert(offset);
        entry.next = entry.next.max(offset + 1);
    }

    /// `offset` of `partition` is done. Returns the partition's new commit
    /// position when it moved.
    pub(crate) fn ack(&mut self, partition: i32, offset: i64) -> Option<i64> {
        let entry = self.partitions.get_mut(&partition)?;
        let before = entry.position();
        if !entry.outstanding.remove(&offset) {
            return None;
        }
        let after = entry.position();
        (after > before).then_some(after)
    }

    /// The partition was taken away: what was outstanding of it is
    /// another member's to read again.
    pub(crate) fn forget(&mut self, partition: i32) {
        self.partitions.remove(&partition);
    }

    /// How many offsets are outstanding, over every partition.
    pub(crate) fn outstanding(&self) -> usize {
        self.partitions.values().map(|p| p.outstanding.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_position_moves_only_over_a_run_of_acknowledged_offsets() {
        let mut acks = Acks::default();
        for offset in 10..14 {
            acks.read(0, offset);
        }
        assert_eq!(acks.ack(0, 12), None, "10 and 11 are still outstanding");
        assert_eq!(acks.ack(0, 11), None);
        assert_eq!(acks.ack(0, 10), Some(13), "10, 11 and 12 are done");
        assert_eq!(acks.ack(0, 13), Some(14));
        assert_eq!(acks.outstanding(), 0);
    }

    #[test]
    fn an_offset_acknowledged_twice_or_of_a_forgotten_partition_moves_nothing() {
        let mut acks = Acks::default();
        acks.read(1, 5);
        acks.read(2, 7);
        assert_eq!(acks.ack(1, 5), Some(6));
        assert_eq!(acks.ack(1, 5), None);
        acks.forget(2);
        assert_eq!(acks.ack(2, 7), None);
        assert_eq!(acks.outstanding(), 0);
    }
}
