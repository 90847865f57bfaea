"""Waiting for a job's end, for ``submit_and_wait``: the job's result, or an
exception saying how else it ended.

Through the API the wait is a series of long polls (``Prefer: wait`` on
the submission, then ``GET /v1/jobs/{id}?wait=``), each answered by the
fleet the moment the job ends. Through Kafka the end is read from the event
topic by one reader per submitter (``EndsReader``): a consumer assigned
every partition at its end as it was when the reader started, with no
consumer group and nothing committed; a wait registers before its request
is produced, so the end cannot slip past it."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

from confluent_kafka import Consumer, KafkaException, TopicPartition

from .events import EventDecoder, StreamError
from .wire import NotAnEvent

#: The longest single question to the API: below its default request
#: timeout (30 s), which would answer a longer one 503.
LONGEST_POLL = 25.0
#: The pause before asking again after the API could not be reached.
RETRY_PAUSE = 0.5


class JobNotCompleted(Exception):
    """The job waited on gave no result; ``job_id`` says which."""

    def __init__(self, job_id: uuid.UUID, message: str):
        super().__init__(message)
        self.job_id = job_id


class JobFailed(JobNotCompleted):
    """The job FAILED: its input, its definition or a step's final answer."""

    def __init__(self, job_id: uuid.UUID, error: str):
        super().__init__(job_id, f"job {job_id} failed: {error}")
        self.error = error


class JobDead(JobNotCompleted):
    """The job went DEAD: a step ran out of attempts."""

    def __init__(self, job_id: uuid.UUID, error: str):
        super().__init__(job_id, f"job {job_id} is dead: {error}")
        self.error = error


class JobCancelled(JobNotCompleted):
    """The job was CANCELLED."""

    def __init__(self, job_id: uuid.UUID, reason: str):
        super().__init__(job_id, f"job {job_id} was cancelled: {reason}")
        self.reason = reason


class WaitTimedOut(JobNotCompleted):
    """The wait ran out before the job finished; it may still finish.
    ``last_error``: why the fleet could not be asked, when that was why."""

    def __init__(self, job_id: uuid.UUID, last_error: Optional[str] = None):
        detail = f" ({last_error})" if last_error else ""
        super().__init__(job_id, f"job {job_id} did not finish within the wait{detail}")
        self.last_error = last_error


#: A job's end before it is typed: (status, result, error).
End = Tuple[str, Any, Optional[str]]

_ENDED = ("COMPLETED", "FAILED", "DEAD", "CANCELLED")


def outcome(job_id: uuid.UUID, end: End) -> Any:
    """The result of a COMPLETED job, or its end raised."""
    status, result, error = end
    if status == "COMPLETED":
        return result
    if status == "FAILED":
        raise JobFailed(job_id, error or "")
    if status == "DEAD":
        raise JobDead(job_id, error or "")
    if status == "CANCELLED":
        raise JobCancelled(job_id, error or "")
    raise ValueError(f"not an end: {status}")


def end_of_view(job: Any) -> Optional[End]:
    """The end a job's API view states, or None while it runs."""
    if not isinstance(job, dict) or job.get("status") not in _ENDED:
        return None
    return job["status"], job.get("result"), job.get("error")


def poll_until_ended(jobs_url: str, token: Optional[str], job_id: uuid.UUID, deadline: float,
                     classify_http_error: Callable[[str, urllib.error.HTTPError], Any]) -> End:
    """Asks for the job with ``?wait=`` until it has ended or ``deadline``
    (a ``time.monotonic()`` instant) passes. An API that cannot be reached
    is asked again; one that refuses the question ends the wait with that
    refusal (``classify_http_error`` turns it into the submitter's error)."""
    url = f"{jobs_url}/{job_id}"
    headers = {"authorization": f"Bearer {token}"} if token else {}
    last_error = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise WaitTimedOut(job_id, last_error)
        wait = min(left, LONGEST_POLL)
        call = urllib.request.Request(f"{url}?wait={int(wait * 1000)}ms", headers=headers)
        try:
            with urllib.request.urlopen(call, timeout=wait + 30.0) as response:
                end = end_of_view(json.loads(response.read()))
            if end is not None:
                return end
            continue
        except urllib.error.HTTPError as e:
            failure = classify_http_error(url, e)
            if not failure.retryable:
                raise failure from None
            last_error = str(failure)
        except (urllib.error.URLError, OSError, ValueError) as e:
            last_error = f"{url}: {e}"
        time.sleep(min(RETRY_PAUSE, max(0.0, deadline - time.monotonic())))


class _Watch:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.end: Optional[End] = None


class EndsReader:
    """Reads the event topic from its end on a thread of its own and hands
    each terminal event of a job waited on to its waiters."""

    def __init__(self, bootstrap_servers: str, registry_url: Optional[str], topic: str,
                 config: Optional[Dict[str, Any]] = None,
                 registry_config: Optional[Dict[str, Any]] = None):
        settings = dict(config or {})
        settings.update({
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"flotilla-client-ends-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        })
        self._consumer = Consumer(settings)
        try:
            metadata = self._consumer.list_topics(topic, timeout=10)
            partitions = [p for p in metadata.topics[topic].partitions] if topic in metadata.topics else []
            if not partitions or metadata.topics[topic].error is not None:
                raise StreamError(f"the event topic {topic} has no partitions the broker shows")
            assignment = []
            for partition in partitions:
                _, high = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                assignment.append(TopicPartition(topic, partition, high))
            self._consumer.assign(assignment)
        except KafkaException as e:
            self._consumer.close()
            raise StreamError(f"reading the ends of {topic}: {e}") from None
        except StreamError:
            self._consumer.close()
            raise
        self._decoder = EventDecoder(registry_url, registry_config)
        self._lock = threading.Lock()
        self._watches: Dict[uuid.UUID, List[_Watch]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="flotilla-ends", daemon=True)
        self._thread.start()

    def watch(self, job_id: uuid.UUID) -> _Watch:
        watch = _Watch()
        with self._lock:
            self._watches.setdefault(job_id, []).append(watch)
        return watch

    def wait(self, job_id: uuid.UUID, watch: _Watch, deadline: float) -> End:
        if not watch.done.wait(max(0.0, deadline - time.monotonic())):
            with self._lock:
                left = [w for w in self._watches.get(job_id, []) if w is not watch]
                if left:
                    self._watches[job_id] = left
                else:
                    self._watches.pop(job_id, None)
            raise WaitTimedOut(job_id)
        assert watch.end is not None
        return watch.end

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _read(self) -> None:
        try:
            while not self._stop.is_set():
                message = self._consumer.poll(0.5)
                if message is None or message.error():
                    continue
                try:
                    event = self._decoder.decode(message)
                except (NotAnEvent, StreamError):
                    # No event, or the registry is out: another job's
                    # record must not end this reader; a wait runs out.
                    continue
                if not event.type.is_terminal:
                    continue
                end = (event.type.value, event.result, event.error)
                with self._lock:
                    watches = self._watches.pop(event.job_id, [])
                for watch in watches:
                    watch.end = end
                    watch.done.set()
        finally:
            self._consumer.close()


__all__ = ["EndsReader", "JobCancelled", "JobDead", "JobFailed", "JobNotCompleted",
           "WaitTimedOut", "end_of_view", "outcome", "poll_until_ended"]
