"""Decoding events from relays of other releases: older ones without
``workflow_version``, newer ones with fields this release does not know."""

import json
import uuid

import pytest

from flotilla_client import EventType
from flotilla_client.wire import NotAnEvent, event_from_json


def document(**extra):
    fields = {
        "event_id": str(uuid.uuid4()), "job_id": str(uuid.uuid4()), "sequence": 1,
        "type": "ACCEPTED", "workflow_name": "shipping", "attempt": 0,
        "occurred_at": "2026-12-07T10:00:00.000001Z",
    }
    fields.update(extra)
    return json.dumps(fields).encode()


def test_an_event_of_an_older_relay_has_no_version_and_a_newer_relays_fields_are_ignored():
    older = event_from_json(document())
    assert (older.type, older.workflow_version) == (EventType.ACCEPTED, None)
    newer = event_from_json(document(workflow_version=3, a_later_field={"x": 1}))
    assert newer.workflow_version == 3


@pytest.mark.parametrize("version", [0, -1, "3", 2.5, True])
def test_a_version_that_is_not_an_integer_from_1_is_not_an_event(version):
    with pytest.raises(NotAnEvent, match="workflow_version"):
        event_from_json(document(workflow_version=version))
