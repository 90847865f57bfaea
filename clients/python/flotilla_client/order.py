"""The rules that make a job's events arrive once and in order.

Flotilla numbers each job's events 1, 2, 3, ... (``sequence``) and keys
them by job id, so one job's events sit in one partition in order. On the
way to a consumer an event can still come twice (a relay that lost its
lease publishes again; the second copy may arrive later than newer events),
or a sequence can be skipped (events lost in a database failover). The
rule: apply the next sequence, drop anything at or below the last applied,
report a jump.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional, Tuple, Union
from uuid import UUID


class Next:
    """Apply it: the job's next event, or the first one this consumer sees."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Next)

    def __repr__(self) -> str:
        return "Next()"


class Repeat:
    """Drop it: a sequence already applied."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Repeat)

    def __repr__(self) -> str:
        return "Repeat()"


@dataclass(frozen=True)
class Skipped:
    """Sequences between the last applied and ``got`` never arrived."""

    expected: int
    got: int


Verdict = Union[Next, Repeat, Skipped]


def classify(last_applied: Optional[int], sequence: int) -> Verdict:
    """Judges ``sequence`` against the last sequence applied for its job.

    A job seen for the first time is ``Next`` whatever its sequence: a
    consumer that starts late cannot tell a missed event from one it was
    never meant to see. Keep what you applied (see the exactly-once
    example) when you must know.
    """
    if last_applied is None:
        return Next()
    if sequence <= last_applied:
        return Repeat()
    if sequence == last_applied + 1:
        return Next()
    return Skipped(expected=last_applied + 1, got=sequence)


class JobSequences:
    """The last sequence delivered per job and the partition it came from,
    for at most ``capacity`` jobs (those first seen longest ago are
    forgotten first; a forgotten job counts as never seen)."""

    def __init__(self, capacity: int = 100_000):
        self._last: OrderedDict[UUID, Tuple[int, int]] = OrderedDict()
        self._capacity = max(1, capacity)

    def observe(self, job_id: UUID, sequence: int, partition: int = 0) -> Verdict:
        """Judges the event and, unless it is a repeat, moves the job on to it."""
        last = self._last.get(job_id)
        verdict = classify(None if last is None else last[0], sequence)
        if not isinstance(verdict, Repeat):
            known = job_id in self._last
            self._last[job_id] = (sequence, partition)
            if not known:
                while len(self._last) > self._capacity:
                    self._last.popitem(last=False)
        return verdict

    def forget_partition(self, partition: int) -> None:
        """Forgets the jobs last read from ``partition``: it was taken away,
        and what comes of it later is delivered again rather than judged
        against events that may never have been acknowledged."""
        for job_id in [job for job, (_, p) in self._last.items() if p == partition]:
            del self._last[job_id]

    def __len__(self) -> int:
        return len(self._last)
