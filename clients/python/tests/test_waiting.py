"""submit_and_wait against a running fleet, through the API and through
Kafka: the result, a failed job as its own exception, a wait that runs out;
an input refused is a rejected submission through the API and a failed job
through Kafka. The fleet (client/tests/support) runs `breaking` (a final
404), `strict` (an input needing `order`) and `parked` (a wait nobody ends)."""

import pytest

from flotilla_client import ApiSubmitter, JobFailed, KafkaSubmitter, Rejected, WaitTimedOut


@pytest.fixture
def submitters(services, fleet):
    kafka = KafkaSubmitter(services.bootstrap, registry_url=services.registry, topic=fleet.request_topic,
                           event_topic=fleet.event_topic)
    yield [("api", ApiSubmitter(fleet.api_url, token=fleet.token)), ("kafka", kafka)]
    kafka.close()


def test_submit_and_wait_gives_the_result_or_how_the_job_ended_either_way(fleet, submitters):
    for route, submitter in submitters:
        shipped = submitter.submit_and_wait(fleet.workflow, {"n": 7}, timeout=60)
        assert shipped == {"echo": {}}, (route, shipped)
        with pytest.raises(JobFailed, match="404") as failed:
            submitter.submit_and_wait("breaking", {}, timeout=60)
        assert failed.value.job_id is not None, route
        with pytest.raises(WaitTimedOut) as ran_out:
            submitter.submit_and_wait("parked", {}, timeout=2)
        assert ran_out.value.last_error is None, route
    api, kafka = (s for _, s in submitters)
    with pytest.raises(Rejected, match="order"):
        api.submit_and_wait("strict", {}, timeout=60)
    with pytest.raises(JobFailed, match="order"):
        kafka.submit_and_wait("strict", {}, timeout=60)


def test_submit_many_sends_them_all_at_once_and_a_refused_one_alone_fails(services, fleet):
    import json
    import time
    import urllib.error
    import urllib.request

    from flotilla_client import Receipt

    kafka = KafkaSubmitter(services.bootstrap, registry_url=services.registry, topic=fleet.request_topic)
    requests = [(fleet.workflow, {"n": n}) for n in range(500)]
    requests.insert(250, (fleet.workflow, {"not json": float("nan")}))
    outcomes = kafka.submit_many(requests, timeout=60)
    kafka.close()
    assert len(outcomes) == 501
    assert isinstance(outcomes[250], Rejected), outcomes[250]
    receipts = [o for i, o in enumerate(outcomes) if i != 250]
    assert all(isinstance(r, Receipt) and r.offset is not None for r in receipts), \
        [r for r in receipts if not isinstance(r, Receipt)][:3]
    assert len({r.job_id for r in receipts}) == 500
    # The last one sent becomes a job (404 until a worker has read it).
    last = receipts[-1].job_id
    call = urllib.request.Request(f"{fleet.api_url}/v1/jobs/{last}?wait=20s",
                                  headers={"authorization": f"Bearer {fleet.token}"})
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(call, timeout=60) as response:
                job = json.loads(response.read())
            if job["status"] == "COMPLETED":
                break
        except urllib.error.HTTPError as e:
            assert e.code == 404, e
        assert time.monotonic() < deadline, f"job {last} did not complete"
        time.sleep(0.2)
