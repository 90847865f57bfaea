"""Submitter: a WorkflowRunRequest to the fleet through Kafka or the HTTP
API, returning once it is durable."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from .events import EVENT_TOPIC, registry_client
from .waiting import LONGEST_POLL, EndsReader, end_of_view, outcome, poll_until_ended
from .wire import schema_text

REQUEST_TOPIC = "workflow-run-requests"


class SubmitError(Exception):
    """A submission that did not happen. ``retryable`` says whether the same
    request (with the same job id) may be sent again."""

    retryable = False


class Rejected(SubmitError):
    """The request can never be accepted as it is: fix it, do not retry."""


class Unavailable(SubmitError):
    """The broker, registry or API could not take it now: retry with the
    same job id (a repeat is one job)."""

    retryable = True


class SettingsError(SubmitError):
    """This client's settings cannot work (credentials, a refused schema)."""


@dataclass(frozen=True)
class Receipt:
    job_id: uuid.UUID
    #: Kafka: where the record landed; None through the API.
    partition: Optional[int] = None
    offset: Optional[int] = None
    #: API: False for a repeat of a job id the fleet already had.
    created: Optional[bool] = None


#: What ``submit_many`` returns for each request.
Outcome = Union[Receipt, SubmitError]


def _trace_headers(traceparent: Optional[str]) -> Dict[str, str]:
    """The given trace context, else the current OpenTelemetry span's when
    the program uses OpenTelemetry."""
    if traceparent:
        return {"traceparent": traceparent}
    try:
        from opentelemetry.propagate import inject  # type: ignore[import-not-found, unused-ignore]  # optional
    except ImportError:
        return {}
    carrier: Dict[str, str] = {}
    inject(carrier)
    return {k: v for k, v in carrier.items() if k in ("traceparent", "tracestate") and v}


def _version(version: Optional[int]) -> Optional[int]:
    """A stored version counts from 1; ``None`` runs the newest."""
    if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 1):
        raise Rejected(f"workflow_version must be an integer from 1, got {version!r}")
    return version


def _priority(priority: Optional[int]) -> Optional[int]:
    """0 (the default) to 10: a head start in the queue, a minute per point."""
    if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)
                                 or not 0 <= priority <= 10):
        raise Rejected(f"priority must be an integer from 0 to 10, got {priority!r}")
    return priority


_METADATA_KEY = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _metadata(metadata: Optional[Dict[str, str]]) -> Optional[Dict[str, str]]:
    """Labels on the job: at most 16, keys of letters, digits, ``_``, ``-``
    and ``.`` (1 to 64 characters), string values up to 256 characters."""
    if metadata is None or metadata == {}:
        return None
    if not isinstance(metadata, dict) or len(metadata) > 16:
        raise Rejected("metadata must be a dict of at most 16 entries")
    for key, value in metadata.items():
        if not isinstance(key, str) or not _METADATA_KEY.fullmatch(key):
            raise Rejected(f"metadata key {key!r}: 1 to 64 letters, digits, '_', '-' or '.'")
        if not isinstance(value, str) or len(value) > 256 or "\0" in value:
            raise Rejected(f"metadata value of {key!r}: text up to 256 characters without NUL")
    return dict(sorted(metadata.items()))


def _request(workflow_name: str, input: Any, job_id: Optional[uuid.UUID]) -> Dict[str, Any]:
    if not isinstance(workflow_name, str) or not workflow_name.strip():
        raise Rejected("workflow_name must be non-blank text")
    try:
        # NaN and infinities are not JSON: the fleet would dead-letter them.
        text = json.dumps(input, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise Rejected(f"the input is not JSON: {e}") from None
    job_id = job_id or uuid.uuid4()
    if job_id.int == 0:
        raise Rejected("job_id must not be the nil UUID")
    return {"job_id": job_id, "workflow_name": workflow_name, "input": input, "input_text": text}


class KafkaSubmitter:
    """Produces requests with the settings the contract needs: idempotent,
    acks=all, keyed by job id (a job's messages keep their order), Avro
    through the registry when ``registry_url`` is given, JSON otherwise.

    ``config`` is extra librdkafka configuration (security settings);
    ``registry_config`` the registry client's (``basic.auth.user.info``,
    ``ssl.ca.location``, ...; see ``events.registry_client``)."""

    def __init__(self, bootstrap_servers: str, registry_url: Optional[str] = None,
                 topic: str = REQUEST_TOPIC, config: Optional[Dict[str, Any]] = None,
                 event_topic: str = EVENT_TOPIC, registry_config: Optional[Dict[str, Any]] = None):
        # What submit_and_wait reads the jobs' ends with, started by its first call.
        self._ends_settings = (bootstrap_servers, registry_url, event_topic, dict(config or {}),
                               dict(registry_config or {}))
        self._ends: Optional[EndsReader] = None
        self._ends_lock = threading.Lock()
        settings = dict(config or {})
        settings.update({
            "bootstrap.servers": bootstrap_servers,
            "enable.idempotence": True,
            "acks": "all",
            # The fleet's own producers' partitioner: one job, one partition.
            "partitioner": "consistent_random",
        })
        try:
            self._producer = Producer(settings)
        except KafkaException as e:
            raise SettingsError(f"creating the producer: {e}") from None
        self._topic = topic
        self._avro = None
        registry = registry_client(registry_url, registry_config)
        if registry is not None:
            self._avro = AvroSerializer(registry, schema_text("WorkflowRunRequest"))

    def submit(self, workflow_name: str, input: Any, job_id: Optional[uuid.UUID] = None,
               traceparent: Optional[str] = None, timeout: float = 30.0,
               workflow_version: Optional[int] = None,
               priority: Optional[int] = None,
               metadata: Optional[Dict[str, str]] = None) -> Receipt:
        """Sends one request and waits for the broker's acknowledgement.
        ``workflow_version`` runs that stored version instead of the newest;
        ``priority`` (0 to 10) gives the job a head start in the queue;
        ``metadata`` labels it (kept, echoed on its events, searchable)."""
        value, key, job = self._encode(workflow_name, input, job_id, workflow_version, priority, metadata)
        outcome: Dict[str, Any] = {}

        def delivered(error: Optional[KafkaError], message: Message) -> None:
            outcome["error"], outcome["message"] = error, message

        headers: List[Tuple[str, Union[str, bytes, None]]] = list(_trace_headers(traceparent).items())
        try:
            self._producer.produce(self._topic, key=key, value=value,
                                   headers=headers or None, on_delivery=delivered)
        except BufferError:
            raise Unavailable("the producer's queue is full") from None
        except KafkaException as e:
            raise _delivery_error(e.args[0]) from None
        self._producer.flush(timeout)
        if "error" not in outcome:
            raise Unavailable(f"no acknowledgement within {timeout} s")
        if outcome["error"] is not None:
            raise _delivery_error(outcome["error"])
        message = outcome["message"]
        return Receipt(job_id=job, partition=message.partition(), offset=message.offset())

    def _encode(self, workflow_name: str, input: Any, job_id: Optional[uuid.UUID],
                workflow_version: Optional[int], priority: Optional[int],
                metadata: Optional[Dict[str, str]] = None) -> Tuple[bytes, str, uuid.UUID]:
        """The request's record value (Avro or JSON), its key and its job id."""
        request = _request(workflow_name, input, job_id)
        labels = _metadata(metadata)
        fields = {"job_id": str(request["job_id"]), "workflow_name": workflow_name,
                  "input": request["input_text"], "workflow_version": _version(workflow_version),
                  "priority": _priority(priority), "metadata": labels}
        if self._avro:
            try:
                value = self._avro(fields, SerializationContext(self._topic, MessageField.VALUE))
            except Exception as e:  # the registry's client raises several kinds
                # A schema the registry refuses is the settings' fault;
                # refused credentials are an outage, as for the fleet
                # (rotated credentials come back).
                if getattr(e, "http_status_code", None) in (409, 422):
                    raise SettingsError(f"the registry refused the request schema: {e}") from None
                raise Unavailable(f"the registry: {e}") from None
        else:
            document = {"job_id": fields["job_id"], "workflow_name": workflow_name,
                        "input": request["input"]}
            if workflow_version is not None:
                document["workflow_version"] = workflow_version
            if priority is not None:
                document["priority"] = priority
            if labels is not None:
                document["metadata"] = labels
            value = json.dumps(document, allow_nan=False).encode()
        return value, fields["job_id"], request["job_id"]

    def submit_many(self, requests: Iterable[Tuple[Any, ...]], timeout: float = 60.0) -> List[Outcome]:
        """Sends every ``(workflow_name, input)`` of ``requests`` (or
        ``(workflow_name, input, job_id)``) with all of them in flight at
        once and one flush, and returns each one's outcome in their order:
        a ``Receipt`` once the broker acknowledged it, or the
        ``SubmitError`` it met (a rejected one does not stop the others;
        send the retryable ones again with the same job ids)."""
        outcomes: List[Outcome] = []
        deadline = time.monotonic() + timeout
        for index, request in enumerate(requests):
            outcomes.append(Unavailable(f"no acknowledgement within {timeout} s"))
            try:
                workflow_name, input, job_id = (tuple(request) + (None,))[:3]
                value, key, job = self._encode(workflow_name, input, job_id, None, None)
            except SubmitError as e:
                outcomes[index] = e
                continue
            except (TypeError, ValueError) as e:
                outcomes[index] = Rejected(f"request {index}: {e}")
                continue

            def delivered(error: Optional[KafkaError], message: Message, index: int = index,
                          job: uuid.UUID = job) -> None:
                outcomes[index] = (_delivery_error(error) if error is not None else
                                   Receipt(job_id=job, partition=message.partition(), offset=message.offset()))

            while True:
                try:
                    self._producer.produce(self._topic, key=key, value=value, on_delivery=delivered)
                    break
                except BufferError:
                    # The producer's queue is full: let deliveries drain it.
                    if time.monotonic() > deadline:
                        outcomes[index] = Unavailable("the producer's queue stayed full")
                        break
                    self._producer.poll(0.05)
                except KafkaException as e:
                    outcomes[index] = _delivery_error(e.args[0])
                    break
            self._producer.poll(0)
        self._producer.flush(max(0.0, deadline - time.monotonic()))
        return outcomes

    def submit_and_wait(self, workflow_name: str, input: Any, timeout: float = 60.0,
                        job_id: Optional[uuid.UUID] = None, **options: Any) -> Any:
        """Submits, then waits at most ``timeout`` seconds for the job to
        finish, reading its end from the event topic: its result, or
        ``JobFailed``, ``JobDead``, ``JobCancelled``, ``WaitTimedOut``.
        ``options`` are ``submit``'s. A repeat of a job id that already
        finished publishes no new end: its wait runs out; wait for a known
        job through ``ApiSubmitter``."""
        deadline = time.monotonic() + timeout
        job_id = job_id or uuid.uuid4()
        ends = self._ends_reader()
        watch = ends.watch(job_id)
        self.submit(workflow_name, input, job_id=job_id, **options)
        return outcome(job_id, ends.wait(job_id, watch, deadline))

    def _ends_reader(self) -> EndsReader:
        with self._ends_lock:
            if self._ends is None:
                bootstrap, registry_url, topic, config, registry_config = self._ends_settings
                try:
                    self._ends = EndsReader(bootstrap, registry_url, topic, config, registry_config)
                except Exception as e:
                    raise Unavailable(f"reading the event topic {topic}: {e}") from None
            return self._ends

    def close(self, timeout: float = 30.0) -> None:
        self._producer.flush(timeout)
        if self._ends is not None:
            self._ends.close()


def _delivery_error(error: KafkaError) -> SubmitError:
    text = f"producing: {error}"
    if error.code() in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_RECORD,
                        KafkaError.INVALID_MSG, KafkaError.INVALID_MSG_SIZE):
        return Rejected(text)
    if error.fatal() or error.code() in (
            KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED,
            KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED,
            KafkaError.TOPIC_EXCEPTION, KafkaError._FATAL):
        return SettingsError(text)
    return Unavailable(text)


class ApiSubmitter:
    """Submits through a worker's HTTP API (``POST /v1/jobs``)."""

    def __init__(self, base_url: str, token: Optional[str] = None):
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise SettingsError(f"the API URL {base_url!r} is not an http:// or https:// URL")
        self._url = base_url.rstrip("/") + "/v1/jobs"
        self._token = token

    def submit(self, workflow_name: str, input: Any, job_id: Optional[uuid.UUID] = None,
               traceparent: Optional[str] = None, timeout: float = 30.0,
               workflow_version: Optional[int] = None,
               priority: Optional[int] = None,
               metadata: Optional[Dict[str, str]] = None) -> Receipt:
        """Sends one request and waits until a worker committed it.
        ``workflow_version`` runs that stored version instead of the newest;
        ``priority`` (0 to 10) gives the job a head start in the queue;
        ``metadata`` labels it (kept, echoed on its events, searchable)."""
        receipt, _ = self._post(workflow_name, input, job_id, traceparent, timeout,
                                workflow_version, priority, prefer_wait=None, metadata=metadata)
        return receipt

    def submit_and_wait(self, workflow_name: str, input: Any, timeout: float = 60.0,
                        job_id: Optional[uuid.UUID] = None, traceparent: Optional[str] = None,
                        workflow_version: Optional[int] = None,
                        priority: Optional[int] = None,
                        metadata: Optional[Dict[str, str]] = None) -> Any:
        """Submits, then waits at most ``timeout`` seconds for the job to
        finish, with long polls the fleet answers the moment it ends: its
        result, or ``JobFailed``, ``JobDead``, ``JobCancelled``,
        ``WaitTimedOut``. A refused submission raises as ``submit`` does."""
        deadline = time.monotonic() + timeout
        receipt, job = self._post(workflow_name, input, job_id, traceparent, 30.0,
                                  workflow_version, priority, prefer_wait=min(timeout, LONGEST_POLL),
                                  metadata=metadata)
        end = end_of_view(job)
        if end is None:
            end = poll_until_ended(self._url, self._token, receipt.job_id, deadline, _http_error)
        return outcome(receipt.job_id, end)

    def _post(self, workflow_name: str, input: Any, job_id: Optional[uuid.UUID],
              traceparent: Optional[str], timeout: float, workflow_version: Optional[int],
              priority: Optional[int], prefer_wait: Optional[float],
              metadata: Optional[Dict[str, str]] = None) -> Tuple[Receipt, Any]:
        """POSTs the request: its receipt and the job's view."""
        request = _request(workflow_name, input, job_id)
        document = {"job_id": str(request["job_id"]), "workflow_name": workflow_name,
                    "input": request["input"]}
        if _version(workflow_version) is not None:
            document["workflow_version"] = workflow_version
        if _priority(priority) is not None:
            document["priority"] = priority
        labels = _metadata(metadata)
        if labels is not None:
            document["metadata"] = labels
        body = json.dumps(document, allow_nan=False).encode()
        headers = {"content-type": "application/json", **_trace_headers(traceparent)}
        if self._token:
            headers["authorization"] = f"Bearer {self._token}"
        if prefer_wait is not None:
            headers["prefer"] = f"wait={int(prefer_wait)}"
            timeout += prefer_wait
        call = urllib.request.Request(self._url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(call, timeout=timeout) as response:
                receipt = Receipt(job_id=request["job_id"], created=response.status == 201)
                try:
                    job = json.loads(response.read())
                except ValueError:
                    job = None
                return receipt, job
        except urllib.error.HTTPError as e:
            raise _http_error(self._url, e) from None
        except (urllib.error.URLError, OSError) as e:
            raise Unavailable(f"{self._url}: {e}") from None


def _http_error(url: str, e: urllib.error.HTTPError) -> SubmitError:
    """An API answer that is not a success, classified once."""
    try:
        problem = json.loads(e.read())
        detail = problem.get("detail", "") if isinstance(problem, dict) else ""
    except ValueError:
        detail = ""
    text = f"{url}: {e.code} {detail}"
    if e.code in (401, 403):
        return SettingsError(text)
    if e.code in (408, 429) or e.code >= 500:
        return Unavailable(text)
    return Rejected(text)
