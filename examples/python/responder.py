"""A service that answers Flotilla's Kafka-target steps.

A workflow step whose target is `kind: kafka` sends a WorkflowStepRequest to
the target's request topic (published by the relay, keyed by job id) and
waits for a WorkflowStepReply on the request's `reply_topic` naming the same
`correlation_id`. This responder reads the requests, works out an answer
and replies, in the encoding the fleet uses: Avro through the Schema
Registry (the contract's schemas, subjects `<topic>-value`) when
`--registry` is given, JSON otherwise. It reads both.

Delivery: the reply is acknowledged by the broker before the request's
offset is committed, so every request is answered at least once. A repeated
reply is harmless (Flotilla keeps the first); a service whose work has side
effects does it once per `idempotency_key` (`<job_id>:<step>`, the same for
every attempt).

    python responder.py --bootstrap 127.0.0.1:9092 --requests fraud-requests \
        [--registry http://127.0.0.1:8081] [--group fraud-model] [--max N]
"""

import argparse
import json
import pathlib
import sys

from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

# The contract's schemas, as the repository holds them.
SCHEMAS = pathlib.Path(__file__).resolve().parents[2] / "contracts" / "schemas"


def answer(request: dict) -> dict:
    """The work: a fraud score from the amount the step's rules sent."""
    amount = int(request.get("amount", 0))
    return {"risk": (amount % 100) / 100, "model": "python-example"}


class Wire:
    """Decodes requests and encodes replies: Avro with a registry, else JSON."""

    def __init__(self, registry_url):
        self.registry = SchemaRegistryClient({"url": registry_url}) if registry_url else None
        if self.registry:
            reply_schema = (SCHEMAS / "WorkflowStepReply.avsc").read_text()
            self.read_avro = AvroDeserializer(self.registry)
            self.write_avro = AvroSerializer(self.registry, reply_schema)

    def request(self, message) -> dict:
        value = message.value()
        # Confluent framing starts with a zero byte; JSON with "{".
        if value[:1] == b"\x00":
            if not self.registry:
                raise ValueError("an Avro request, and no --registry to read it")
            context = SerializationContext(message.topic(), MessageField.VALUE)
            request = self.read_avro(value, context)
            request["request"] = json.loads(request["request"])
            return request
        return json.loads(value)

    def reply(self, topic: str, reply: dict) -> bytes:
        if self.registry:
            avro = dict(reply, result=json.dumps(reply["result"]) if reply["result"] is not None else None)
            return self.write_avro(avro, SerializationContext(topic, MessageField.VALUE))
        return json.dumps({k: v for k, v in reply.items() if v is not None}).encode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--requests", required=True, help="the target's request_topic")
    parser.add_argument("--registry", help="Schema Registry URL (Avro); unset: JSON")
    parser.add_argument("--group", default="flotilla-example-responder")
    parser.add_argument("--max", type=int, help="stop after answering this many")
    args = parser.parse_args()

    wire = Wire(args.registry)
    consumer = Consumer({
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    producer = Producer({"bootstrap.servers": args.bootstrap, "enable.idempotence": True})
    consumer.subscribe([args.requests])
    print(f"responder: answering step requests on {args.requests}", flush=True)
    answered = 0
    try:
        while args.max is None or answered < args.max:
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error():
                print(f"responder: {message.error()}", file=sys.stderr, flush=True)
                continue
            try:
                request = wire.request(message)
            except Exception as e:  # not a request this service can read
                print(f"responder: skipping a record that is not a step request: {e}", file=sys.stderr, flush=True)
                consumer.commit(message=message, asynchronous=False)
                continue
            reply = {
                "correlation_id": str(request["correlation_id"]),
                "job_id": str(request["job_id"]),
                "result": answer(request["request"]),
                "error": None,
                "retryable": False,
            }
            topic = request["reply_topic"]
            producer.produce(topic, key=reply["job_id"], value=wire.reply(topic, reply))
            # Acknowledged before the request's offset is committed.
            if producer.flush(30) != 0:
                raise RuntimeError("the reply was not acknowledged within 30 s")
            consumer.commit(message=message, asynchronous=False)
            answered += 1
            print(f"responder: answered {request['step_name']} of job {reply['job_id']} "
                  f"(correlation id {reply['correlation_id']})", flush=True)
    finally:
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
