"""EventStream: workflow-run-events, each job's events once and in order,
offsets committed only past what the caller acknowledged."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set, Tuple

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from .order import JobSequences, Repeat, Skipped
from .wire import NotAnEvent, WorkflowRunEvent, event_from_fields, event_from_json, is_avro

EVENT_TOPIC = "workflow-run-events"


def registry_client(url: Optional[str], config: Optional[Dict[str, Any]] = None) -> Optional[SchemaRegistryClient]:
    """The Schema Registry client for ``url`` (None without one). ``config``
    adds the client's settings: ``basic.auth.user.info`` (``user:secret``)
    for basic authentication, ``ssl.ca.location`` for a private CA,
    ``ssl.certificate.location`` and ``ssl.key.location`` for mutual TLS."""
    if not url:
        return None
    return SchemaRegistryClient({**(config or {}), "url": url})


def _place(value: Optional[int]) -> int:
    """A received record's partition or offset (always set on a record
    that carries no error)."""
    if value is None:
        raise Unavailable("a record without its partition or offset")
    return value


class EventDecoder:
    """Decodes a record of the event topic, Avro (with ``registry_url``) or
    JSON. Raises ``NotAnEvent`` for a record that is no event,
    ``Misconfigured`` for Avro without a registry, ``Unavailable`` when the
    registry cannot answer now."""

    def __init__(self, registry_url: Optional[str] = None, registry_config: Optional[Dict[str, Any]] = None):
        self._registry = registry_client(registry_url, registry_config)
        self._avro = AvroDeserializer(self._registry) if self._registry else None

    def decode(self, message: Message) -> WorkflowRunEvent:
        value = message.value()
        if not value:
            raise NotAnEvent("the record has no value")
        if not is_avro(value):
            return event_from_json(value)
        if self._avro is None or self._registry is None:
            raise Misconfigured("an Avro record, and no registry_url to read it")
        if len(value) < 5:
            raise NotAnEvent("Avro framing shorter than its 5-byte header")
        schema_id = int.from_bytes(value[1:5], "big")
        # Asking the registry is about the world, except a definite "no
        # such schema"; decoding the datum is about the record.
        try:
            self._registry.get_schema(schema_id)
        except SchemaRegistryError as e:
            if e.http_status_code == 404 and e.error_code == 40403:
                raise NotAnEvent(f"the registry has no schema {schema_id}") from None
            raise Unavailable(f"the registry: {e}") from None
        except Exception as e:  # transport errors of the registry's HTTP client
            raise Unavailable(f"the registry: {e}") from None
        try:
            fields = self._avro(value, SerializationContext(message.topic() or "", MessageField.VALUE))
        except Exception as e:  # fastavro raises many kinds for a bad datum
            raise NotAnEvent(f"Avro: {e}") from None
        return event_from_fields(fields, result_is_text=True)


@dataclass(frozen=True)
class Delivery:
    """One event for the caller; pass it to ``EventStream.ack`` once its
    effects are durable."""

    event: WorkflowRunEvent
    partition: int
    offset: int


class StreamError(Exception):
    """Reported instead of an event; the stream goes on after it."""


class Gap(StreamError):
    """Events of a job were skipped. ``delivery`` holds the event that came;
    the stream goes on from it, and it is yours to apply and ack."""

    def __init__(self, delivery: Delivery, expected: int):
        self.delivery, self.expected = delivery, expected
        super().__init__(f"job {delivery.event.job_id}: event {expected} never arrived "
                         f"(event {delivery.event.sequence} did)")


class Undecodable(StreamError):
    """The record is not an event in either encoding and never will be; it
    is skipped (its offset counts as acknowledged)."""

    def __init__(self, partition: int, offset: int, reason: str):
        self.partition, self.offset = partition, offset
        super().__init__(f"the record at partition {partition} offset {offset} is not an event: {reason}")


class Unavailable(StreamError):
    """The broker or the registry could not be used just now; poll again
    (the record in hand is decoded again)."""


class Misconfigured(StreamError):
    """The settings cannot work: an Avro record and no ``registry_url``. The
    record stays in hand, unsettled, until a stream with the registry reads
    it."""


class _Acks:
    """Offsets read and not yet acknowledged, per partition: a partition's
    commit position moves only over a run of acknowledged offsets."""

    def __init__(self) -> None:
        self._outstanding: Dict[int, Set[int]] = {}
        self._next: Dict[int, int] = {}
        self._lock = threading.Lock()

    def read(self, partition: int, offset: int) -> None:
        with self._lock:
            self._outstanding.setdefault(partition, set()).add(offset)
            self._next[partition] = max(self._next.get(partition, 0), offset + 1)

    def ack(self, partition: int, offset: int) -> Optional[int]:
        with self._lock:
            outstanding = self._outstanding.get(partition)
            if outstanding is None or offset not in outstanding:
                return None
            before = min(outstanding)
            outstanding.discard(offset)
            after = min(outstanding) if outstanding else self._next[partition]
            return after if after > before else None

    def forget(self, partition: int) -> None:
        with self._lock:
            self._outstanding.pop(partition, None)
            self._next.pop(partition, None)

    def outstanding(self) -> int:
        with self._lock:
            return sum(len(s) for s in self._outstanding.values())


class EventStream:
    """Consumes the event topic in consumer group ``group`` and yields each
    job's events once, in sequence order, decoding Avro (with
    ``registry_url``) and JSON alike.

    - a repeat (a sequence at or below the last yielded for its job) is
      dropped and counted in ``repeats_dropped``;
    - a skipped sequence raises ``Gap`` carrying the event that came;
    - offsets are stored for commit only up to the first event not yet
      acknowledged and committed every second, on rebalance and on close.

    Repeats are recognised within this process only; across restarts keep
    each job's last applied sequence with your own write (``classify``).
    """

    def __init__(self, bootstrap_servers: str, group: str, registry_url: Optional[str] = None,
                 topic: str = EVENT_TOPIC, start_at: str = "earliest",
                 remember_jobs: int = 100_000, config: Optional[Dict[str, Any]] = None,
                 registry_config: Optional[Dict[str, Any]] = None):
        settings = dict(config or {})
        settings.update({
            "bootstrap.servers": bootstrap_servers,
            "group.id": group,
            "enable.auto.commit": True,
            "enable.auto.offset.store": False,
            "auto.commit.interval.ms": 1000,
            "auto.offset.reset": start_at,
            "isolation.level": "read_committed",
        })
        self._consumer = Consumer(settings)
        self._topic = topic
        self._decoder = EventDecoder(registry_url, registry_config)
        self._jobs = JobSequences(remember_jobs)
        self._acks = _Acks()
        # The record in hand with the revocation count when it was read.
        self._held: Optional[Tuple[Message, int]] = None
        self._revoked: List[int] = []
        self._revocations = 0
        self.repeats_dropped = 0

        def revoked(_consumer: Consumer, partitions: List[TopicPartition]) -> None:
            for partition in partitions:
                self._acks.forget(partition.partition)
                self._revoked.append(partition.partition)
            self._revocations += 1

        self._consumer.subscribe([topic], on_revoke=revoked, on_lost=revoked)

    def poll(self, timeout: float = 1.0) -> Optional[Delivery]:
        """The next event, or None when none came within ``timeout`` seconds.

        Raises ``Gap``, ``Undecodable`` or ``Unavailable``; each is about one
        record or one moment, and the next call goes on."""
        while True:
            if self._held is None:
                message = self._consumer.poll(timeout)
                if message is None:
                    return None
                if message.error():
                    raise Unavailable(str(message.error()))
                self._acks.read(_place(message.partition()), _place(message.offset()))
                self._held = (message, self._revocations)
            message, read_at = self._held
            partition, offset = _place(message.partition()), _place(message.offset())
            # A rebalance since the record was read: its partition is read
            # again from the group's last commit, by whoever holds it now.
            for taken in self._revoked:
                self._jobs.forget_partition(taken)
            self._revoked.clear()
            if read_at != self._revocations:
                self._held = None
                continue
            try:
                event = self._decoder.decode(message)
            except (Unavailable, Misconfigured):
                raise  # the record stays in hand
            except NotAnEvent as e:
                self._held = None
                self._settle(partition, offset)
                raise Undecodable(partition, offset, str(e)) from None
            self._held = None
            delivery = Delivery(event=event, partition=partition, offset=offset)
            verdict = self._jobs.observe(event.job_id, event.sequence, partition)
            if isinstance(verdict, Repeat):
                self.repeats_dropped += 1
                self._settle(partition, offset)
                continue
            if isinstance(verdict, Skipped):
                raise Gap(delivery, verdict.expected)
            return delivery

    def ack(self, delivery: Delivery) -> None:
        """``delivery``'s effects are durable: its offset, and every offset
        before it that is also done, may be committed."""
        self._settle(delivery.partition, delivery.offset)

    def _settle(self, partition: int, offset: int) -> None:
        position = self._acks.ack(partition, offset)
        if position is None:
            return
        try:
            self._consumer.store_offsets(offsets=[TopicPartition(self._topic, partition, position)])
        except KafkaException:
            # Only for a partition this member no longer holds: its next
            # member reads from the group's last commit.
            pass

    def commit(self) -> None:
        """Commits what was acknowledged now, waiting for the broker."""
        try:
            self._consumer.commit(asynchronous=False)
        except KafkaException as e:
            if e.args[0].code() != -168:  # _NO_OFFSET: nothing new acknowledged
                raise Unavailable(f"committing: {e}") from None

    def outstanding(self) -> int:
        """Events read and not yet acknowledged."""
        return self._acks.outstanding()

    def close(self) -> None:
        """Leaves the group, committing what was acknowledged."""
        self._consumer.close()

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
