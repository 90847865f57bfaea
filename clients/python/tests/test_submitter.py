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
