"""Jobs and AsyncJobs against a running fleet: a parked job signalled and
waited on to its end, a step completed, list, events, cancel, retry, the
bulk dry run and schedules; a missing job and a finished one's cancel
classed; and every route the client calls is in the API's OpenAPI
document."""

import asyncio
import json
import time
import urllib.request
import uuid

import pytest

from flotilla_client import ApiSubmitter, AsyncJobs, JobConflict, JobNotFound, Jobs, KafkaSubmitter, Rejected
from flotilla_client.jobs import ROUTES


def until_waiting(jobs, job_id):
    deadline = time.monotonic() + 30
    while True:
        job = jobs.get(job_id)
        if job["status"] == "WAITING":
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.1)


def test_every_verb_of_the_jobs_client_against_the_fleet(fleet):
    jobs = Jobs(fleet.api_url, token=fleet.token)
    submit = ApiSubmitter(fleet.api_url, token=fleet.token).submit

    parked = submit("parked", {}).job_id
    assert until_waiting(jobs, parked)["outstanding_step"] == "hold"
    jobs.signal(parked, "go", {"ok": True}, idempotency_key="k1")
    assert jobs.wait(parked, 20)["status"] == "COMPLETED"

    approval = submit("approval", {}).job_id
    until_waiting(jobs, approval)
    jobs.complete_step(approval, "approve", {"ok": True})
    assert jobs.wait(approval, 20)["status"] == "COMPLETED"

    page = jobs.list(workflow_name="parked", limit=10)
    assert str(parked) in [job["job_id"] for job in page["jobs"]]
    assert jobs.events(parked)[0]["event_type"] == "ACCEPTED"

    cancelled = submit("parked", {}).job_id
    until_waiting(jobs, cancelled)
    assert jobs.cancel(cancelled, reason="not needed")["status"] == "CANCELLED"
    with pytest.raises(JobConflict):
        jobs.cancel(cancelled)
    assert jobs.retry(cancelled)["status"] == "QUEUED"
    with pytest.raises(JobNotFound):
        jobs.get(uuid.uuid4())
    counted = jobs.bulk(cancel=True, dry_run=True, workflow_name="parked")
    assert counted["dry_run"] is True and counted["changed"] == 0 and counted["matched"] >= 1
    with pytest.raises(Rejected):
        jobs.bulk(dry_run=True)

    # Labels filter the list and the bulk verbs: only the labelled job.
    label = {"batch": uuid.uuid4().hex}
    labelled = submit("parked", {}, metadata=label).job_id
    until_waiting(jobs, labelled)
    assert [job["job_id"] for job in jobs.list(metadata=label)["jobs"]] == [str(labelled)]
    assert jobs.bulk(cancel=True, metadata=label)["changed"] == 1
    assert jobs.get(labelled)["status"] == "CANCELLED"
    assert isinstance(jobs.schedules()["schedules"], list)


def test_the_async_client_runs_the_same_calls_without_blocking_the_loop(fleet):
    async def main():
        jobs = AsyncJobs(fleet.api_url, token=fleet.token)
        job_id = ApiSubmitter(fleet.api_url, token=fleet.token).submit(fleet.workflow, {"n": 1}).job_id
        # Two calls at once: the wait and a list, on worker threads.
        finished, page = await asyncio.gather(jobs.wait(job_id, 20), jobs.list(workflow_name=fleet.workflow))
        assert finished["status"] == "COMPLETED", finished
        assert page["jobs"], page
        with pytest.raises(JobNotFound):
            await jobs.get(uuid.uuid4())
    asyncio.run(main())


def test_every_route_the_client_calls_is_in_the_apis_openapi_document(fleet):
    with urllib.request.urlopen(f"{fleet.api_url}/openapi.json", timeout=30) as response:
        document = json.loads(response.read())
    for method, path in ROUTES:
        assert method.lower() in document["paths"].get(path, {}), f"{method} {path} is not in the API"


def test_labels_sent_through_kafka_are_kept_searchable_and_echoed(services, fleet):
    kafka = KafkaSubmitter(services.bootstrap, registry_url=services.registry, topic=fleet.request_topic)
    receipt = kafka.submit(fleet.workflow, {}, metadata={"customer": "grace", "batch": "9"})
    kafka.close()
    jobs = Jobs(fleet.api_url, token=fleet.token)
    deadline = time.monotonic() + 30
    while True:
        try:
            job = jobs.wait(receipt.job_id, 10)
            if job["status"] == "COMPLETED":
                break
        except JobNotFound:
            pass
        assert time.monotonic() < deadline, "the labelled job did not complete"
        time.sleep(0.1)
    assert job["metadata"] == {"batch": "9", "customer": "grace"}
    events = jobs.events(receipt.job_id)
    assert all(event["metadata"] == {"batch": "9", "customer": "grace"} for event in events), events
    with pytest.raises(Rejected, match="metadata"):
        ApiSubmitter(fleet.api_url, token=fleet.token).submit(fleet.workflow, {}, metadata={"two words": "x"})
