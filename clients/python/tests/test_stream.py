"""EventStream against the real broker and registry, with events written
into a topic of the test's own: repeats, a late duplicate, a gap, and the
two encodings."""

import time
import uuid
from dataclasses import replace
from datetime import datetime, timezone

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from flotilla_client import (EventStream, EventType, Gap, Misconfigured, StreamUnavailable, Undecodable,
                             WorkflowRunEvent, event_to_avro_fields, event_to_json)
from flotilla_client.wire import schema_text

from conftest import new_topic

DEADLINE = 60.0


def event(job_id, sequence, kind=EventType.STEP_CHECKPOINT, event_id=None, result=None):
    return WorkflowRunEvent(
        event_id=event_id or uuid.uuid4(), job_id=job_id, sequence=sequence, type=kind,
        workflow_name="shipping", attempt=1,
        occurred_at=datetime(2026, 12, 4, 21, 0, sequence, 123456, tzinfo=timezone.utc),
        step_name=None if kind != EventType.STEP_CHECKPOINT else f"step-{sequence}",
        result=result)


class Writer:
    """Writes events keyed by job id, as the relay does, in either encoding."""

    def __init__(self, services, topic):
        self.topic = topic
        self.producer = Producer({"bootstrap.servers": services.bootstrap, "partitioner": "consistent_random"})
        self.avro = AvroSerializer(SchemaRegistryClient({"url": services.registry}), schema_text("WorkflowRunEvent"))

    def write(self, events, avro=False):
        for e in events:
            value = (self.avro(event_to_avro_fields(e), SerializationContext(self.topic, MessageField.VALUE))
                     if avro else event_to_json(e))
            self.producer.produce(self.topic, key=str(e.job_id), value=value)
        assert self.producer.flush(30) == 0, "the broker did not take the events"

    def write_raw(self, key, value):
        self.producer.produce(self.topic, key=key, value=value)
        assert self.producer.flush(30) == 0


def read(stream, count, gaps=None, undecodable=None):
    """Reads `count` deliveries (gaps and undecodable records noted aside),
    acknowledging each, within the deadline."""
    got, deadline = [], time.monotonic() + DEADLINE
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count} events within {DEADLINE} s: {got}"
        try:
            delivery = stream.poll(0.5)
        except Gap as e:
            assert gaps is not None, f"an unexpected gap: {e}"
            gaps.append(e)
            delivery = e.delivery
        except Undecodable as e:
            assert undecodable is not None, f"an unexpected undecodable record: {e}"
            undecodable.append(e)
            continue
        except StreamUnavailable as e:
            print(f"unavailable: {e}")
            continue
        if delivery is not None:
            got.append(delivery.event)
            stream.ack(delivery)
    return got


def test_repeats_and_a_late_duplicate_are_dropped_and_each_event_comes_once_in_order(services, topic):
    writer = Writer(services, topic)
    a, b = uuid.uuid4(), uuid.uuid4()
    a1, a2, a3, a4 = (event(a, n) for n in range(1, 5))
    b1, b2 = event(b, 1, EventType.ACCEPTED), event(b, 2, EventType.COMPLETED, result={"ok": True})
    # a2 straight after itself, a2 again after a3 (out of order), b1 late.
    writer.write([a1, a2, a2, b1, a3, a2, b2, a4, b1])
    with EventStream(services.bootstrap, f"g-{uuid.uuid4().hex}", registry_url=services.registry,
                     topic=topic) as stream:
        got = read(stream, 6)
        assert [(e.job_id, e.sequence) for e in got if e.job_id == a] == [(a, 1), (a, 2), (a, 3), (a, 4)]
        assert [(e.job_id, e.sequence) for e in got if e.job_id == b] == [(b, 1), (b, 2)]
        assert got.count(a2) == 1
        # Nothing more comes: the three repeats were dropped, not delayed.
        assert stream.poll(2.0) is None
        assert stream.repeats_dropped == 3
        assert stream.outstanding() == 0


def test_a_skipped_sequence_is_reported_with_the_event_that_came(services, topic):
    writer = Writer(services, topic)
    job = uuid.uuid4()
    writer.write([event(job, 1), event(job, 2), event(job, 5), event(job, 6)])
    gaps = []
    with EventStream(services.bootstrap, f"g-{uuid.uuid4().hex}", topic=topic) as stream:
        got = read(stream, 4, gaps=gaps)
    assert [e.sequence for e in got] == [1, 2, 5, 6]
    assert len(gaps) == 1
    assert (gaps[0].expected, gaps[0].delivery.event.sequence) == (3, 5)


def test_an_avro_and_a_json_event_decode_to_the_same_typed_value(services, topic):
    # The same event in each encoding, on a topic each (on one topic the
    # second copy would be dropped as a repeat).
    json_topic = new_topic(services)
    job = uuid.uuid4()
    done = replace(event(job, 1, EventType.COMPLETED, result={"total": 12.5, "items": ["a", "b"], "note": None}),
                   workflow_version=4)
    Writer(services, topic).write([done], avro=True)
    Writer(services, json_topic).write([done], avro=False)
    decoded = []
    for name in (topic, json_topic):
        with EventStream(services.bootstrap, f"g-{uuid.uuid4().hex}", registry_url=services.registry,
                         topic=name) as stream:
            decoded.append(read(stream, 1)[0])
    assert decoded[0] == decoded[1] == done
    assert decoded[0].result == {"total": 12.5, "items": ["a", "b"], "note": None}
    assert decoded[0].workflow_version == 4


def test_a_record_that_is_not_an_event_is_reported_and_does_not_stall_the_partition(services, topic):
    writer = Writer(services, topic)
    job = uuid.uuid4()
    writer.write([event(job, 1)])
    writer.write_raw(str(job), b'{"job_id": "not a uuid"}')
    # Avro framing naming a schema id the registry does not have.
    writer.write_raw(str(job), b"\x00\x7f\xff\xff\x01garbage")
    writer.write([event(job, 2)])
    undecodable = []
    with EventStream(services.bootstrap, f"g-{uuid.uuid4().hex}", registry_url=services.registry,
                     topic=topic) as stream:
        got = read(stream, 2, undecodable=undecodable)
        assert [e.sequence for e in got] == [1, 2]
        assert len(undecodable) == 2
        assert stream.outstanding() == 0


def test_an_avro_record_read_without_a_registry_is_misconfigured_and_not_committed(services, topic):
    writer = Writer(services, topic)
    done = event(uuid.uuid4(), 1)
    writer.write([done], avro=True)
    group = f"g-{uuid.uuid4().hex}"
    with EventStream(services.bootstrap, group, topic=topic) as blind:
        deadline = time.monotonic() + DEADLINE
        failures = 0
        while failures < 2:
            assert time.monotonic() < deadline, "the record never came"
            try:
                assert blind.poll(0.5) is None
            except Misconfigured:
                failures += 1
                assert blind.outstanding() == 1, "the record stays in hand, unsettled"
        blind.commit()
    with EventStream(services.bootstrap, group, registry_url=services.registry, topic=topic) as seeing:
        assert read(seeing, 1) == [done], "the record was not committed past"
