"""The repeat and gap rules on their own."""

import uuid

from flotilla_client import JobSequences, Next, Repeat, Skipped, classify


def test_the_next_sequence_is_applied_and_anything_at_or_below_the_last_is_a_repeat():
    assert classify(None, 7) == Next()
    assert classify(3, 4) == Next()
    assert classify(3, 3) == Repeat()
    assert classify(3, 1) == Repeat()
    assert classify(3, 6) == Skipped(expected=4, got=6)


def test_after_a_gap_the_job_goes_on_from_the_sequence_that_came():
    jobs = JobSequences()
    job = uuid.uuid4()
    assert jobs.observe(job, 1) == Next()
    assert jobs.observe(job, 4) == Skipped(expected=2, got=4)
    assert jobs.observe(job, 3) == Repeat()
    assert jobs.observe(job, 5) == Next()


def test_the_jobs_seen_longest_ago_are_forgotten_beyond_the_capacity():
    jobs = JobSequences(capacity=2)
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    jobs.observe(a, 1)
    jobs.observe(b, 1)
    jobs.observe(a, 2)
    jobs.observe(c, 1)
    assert len(jobs) == 2
    assert jobs.observe(a, 2) == Next(), "a was seen first, so it was forgotten"
    assert jobs.observe(c, 1) == Repeat()


def test_the_jobs_of_a_partition_taken_away_are_forgotten_so_their_events_come_again():
    jobs = JobSequences()
    a, b = uuid.uuid4(), uuid.uuid4()
    jobs.observe(a, 3, partition=0)
    jobs.observe(b, 5, partition=1)
    jobs.forget_partition(0)
    assert len(jobs) == 1
    assert jobs.observe(a, 3, partition=0) == Next(), "read again after a rebalance"
    assert jobs.observe(b, 5, partition=1) == Repeat()
