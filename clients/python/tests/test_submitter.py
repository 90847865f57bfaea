"""What a submitter refuses before anything is sent."""

import pytest

from flotilla_client import ApiSubmitter, KafkaSubmitter, Rejected


@pytest.mark.parametrize("version", [0, -1, "2", 1.5, True])
def test_a_workflow_version_that_is_not_an_integer_from_1_is_rejected_before_sending(version):
    # Neither submitter reaches anything: the broker and the API do not exist.
    kafka = KafkaSubmitter("127.0.0.1:1", topic="nowhere")
    api = ApiSubmitter("http://127.0.0.1:1")
    for submitter in (kafka, api):
        with pytest.raises(Rejected, match="workflow_version"):
            submitter.submit("order", {"name": "Grace"}, workflow_version=version, timeout=1.0)


@pytest.mark.parametrize("priority", [-1, 11, "5", 2.5, False])
def test_a_priority_that_is_not_an_integer_from_0_to_10_is_rejected_before_sending(priority):
    kafka = KafkaSubmitter("127.0.0.1:1", topic="nowhere")
    api = ApiSubmitter("http://127.0.0.1:1")
    for submitter in (kafka, api):
        with pytest.raises(Rejected, match="priority"):
            submitter.submit("order", {"name": "Grace"}, priority=priority, timeout=1.0)
