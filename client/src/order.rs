//! The rules that make a job's events arrive once and in order.
//!
//! Flotilla numbers each job's events 1, 2, 3, … (`sequence`) and publishes
//! them keyed by job id, so one job's events sit in one partition in that
//! order. What can still happen on the way to a consumer:
//!
//! - **a repeat**: a relay that lost its lease, or a producer retry,
//!   publishes an event again, so a sequence already seen comes back, right
//!   after itself or later (an out-of-order duplicate);
//! - **a gap**: a sequence is skipped (a retention pass removed events that
//!   were never published, or a database failover lost them), so the
//!   consumer's picture of the job misses a state change.
//!
//! [`classify`] is the rule on its own, for a consumer that keeps the last
//! applied sequence of each job in its own store; [`JobSequences`] keeps
//! it in memory for [`EventStream`](crate::EventStream).

use std::num::NonZeroUsize;

use lru::LruCache;

use uuid::Uuid;

/// What an event is, given the last sequence applied for its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The next event of the job (or the first one this consumer sees):
    /// apply it.
    Next,
    /// A sequence already applied: drop it.
    Repeat,
    /// Sequences between the last applied and this one never arrived.
    Gap {
        /// The sequence that was expected.
        expected: i64,
        /// The sequence that came.
        got: i64,
    },
}

/// The rule: `sequence` against the last sequence applied for the same job
/// (`None` when none was).
///
/// A job seen for the first time is [`Verdict::Next`] whatever its
/// sequence: a consumer that starts late, or whose group committed past
/// the earlier events, cannot tell a missed event from one it was never
/// meant to see. A consumer that must know starts from the topic's
/// beginning, or keeps what it applied (see the crate's exactly-once
/// example).
#[must_use]
pub fn classify(last_applied: Option<i64>, sequence: i64) -> Verdict {
    match last_applied {
        None => Verdict::Next,
        Some(last) if sequence <= last => Verdict::Repeat,
        Some(last) if sequence == last + 1 => Verdict::Next,
        Some(last) => Verdict::Gap {
            expected: last + 1,
            got: sequence,
        },
    }
}

/// The last sequence delivered per job, and the partition it came from, for
/// at most `capacity` jobs: those heard from longest ago are forgotten
/// first (a least-recently-used cache), so a job still running keeps its
/// place however long ago it began.
///
/// A forgotten job counts as never seen: a repeat of its last event after
/// that is delivered again. The capacity bounds memory (about 70 bytes a
/// job); keep it above the number of jobs whose events can still repeat.
#[derive(Debug)]
pub struct JobSequences {
    last: LruCache<Uuid, (i64, i32)>,
}

impl JobSequences {
    /// Remembers up to `capacity` jobs (at least one).
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        Self {
            last: LruCache::new(NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN)),
        }
    }

    /// Judges `sequence` of `job`, read from `partition`, and, unless it is
    /// a repeat, moves the job's last sequence to it (after a gap the stream
    /// goes on from what came). Any event of a job, a repeat too, makes it
    /// the most recently heard from.
    pub fn observe(&mut self, job: Uuid, sequence: i64, partition: i32) -> Verdict {
        let verdict = classify(self.last.get(&job).map(|&(last, _)| last), sequence);
        if verdict != Verdict::Repeat {
            self.last.put(job, (sequence, partition));
        }
        verdict
    }

    /// Forgets the jobs last read from `partition`: it was taken away, and
    /// what comes of it later (from this member or another, from the
    /// group's last commit) is delivered again rather than judged against
    /// events that may never have been acknowledged.
    pub fn forget_partition(&mut self, partition: i32) {
        let gone: Vec<Uuid> = self
            .last
            .iter()
            .filter(|(_, (_, from))| *from == partition)
            .map(|(&job, _)| job)
            .collect();
        for job in gone {
            self.last.pop(&job);
        }
    }

    /// How many jobs are remembered.
    #[must_use]
    pub fn len(&self) -> usize {
        self.last.len()
    }

    /// Whether no job is remembered.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_sequence_is_applied_and_anything_at_or_below_the_last_is_a_repeat() {
        assert_eq!(classify(None, 7), Verdict::Next);
        assert_eq!(classify(Some(3), 4), Verdict::Next);
        assert_eq!(classify(Some(3), 3), Verdict::Repeat);
        assert_eq!(classify(Some(3), 1), Verdict::Repeat);
        assert_eq!(
            classify(Some(3), 6),
            Verdict::Gap {
                expected: 4,
                got: 6
            }
        );
    }

    #[test]
    fn a_stream_with_repeats_and_a_late_duplicate_yields_each_sequence_once() {
        let mut jobs = JobSequences::new(10);
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let arrivals = [
            (a, 1),
            (a, 2),
            (b, 1),
            (a, 2),
            (a, 3),
            (b, 2),
            (a, 2),
            (b, 1),
        ];
        let applied: Vec<_> = arrivals
            .into_iter()
            .filter(|&(job, sequence)| jobs.observe(job, sequence, 0) == Verdict::Next)
            .collect();
        assert_eq!(applied, [(a, 1), (a, 2), (b, 1), (a, 3), (b, 2)]);
    }

    #[test]
    fn after_a_gap_the_job_goes_on_from_the_sequence_that_came() {
        let mut jobs = JobSequences::new(10);
        let job = Uuid::new_v4();
        assert_eq!(jobs.observe(job, 1, 0), Verdict::Next);
        assert_eq!(
            jobs.observe(job, 4, 0),
            Verdict::Gap {
                expected: 2,
                got: 4
            }
        );
        assert_eq!(jobs.observe(job, 3, 0), Verdict::Repeat);
        assert_eq!(jobs.observe(job, 5, 0), Verdict::Next);
    }

    #[test]
    fn the_jobs_heard_from_longest_ago_are_forgotten_beyond_the_capacity() {
        let mut jobs = JobSequences::new(2);
        let [a, b, c] = [Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4()];
        jobs.observe(a, 1, 0);
        jobs.observe(b, 1, 0);
        jobs.observe(a, 2, 0);
        jobs.observe(c, 1, 0);
        assert_eq!(jobs.len(), 2);
        // `a` was seen first but is still going: `b`, idle since, went.
        assert_eq!(jobs.observe(a, 2, 0), Verdict::Repeat);
        assert_eq!(jobs.observe(c, 1, 0), Verdict::Repeat);
        assert_eq!(jobs.observe(b, 1, 0), Verdict::Next);
    }

    #[test]
    fn the_jobs_of_a_partition_taken_away_are_forgotten_so_their_events_come_again() {
        let mut jobs = JobSequences::new(10);
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        jobs.observe(a, 3, 0);
        jobs.observe(b, 5, 1);
        jobs.forget_partition(0);
        assert_eq!(jobs.len(), 1);
        assert_eq!(
            jobs.observe(a, 3, 0),
            Verdict::Next,
            "read again after a rebalance"
        );
        assert_eq!(jobs.observe(b, 5, 1), Verdict::Repeat);
    }
}
