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
