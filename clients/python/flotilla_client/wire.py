"""The contract's messages as typed values, and their two encodings.

Flotilla writes JSON when no Schema Registry is configured and
Confluent-framed Avro (a zero byte, a 4-byte schema id, the datum) when one
is; a reader takes either, told apart by the first byte. The Avro schemas
are the repository's ``contracts/schemas`` (shipped inside this package).
"""

from __future__ import annotations

import enum
import json
import pathlib
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Dict, Optional
from uuid import UUID

SCHEMAS = pathlib.Path(__file__).resolve().parent / "schemas"


def schema_text(name: str) -> str:
    """The ``.avsc`` text of a contract message, e.g. ``WorkflowRunEvent``."""
    return (SCHEMAS / f"{name}.avsc").read_text()


class EventType(str, enum.Enum):
    ACCEPTED = "ACCEPTED"
    STEP_CHECKPOINT = "STEP_CHECKPOINT"
    WAITING = "WAITING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    DEAD = "DEAD"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        """The job has ended (an operator may still retry a FAILED, DEAD or
        CANCELLED job, which then publishes more events)."""
        return self in (EventType.COMPLETED, EventType.FAILED, EventType.DEAD, EventType.CANCELLED)


@dataclass(frozen=True)
class WorkflowRunEvent:
    """One committed state change of a job."""

    event_id: UUID
    job_id: UUID
    sequence: int
    type: EventType
    workflow_name: str
    attempt: int
    occurred_at: datetime
    step_name: Optional[str] = None
    verdict: Optional[str] = None
    error: Optional[str] = None
    result: Any = None
    #: The version of the workflow the job runs; None from relays older
    #: than the field, and for a job that keeps its own definition.
    workflow_version: Optional[int] = None
    #: The job's labels, as its request gave them; None for none.
    metadata: Optional[Dict[str, str]] = None


class NotAnEvent(ValueError):
    """Bytes that are not a WorkflowRunEvent in either encoding."""


def is_avro(value: bytes) -> bool:
    """Confluent framing starts with a zero byte; JSON with ``{``."""
    return value[:1] == b"\x00"


def _text(fields: Dict[str, Any], name: str, optional: bool = False) -> Optional[str]:
    value = fields.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str) or (not optional and not value.strip()):
        raise NotAnEvent(f"{name}: expected text, got {value!r}")
    return value


def _required_text(fields: Dict[str, Any], name: str) -> str:
    value = _text(fields, name)
    assert value is not None  # _text refuses an absent required field
    return value


def _integer(fields: Dict[str, Any], name: str) -> int:
    value = fields.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise NotAnEvent(f"{name}: expected an integer, got {value!r}")
    return value


def _uuid(fields: Dict[str, Any], name: str) -> UUID:
    value = fields.get(name)
    if isinstance(value, UUID):
        parsed = value
    else:
        try:
            parsed = UUID(str(value))
        except ValueError:
            raise NotAnEvent(f"{name}: not a UUID: {value!r}") from None
    if parsed.int == 0:
        raise NotAnEvent(f"{name}: the nil UUID")
    return parsed


def event_from_fields(fields: Any, result_is_text: bool) -> WorkflowRunEvent:
    """Builds an event from decoded fields, checking what the contract
    promises (ids, a sequence from 1, a known type). Avro carries the
    result as JSON text (``result_is_text``), JSON as a document."""
    if not isinstance(fields, dict):
        raise NotAnEvent(f"expected an object, got {type(fields).__name__}")
    try:
        event_type = EventType(fields.get("type"))
    except ValueError:
        raise NotAnEvent(f"type: not an event type: {fields.get('type')!r}") from None
    sequence = _integer(fields, "sequence")
    if sequence < 1:
        raise NotAnEvent(f"sequence: {sequence} is below 1")
    occurred_at = fields.get("occurred_at")
    if isinstance(occurred_at, str):
        try:
            occurred_at = datetime.fromisoformat(occurred_at.replace("Z", "+00:00"))
        except ValueError:
            raise NotAnEvent(f"occurred_at: not a time: {occurred_at!r}") from None
    if not isinstance(occurred_at, datetime):
        raise NotAnEvent(f"occurred_at: expected a time, got {occurred_at!r}")
    result = fields.get("result")
    if result_is_text and result is not None:
        try:
            result = json.loads(result)
        except (TypeError, ValueError):
            raise NotAnEvent("result: not a JSON document") from None
    return WorkflowRunEvent(
        event_id=_uuid(fields, "event_id"),
        job_id=_uuid(fields, "job_id"),
        sequence=sequence,
        type=event_type,
        workflow_name=_required_text(fields, "workflow_name"),
        attempt=_integer(fields, "attempt"),
        occurred_at=occurred_at.astimezone(timezone.utc),
        step_name=_text(fields, "step_name", optional=True),
        verdict=_text(fields, "verdict", optional=True),
        error=_text(fields, "error", optional=True),
        result=result,
        workflow_version=_optional_version(fields),
        metadata=_optional_metadata(fields),
    )


def _optional_metadata(fields: Dict[str, Any]) -> Optional[Dict[str, str]]:
    value: object = fields.get("metadata")
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in value.items()):
        raise NotAnEvent(f"metadata: expected an object of strings, got {value!r}")
    return dict(value)


def _optional_version(fields: Dict[str, Any]) -> Optional[int]:
    value: object = fields.get("workflow_version")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise NotAnEvent(f"workflow_version: expected a version from 1, got {value!r}")
    return value


def event_from_json(value: bytes) -> WorkflowRunEvent:
    try:
        fields = json.loads(value)
    except (UnicodeDecodeError, ValueError) as e:
        raise NotAnEvent(f"not JSON: {e}") from None
    return event_from_fields(fields, result_is_text=False)


def _common_fields(event: WorkflowRunEvent) -> Dict[str, Any]:
    return {
        "event_id": str(event.event_id),
        "job_id": str(event.job_id),
        "sequence": event.sequence,
        "type": event.type.value,
        "workflow_name": event.workflow_name,
        "attempt": event.attempt,
        "step_name": event.step_name,
        "verdict": event.verdict,
        "error": event.error,
        "workflow_version": event.workflow_version,
        "metadata": event.metadata,
    }


def event_to_json(event: WorkflowRunEvent) -> bytes:
    """The JSON encoding (as a fleet without a registry writes it)."""
    at = event.occurred_at.astimezone(timezone.utc).isoformat(timespec="microseconds")
    document = dict(_common_fields(event), result=event.result, occurred_at=at.replace("+00:00", "Z"))
    return json.dumps(document).encode()


def event_to_avro_fields(event: WorkflowRunEvent) -> Dict[str, Any]:
    """The fields an Avro serializer of ``WorkflowRunEvent.avsc`` takes (the
    result as JSON text, the time as a datetime)."""
    result = None if event.result is None else json.dumps(event.result)
    return dict(_common_fields(event), result=result, occurred_at=event.occurred_at)
