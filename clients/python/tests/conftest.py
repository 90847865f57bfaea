"""What the tests run against, from the environment.
`client/tests/fleet.rs::the_python_package_passes_its_tests_against_the_fleet`
starts a fleet (worker and relay binaries on topics of their own) and runs
these tests with every variable set (`scripts/test` runs it), in a fresh
virtual environment where the package is installed from its wheel
(`scripts/python-package`), from outside the source tree and with no
PYTHONPATH. To run them from the tree instead, set PYTHONPATH=clients/python."""

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest


REPOSITORY = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Services:
    bootstrap: str
    registry: str


@dataclass(frozen=True)
class Fleet:
    request_topic: str
    event_topic: str
    api_url: str
    token: str
    workflow: str


def _need(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run these tests through "
                    "`cargo nextest run -p flotilla-client --test fleet python` (scripts/test does)")
    return value


@pytest.fixture(scope="session")
def services() -> Services:
    return Services(_need("KAFKA_BOOTSTRAP_SERVERS"), _need("SCHEMA_REGISTRY_URL"))


@pytest.fixture(scope="session")
def fleet() -> Fleet:
    return Fleet(_need("FLOTILLA_REQUEST_TOPIC"), _need("FLOTILLA_EVENT_TOPIC"),
                 _need("FLOTILLA_URL"), _need("FLOTILLA_TOKEN"), _need("FLOTILLA_WORKFLOW"))


def new_topic(services: Services) -> str:
    """A topic of the caller's own, three partitions."""
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"py-events-{uuid.uuid4().hex}"
    admin = AdminClient({"bootstrap.servers": services.bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=3, replication_factor=1)])[name].result(30)
    return name


@pytest.fixture
def topic(services) -> str:
    return new_topic(services)
