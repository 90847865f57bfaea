"""Jobs: the fleet's HTTP API for jobs already submitted (get, list, wait,
cancel, retry, signal, complete a step, events, retry or cancel many by
filter, schedules), and AsyncJobs, the same for asyncio.

Every route it calls is in ``ROUTES``; the package's tests hold that list
to the API's own OpenAPI document, so the client and the API cannot drift
apart unnoticed. Errors are the submitter's kinds: ``Rejected`` (with
``JobNotFound`` and ``JobConflict`` among them), ``Unavailable`` (retry),
``SettingsError``."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Any, Dict, List, Optional, Tuple

from .submitter import Rejected, SettingsError, Unavailable, _http_error

#: Every route ``Jobs`` calls: method and path as the OpenAPI document names them.
ROUTES: List[Tuple[str, str]] = [
    ("GET", "/v1/jobs"),
    ("GET", "/v1/jobs/{job_id}"),
    ("GET", "/v1/jobs/{job_id}/events"),
    ("POST", "/v1/jobs/{job_id}/cancel"),
    ("POST", "/v1/jobs/{job_id}/retry"),
    ("POST", "/v1/jobs/{job_id}/signals"),
    ("POST", "/v1/jobs/{job_id}/steps/{step_name}/complete"),
    ("POST", "/v1/jobs/bulk/retry"),
    ("POST", "/v1/jobs/bulk/cancel"),
    ("GET", "/v1/schedules"),
]

#: The longest single wait the API is asked for (below its request timeout).
LONGEST_POLL = 25.0


class JobNotFound(Rejected):
    """No such job (404)."""


class JobConflict(Rejected):
    """The job is not in a state the verb applies to (409)."""


def _filter(status: Optional[str], workflow_name: Optional[str], created_after: Optional[str],
            created_before: Optional[str]) -> Dict[str, str]:
    given = {"status": status, "workflow_name": workflow_name,
             "created_after": created_after, "created_before": created_before}
    return {name: value for name, value in given.items() if value is not None}


def _labels(metadata: Optional[Dict[str, str]]) -> Optional[Dict[str, str]]:
    """A metadata filter worth sending: none for no labels."""
    return dict(metadata) if metadata else None


class Jobs:
    """The jobs of a fleet through a worker's API at ``base_url``. Each
    method returns the API's JSON (a job is a dict with ``job_id``,
    ``status``, ``result``, ``error`` and the rest of its view)."""

    def __init__(self, base_url: str, token: Optional[str] = None, timeout: float = 30.0):
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise SettingsError(f"the API URL {base_url!r} is not an http:// or https:// URL")
        self._base = base_url.rstrip("/")
        self._token = token
        self._timeout = timeout

    def get(self, job_id: uuid.UUID) -> Dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}")  # type: ignore[no-any-return]

    def wait(self, job_id: uuid.UUID, timeout: float) -> Dict[str, Any]:
        """The job once it has finished, or as it is when ``timeout``
        (at most 25 s per call) runs out: the API answers the moment it ends."""
        wait = max(0.0, min(timeout, LONGEST_POLL))
        return self._call("GET", f"/v1/jobs/{job_id}", query={"wait": f"{int(wait * 1000)}ms"},  # type: ignore[no-any-return]
                          extra_time=wait)

    def list(self, status: Optional[str] = None, workflow_name: Optional[str] = None,
             created_after: Optional[str] = None, created_before: Optional[str] = None,
             limit: Optional[int] = None, cursor: Optional[str] = None,
             metadata: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        """A page of jobs, newest first: ``{"jobs": [...], "next_cursor": ...}``.
        ``metadata``: labels every job listed holds."""
        query: Dict[str, str] = _filter(status, workflow_name, created_after, created_before)
        labels = _labels(metadata)
        if labels is not None:
            query["metadata"] = json.dumps(labels)
        if limit is not None:
            query["limit"] = str(limit)
        if cursor is not None:
            query["cursor"] = cursor
        return self._call("GET", "/v1/jobs", query=query)  # type: ignore[no-any-return]

    def cancel(self, job_id: uuid.UUID, reason: Optional[str] = None) -> Dict[str, Any]:
        body = {"reason": reason} if reason is not None else None
        return self._call("POST", f"/v1/jobs/{job_id}/cancel", body=body)  # type: ignore[no-any-return]

    def retry(self, job_id: uuid.UUID) -> Dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/retry")  # type: ignore[no-any-return]

    def signal(self, job_id: uuid.UUID, name: str, payload: Any = None,
               idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        body: Dict[str, Any] = {"name": name, "payload": payload if payload is not None else {}}
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        return self._call("POST", f"/v1/jobs/{job_id}/signals", body=body)  # type: ignore[no-any-return]

    def complete_step(self, job_id: uuid.UUID, step: str, response: Any) -> Dict[str, Any]:
        path = f"/v1/jobs/{job_id}/steps/{urllib.parse.quote(step, safe='')}/complete"
        return self._call("POST", path, body={"response": response})  # type: ignore[no-any-return]

    def events(self, job_id: uuid.UUID) -> List[Dict[str, Any]]:
        return self._call("GET", f"/v1/jobs/{job_id}/events")["events"]  # type: ignore[no-any-return]

    def bulk(self, cancel: bool = False, dry_run: bool = False, reason: Optional[str] = None,
             status: Optional[str] = None, workflow_name: Optional[str] = None,
             created_after: Optional[str] = None, created_before: Optional[str] = None,
             metadata: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        """Retries (or with ``cancel``, cancels) every job the filter
        matches, or only counts them with ``dry_run``."""
        matching: Dict[str, Any] = dict(_filter(status, workflow_name, created_after, created_before))
        labels = _labels(metadata)
        if labels is not None:
            matching["metadata"] = labels
        body: Dict[str, Any] = {"filter": matching, "dry_run": dry_run}
        if reason is not None:
            body["reason"] = reason
        verb = "cancel" if cancel else "retry"
        return self._call("POST", f"/v1/jobs/bulk/{verb}", body=body)  # type: ignore[no-any-return]

    def schedules(self) -> Dict[str, Any]:
        return self._call("GET", "/v1/schedules")  # type: ignore[no-any-return]

    def _call(self, method: str, path: str, query: Optional[Dict[str, str]] = None,
              body: Optional[Dict[str, Any]] = None, extra_time: float = 0.0) -> Any:
        url = self._base + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        headers = {"authorization": f"Bearer {self._token}"} if self._token else {}
        data = None
        if body is not None:
            data = json.dumps(body, allow_nan=False).encode()
            headers["content-type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout + extra_time) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            if e.code == 404:
                raise JobNotFound(f"{url}: 404") from None
            if e.code == 409:
                raise JobConflict(f"{url}: 409") from None
            raise _http_error(url, e) from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise Unavailable(f"{url}: {e}") from None


class AsyncJobs:
    """``Jobs`` for asyncio: each call runs on a worker thread
    (``asyncio.to_thread``), so the event loop never blocks on the API."""

    def __init__(self, base_url: str, token: Optional[str] = None, timeout: float = 30.0):
        self._jobs = Jobs(base_url, token, timeout)

    async def get(self, job_id: uuid.UUID) -> Dict[str, Any]:
        return await asyncio.to_thread(self._jobs.get, job_id)

    async def wait(self, job_id: uuid.UUID, timeout: float) -> Dict[str, Any]:
        return await asyncio.to_thread(self._jobs.wait, job_id, timeout)

    async def list(self, **filters: Any) -> Dict[str, Any]:
        return await asyncio.to_thread(self._jobs.list, **filters)

    async def cancel(self, job_id: uuid.UUID, reason: Optional[str] = None) -> Dict[str, Any]:
        return await asyncio.to_thread(self._jobs.cancel, job_id, reason)

    async def retry(self, job_id: uuid.UUID) -> Dict[str, Any]:
        return await asyncio.to_thread(self._jobs.retry, job_id)

    async def signal(self, job_id: uuid.UUID, name: str, payload: Any = None,
                     idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        return await asyncio.to_thread(self._jobs.signal, job_id, name, payload, idempotency_key)

    async def complete_step(self, job_id: uuid.UUID, step: str, response: Any) -> Dict[str, Any]:
        return await asyncio.to_thread(self._jobs.complete_step, job_id, step, response)

    async def events(self, job_id: uuid.UUID) -> List[Dict[str, Any]]:
        return await asyncio.to_thread(self._jobs.events, job_id)

    async def bulk(self, **arguments: Any) -> Dict[str, Any]:
        return await asyncio.to_thread(self._jobs.bulk, **arguments)

    async def schedules(self) -> Dict[str, Any]:
        return await asyncio.to_thread(self._jobs.schedules)
