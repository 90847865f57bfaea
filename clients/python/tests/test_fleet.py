"""The package against a running fleet: requests submitted through Kafka
(Avro) and the HTTP API reach COMPLETED, their events read once and in
order; and the example consumer, killed between its write and its
acknowledgement, applies each event once."""

import json
import os
import sqlite3
import subprocess
import sys
import time
import urllib.request
import uuid

from flotilla_client import (ApiSubmitter, EventStream, EventType, Gap, KafkaSubmitter, Rejected, SettingsError,
                             StreamUnavailable, Unavailable)

from conftest import REPOSITORY

DEADLINE = 90.0


def follow(fleet, services, jobs):
    """Each job's events until every job is COMPLETED, by job."""
    seen = {job: [] for job in jobs}
    with EventStream(services.bootstrap, f"py-fleet-{uuid.uuid4().hex}", registry_url=services.registry,
                     topic=fleet.event_topic) as stream:
        deadline = time.monotonic() + DEADLINE
        while not all(events and events[-1].type == EventType.COMPLETED for events in seen.values()):
            assert time.monotonic() < deadline, f"not every job completed within {DEADLINE} s: {seen}"
            try:
                delivery = stream.poll(0.5)
            except Gap as e:
                raise AssertionError(f"the fleet skipped a sequence: {e}")
            except StreamUnavailable as e:
                print(f"unavailable: {e}")
                continue
            if delivery is None:
                continue
            if delivery.event.job_id in seen:
                seen[delivery.event.job_id].append(delivery.event)
            stream.ack(delivery)
    return seen


def test_requests_through_kafka_and_the_api_complete_and_their_events_come_once_in_order(services, fleet):
    kafka = KafkaSubmitter(services.bootstrap, registry_url=services.registry, topic=fleet.request_topic)
    api = ApiSubmitter(fleet.api_url, token=fleet.token)
    through_kafka = [kafka.submit(fleet.workflow, {"n": n}) for n in range(3)]
    assert all(r.partition is not None and r.offset is not None for r in through_kafka)
    first = api.submit(fleet.workflow, {"n": 99})
    again = api.submit(fleet.workflow, {"n": 99}, job_id=first.job_id)
    assert (first.created, again.created) == (True, False), "the same job id twice is one job"
    jobs = [r.job_id for r in through_kafka] + [first.job_id]
    for job, events in follow(fleet, services, jobs).items():
        assert [e.sequence for e in events] == list(range(1, len(events) + 1)), events
        assert events[0].type == EventType.ACCEPTED
        assert len({e.event_id for e in events}) == len(events)


def test_each_refusal_is_classified_once_rejected_unavailable_or_settings(services, fleet):
    api = ApiSubmitter(fleet.api_url, token=fleet.token)
    # About the request: an unknown workflow (422), an input that is not
    # JSON (refused before anything is sent).
    try:
        api.submit(f"no-such-workflow-{uuid.uuid4().hex}", {})
    except Rejected as e:
        assert not e.retryable
        assert "422" in str(e), e
    else:
        raise AssertionError("an unknown workflow was accepted")
    kafka = KafkaSubmitter(services.bootstrap, registry_url=services.registry, topic=fleet.request_topic)
    for submitter in (api, kafka):
        try:
            submitter.submit(fleet.workflow, {"total": float("nan")})
        except Rejected:
            pass
        else:
            raise AssertionError("NaN was sent as JSON")
    # About the settings: a wrong token, a URL that is no URL.
    try:
        ApiSubmitter(fleet.api_url, token="nope").submit(fleet.workflow, {})
    except SettingsError as e:
        assert not e.retryable
    else:
        raise AssertionError("a refused token was accepted")
    try:
        ApiSubmitter("127.0.0.1:8080")
    except SettingsError:
        pass
    else:
        raise AssertionError("a URL without a scheme was taken")
    # About the world: nothing listens.
    try:
        ApiSubmitter("http://127.0.0.1:9").submit(fleet.workflow, {})
    except Unavailable as e:
        assert e.retryable
    else:
        raise AssertionError("a refused connection was not an outage")


def own_workflow(fleet) -> str:
    """A copy of the fleet's workflow under a name of this test's own, so
    the consumer below can count this test's jobs alone."""
    def call(method, path, body=None):
        request = urllib.request.Request(
            fleet.api_url.rstrip("/") + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"authorization": f"Bearer {fleet.token}", "content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    definition = call("GET", f"/v1/workflows/{fleet.workflow}")["definition"]
    name = f"outcomes-{uuid.uuid4().hex[:12]}"
    call("PUT", f"/v1/workflows/{name}", dict(definition, name=name))
    return name


def run_outcomes(services, fleet, database, group, workflow, jobs, die_after=None):
    env = dict(os.environ)
    env.pop("OUTCOMES_DIE_AFTER_WRITES", None)
    if die_after:
        env["OUTCOMES_DIE_AFTER_WRITES"] = str(die_after)
    command = [sys.executable, str(REPOSITORY / "examples" / "python" / "outcomes.py"),
               "--bootstrap", services.bootstrap, "--registry", services.registry,
               "--topic", fleet.event_topic, "--group", group, "--database", str(database),
               "--workflow", workflow, "--until-finished", str(jobs),
               # The same static member each time: restarted with its id, it
               # holds the killed one's partitions at once instead of after
               # that member's session timeout.
               "--instance-id", f"{group}-member"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=DEADLINE)


def test_the_example_consumer_killed_between_its_write_and_its_ack_applies_each_event_once(
        services, fleet, tmp_path):
    workflow = own_workflow(fleet)
    produce = subprocess.run(
        [sys.executable, str(REPOSITORY / "examples" / "python" / "produce.py"),
         "--bootstrap", services.bootstrap, "--registry", services.registry,
         "--topic", fleet.request_topic, "--workflow", workflow, "--count", "4"],
        capture_output=True, text=True, timeout=DEADLINE)
    assert produce.returncode == 0, produce.stderr
    jobs = {uuid.UUID(line) for line in produce.stdout.split()}
    assert len(jobs) == 4
    # Every job's whole stream, to compare the consumer's table with.
    expected = {job: len(events) for job, events in follow(fleet, services, jobs).items()}

    database, group = tmp_path / "outcomes.sqlite", f"py-outcomes-{uuid.uuid4().hex}"
    died = run_outcomes(services, fleet, database, group, workflow, len(jobs), die_after=3)
    assert died.returncode == 70, (died.returncode, died.stderr)
    assert "dying after 3 writes" in died.stderr, died.stderr
    finished = run_outcomes(services, fleet, database, group, workflow, len(jobs))
    assert finished.returncode == 0, finished.stderr
    # The event written just before the kill came again and was found applied.
    repeats = int(finished.stdout.rsplit("repeats skipped", 1)[1])
    assert repeats >= 1, finished.stdout
    with sqlite3.connect(database) as db:
        rows = {uuid.UUID(job): (status, applied, last, gaps) for job, status, applied, last, gaps in
                db.execute("SELECT job_id, status, events_applied, last_sequence, gaps FROM job_outcome")}
    assert set(rows) == jobs
    for job in jobs:
        assert rows[job] == ("COMPLETED", expected[job], expected[job], 0), (job, rows[job])
