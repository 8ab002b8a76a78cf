"""Async client for slurmrestd (REST API v0.0.44, or v0.0.45: SLURM_API_VERSION): the only way to Slurm.

Messages are v0.0.44's models on either version (bridge/slurm_api/versions.py says why that holds).

One `httpx.AsyncClient`; the JWT file is looked at before every request and read
again whenever it changed (so a rotated token is picked up at once); the token is
kept in the client's memory only, never logged or put in an error.

Every failure is a `SlurmError` carrying Slurm's own error text and numbers, the
HTTP status and whether retrying can help. How answers map to the subclasses,
as observed against slurmrestd 26.05.5 (v0.0.44, accounting_storage/none):

  SlurmNotFound     GET/POST /job/ID, GET /resources/ID of an unknown job: 404, error 2017;
                    DELETE /job/ID of an unknown job: 200 with status[].error.code 2017;
                    DELETE or POST /node/NAME of an unknown node: 422, error 2018.
  SlurmAuthError    no token headers: 401 (text/plain "Authentication failure"); bad or
                    expired token: 511, error 1007 (GET /ping/ still answers 200, pinged
                    "DOWN"); DELETE /job/ID while slurmctld was down: 403, error 1 (EPERM).
  SlurmRejected     unknown partition: 422, error 2000; unknown node in required_nodes:
                    422, 2018; bad reservation 422, 2053; bad constraint 422, 2029; memory
                    or nodes no node has: 422, 2014 / 2025; a script with EXTERNAL_JOB: 500,
                    2189; no script without EXTERNAL_JOB: 422, 9000; malformed JSON: 400;
                    a field of the wrong type: 200 with only a warning and NO job_id;
                    update of a running job's size: 422, 2073; node busy on delete: 422,
                    2016; node exists on create: 422, 2168; unparsable node_conf: 500, -1.
  SlurmUnavailable  connection refused/reset, timeouts; slurmctld stopped: 502, error 1800
                    after slurmrestd's own 10 s timeout (GET /jobs, /nodes, /partition,
                    POST /job/submit, /new/node), 500 with error -1 after 20 s (GET /job/ID,
                    /resources/ID), 500 with error 1000 (POST /job/ID).
  not errors        an unknown account (no accounting: accepted, 200); cpus_per_task 64 on
                    4-CPU nodes (200 with warnings, job PENDING, reason PartitionConfig).

Timeouts and retries: point requests (one job, one node, the states of a few
hundred named jobs) wait `timeout`; listing every job (`list_jobs`: ~8 KB per
job, 16 MB and 0.7 s at 2,000 jobs on an otherwise idle 2-core slurmctld, and
slower on a busy one) waits `listing_timeout`. The client never retries by
itself: its callers do, with backoff (Temporal's activity retry policy, the job
watcher's exponential backoff, the signal delivery's), so a slow slurmrestd is
never asked again at once.
"""

import logging
import os
import re
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple, Protocol, Self, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from bridge.slurm_api import API_VERSION, API_VERSIONS, request_body
from bridge.slurm_api.v0044 import (
    V0044ControllerPing,
    V0044JobDescMsg,
    V0044JobInfo,
    V0044JobSubmitReq,
    V0044Node,
    V0044NodeResourceLayout,
    V0044OpenapiCreateNodeReq,
    V0044OpenapiJobInfoResp,
    V0044OpenapiJobPostResponse,
    V0044OpenapiJobSubmitResponse,
    V0044OpenapiKillJobResp,
    V0044OpenapiNodesResp,
    V0044OpenapiPartitionResp,
    V0044OpenapiPingArrayResp,
    V0044OpenapiResourceLayoutResp,
    V0044PartitionInfo,
    V0044UpdateNodeMsg,
)
from bridge.slurm_api.versions import as_v0044

log = logging.getLogger(__name__)

# Slurm error numbers (slurm/slurm_errno.h) the classification needs by name.
EPERM = 1
SLURM_UNEXPECTED_MSG_ERROR = 1000
SLURM_PROTOCOL_AUTHENTICATION_ERROR = 1007
SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR = 1800
ESLURM_NODES_BUSY = 2016
ESLURM_INVALID_JOB_ID = 2017
ESLURM_INVALID_NODE_NAME = 2018
ESLURM_ALREADY_DONE = 2021
ESLURM_REST_AUTH_FAIL = 9008

# Answers that a fresh token fixes: the next request reads the new token file.
_AUTH_STATUSES = frozenset({401, 403, 511})
_AUTH_ERRORS = frozenset({SLURM_PROTOCOL_AUTHENTICATION_ERROR, ESLURM_REST_AUTH_FAIL, *range(6000, 6100)})
# slurmrestd could not get an answer from slurmctld: its communication errors
# (1000-1004, 1013-1025, 1800-1805), standby controllers (2027, 2131), a node
# in transition (2020) and socket timeouts (5003-5005).
_UNAVAILABLE_ERRORS = frozenset(
    {*range(1000, 1005), *range(1013, 1026), *range(1800, 1806), 2020, 2027, 2131, *range(5003, 5006)}
)
_UNAVAILABLE_STATUSES = frozenset({408, 429, 502, 503, 504})
# Error numbers that say nothing about the cause ("No error", "Unspecified error").
_UNSPECIFIC_ERRORS = frozenset({0, -1})
_JOB_MISSING = frozenset({ESLURM_INVALID_JOB_ID})
_NODE_MISSING = frozenset({ESLURM_INVALID_NODE_NAME})

_Model = TypeVar("_Model", bound=BaseModel)


@dataclass(frozen=True)
class SlurmErrorDetail:
    """One entry of a slurmrestd answer's `errors` list (or a kill status)."""

    number: int | None
    error: str = ""
    description: str = ""
    source: str = ""

    def __str__(self) -> str:
        text = self.error or self.description or "error"
        if self.description and self.description != text:
            text = f"{text} ({self.description})"
        return text if self.number is None else f"{text} [{self.number}]"


class SlurmError(Exception):
    """slurmrestd or slurmctld refused or failed a request.

    `message` is Slurm's own text; `status` the HTTP status (None when no answer
    came); `errors` the entries of the answer's `errors` list; `retryable` says
    whether the same request may succeed later without any change.
    """

    default_retryable = False

    def __init__(
        self,
        message: str,
        *,
        operation: str = "",
        status: int | None = None,
        errors: tuple[SlurmErrorDetail, ...] = (),
        retryable: bool | None = None,
    ) -> None:
        self.message = message
        self.operation = operation
        self.status = status
        self.errors = errors
        self.retryable = self.default_retryable if retryable is None else retryable
        super().__init__(self._describe())

    @property
    def error_numbers(self) -> frozenset[int]:
        return frozenset(detail.number for detail in self.errors if detail.number is not None)

    def _describe(self) -> str:
        where = f"{self.operation}: " if self.operation else ""
        status = f"HTTP {self.status}: " if self.status is not None else ""
        return f"{where}{status}{self.message}"

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only arguments: pickle (multiprocessing, some test runners) needs help.
        return (
            _rebuild_error,
            (type(self), self.message, self.operation, self.status, self.errors, self.retryable),
        )


class SlurmNotFound(SlurmError):
    """The job or node the request names does not exist (any more)."""


class SlurmAuthError(SlurmError):
    """slurmrestd did not accept the token; a rotated token file fixes it, so retry."""

    default_retryable = True


class SlurmRejected(SlurmError):
    """slurmrestd or slurmctld refused this request as it stands; retrying cannot help."""


class SlurmUnavailable(SlurmError):
    """No usable answer: slurmrestd or slurmctld is down, slow or unreachable; retry."""

    default_retryable = True


def _rebuild_error(
    cls: type[SlurmError],
    message: str,
    operation: str,
    status: int | None,
    errors: tuple[SlurmErrorDetail, ...],
    retryable: bool,
) -> SlurmError:
    return cls(message, operation=operation, status=status, errors=errors, retryable=retryable)


def classify(
    status: int,
    numbers: Collection[int],
    *,
    not_found: Collection[int] = (),
    unspecified: type[SlurmError] = SlurmUnavailable,
) -> type[SlurmError]:
    """The exception class for an answer with HTTP `status` and Slurm error `numbers`.

    Slurm's error number decides before the HTTP status: slurmrestd answers 500
    for some plain rejections (2189, invalid external job) and for a stopped
    slurmctld alike. `not_found` are the numbers that mean "the object this URL
    names does not exist" (2017 for a job, 2018 for a node; 2018 in a job
    submission is a rejection). `unspecified` is the class for a 5xx with no
    telling number: slurmctld down for reads, a bad node_conf for node creation.
    """
    specific = set(numbers) - _UNSPECIFIC_ERRORS
    if status in _AUTH_STATUSES or specific & _AUTH_ERRORS:
        return SlurmAuthError
    if specific & set(not_found):
        return SlurmNotFound
    if status in _UNAVAILABLE_STATUSES or specific & _UNAVAILABLE_ERRORS:
        return SlurmUnavailable
    if specific or status < 500:
        return SlurmRejected
    return unspecified


# Ids and names in paths would make a metric series per job: fold them into a template.
_PATH_IDS = re.compile(r"/(job|node|partition|resources)/(?!submit)[^/?]+")


def operation_template(method: str, path: str) -> str:
    """`GET /job/{}` for `GET /job/42`: what the observer is told."""
    return f"{method} {_PATH_IDS.sub(lambda m: f'/{m.group(1)}/{{}}', path)}"


# `GET /jobs/state/?job_id=A&job_id=B...`: ids per request, and a bound on the query
# string (job ids have up to 8 digits: ~16 characters each) far below the 8 KiB
# request-line limits of common proxies. slurmrestd answered 2,000 ids (23,000
# characters) itself; 500 ids took 3.7 ms at 2,060 jobs.
JOB_STATE_CHUNK = 500
MAX_QUERY_CHARS = 4000


class JobList(NamedTuple):
    """`list_jobs`'s answer: the jobs, and the `update_time` to pass on the next call."""

    jobs: list[V0044JobInfo]
    update_time: int


# Query parameters: a mapping, or QueryParams when a name repeats (`job_id=1&job_id=2`).
_Params = Mapping[str, str] | httpx.QueryParams

# Says whether an answer's errors are expected for this call and must not raise.
_Tolerate = Callable[[int, tuple[SlurmErrorDetail, ...]], bool]


class SlurmGate(Protocol):
    """Says whether requests may be sent (clients/slurm_health.py's SlurmHealth)."""

    def refusal(self, operation: str) -> "SlurmUnavailable | None": ...

    def suspect(self, error: SlurmError) -> None: ...


class SlurmClient:
    """slurmrestd (v0.0.44, or v0.0.45) over one pooled HTTP client; async, use as `async with`.

    With a `gate` (the worker's SlurmHealth), a request is not sent while the gate
    says Slurm is away, and a request that finds Slurm away tells the gate.
    """

    gate: SlurmGate | None = None

    def __init__(
        self,
        base_url: str,
        *,
        user_name: str | None,
        token_file: Path | None,
        timeout: float = 10.0,
        listing_timeout: float = 60.0,
        transport: httpx.AsyncBaseTransport | None = None,
        observer: Callable[[str, str, float], None] | None = None,
        api_version: str = API_VERSION,
    ) -> None:
        if api_version not in API_VERSIONS:
            raise ValueError(f"Slurm REST API {api_version} is not supported: {', '.join(API_VERSIONS)}")
        self.base_url = base_url.rstrip("/")
        self.api_version = api_version
        # Told (operation template, outcome, seconds) after every request: metrics.
        self.observer = observer
        self.user_name = user_name
        self.token_file = Path(token_file) if token_file is not None else None
        self._token = ""  # the token as last read, and the file's identity then
        self._token_version: tuple[int, int, int, int] | None = None
        self.timeout = timeout
        # Listing every job: megabytes from a slurmrestd that may be busy. Connecting
        # still fails as fast as for any other request.
        self.listing_timeout = httpx.Timeout(max(listing_timeout, timeout), connect=timeout)
        self._http = httpx.AsyncClient(
            base_url=f"{self.base_url}/slurm/{api_version}",
            timeout=timeout,
            transport=transport,
            headers={"Accept": "application/json"},
        )

    def __repr__(self) -> str:
        return (
            f"SlurmClient({self.base_url!r}, user_name={self.user_name!r}, token_file={self.token_file!r}, "
            f"api_version={self.api_version!r})"
        )

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # Jobs

    async def submit_job(self, job: V0044JobDescMsg) -> int:
        """Submit a job (for the bridge: an EXTERNAL_JOB without script); its job id."""
        data = await self._call("POST", "/job/submit", body=V0044JobSubmitReq(job=job))
        answer = _parse(V0044OpenapiJobSubmitResponse, data, "POST /job/submit")
        if answer.job_submit_user_msg:
            log.info("slurm job_submit: %s", answer.job_submit_user_msg)
        if answer.job_id is None:
            # Seen when a field had the wrong type: 200, one warning, no job.
            warnings = (
                "; ".join(w.description or "" for w in answer.warnings or []) or "no job_id in the answer"
            )
            raise SlurmRejected(
                f"slurmrestd submitted no job: {warnings}", operation="POST /job/submit", status=200
            )
        return answer.job_id

    async def update_job(self, job_id: int, job: V0044JobDescMsg) -> None:
        """Change a job. The body is the bare job_desc_msg: `{"job": ...}` is silently ignored."""
        operation = f"POST /job/{job_id}"
        data = await self._call("POST", f"/job/{job_id}", body=job, not_found=_JOB_MISSING)
        answer = _parse(V0044OpenapiJobPostResponse, data, operation)
        for result in answer.results or []:
            if result.error_code:
                detail = SlurmErrorDetail(result.error_code, result.error or "", result.why or "")
                raise _error_for(200, (detail,), operation, not_found=_JOB_MISSING)

    async def get_job(self, job_id: int) -> V0044JobInfo:
        operation = f"GET /job/{job_id}"
        data = await self._call("GET", f"/job/{job_id}", not_found=_JOB_MISSING)
        jobs = _parse(V0044OpenapiJobInfoResp, data, operation).jobs or []
        for job in jobs:
            if job.job_id == job_id:
                return job
        if jobs:  # an array or het job answers with its members; the first is the leader
            return jobs[0]
        raise SlurmNotFound(f"no job {job_id}", operation=operation, status=200)

    async def list_jobs(self, update_time: int | None = None) -> JobList:
        """All jobs, or none when no job changed since `update_time`; pass back `.update_time`.

        Observed on slurmctld 26.05 (and its `_slurm_rpc_dump_jobs`): update_time
        is all or nothing. slurmctld keeps ONE change time for all jobs; when it
        is >= update_time (the check is `update_time - 1 >= last_job_update` ->
        "no change"), the answer lists EVERY job, changed or not, with
        `last_update` = the time slurmctld packed that list. Otherwise the answer
        is 200, `jobs: []`, `last_update: 0` and a warning. job_info has no
        per-job change time to filter on, and `last_backfill` is about the
        backfill scheduler, not jobs.

        So the next update_time is the answer's `last_update` (kept unchanged
        after a "no change" answer). Nothing is missed: a job changes only under
        slurmctld's job write lock and is stamped with the time then, while the
        list is packed under the read lock, so any later change is stamped at or
        after `last_update` and the next call lists it (the `- 1` even adds a
        second of slack); a change within the same second as the packing merely
        lists all jobs once more. A non-empty answer is a complete snapshot: a
        job missing from it is gone (purged after MinJobAge).
        """
        params = {"update_time": str(update_time)} if update_time is not None else None
        data = await self._call("GET", "/jobs/", params=params, timeout=self.listing_timeout)
        answer = _parse(V0044OpenapiJobInfoResp, data, "GET /jobs/")
        packed_at = answer.last_update.number if answer.last_update and answer.last_update.set else None
        if not packed_at:
            return JobList(answer.jobs or [], update_time or 0)
        return JobList(answer.jobs or [], packed_at)

    async def job_states(
        self, job_ids: Collection[int], *, chunk_size: int = JOB_STATE_CHUNK
    ) -> dict[int, list[str]]:
        """The state (`["PENDING"]`, `["RUNNING"]`, ...) of each named job Slurm still knows.

        An id missing from the answer is a job Slurm no longer knows (purged after
        MinJobAge, or never existed). Cost grows with the ids asked for only:
        `GET /jobs/state/` answers ~80 bytes per job, in a few milliseconds.

        slurmrestd 26.05 wants the parameter repeated (`?job_id=1&job_id=2`): the
        CSV form its OpenAPI document describes (`?job_id=1,2`) answers HTTP 500,
        `1%2C2` 422. Ids come back as strings. Asked in chunks of at most
        `chunk_size` ids and MAX_QUERY_CHARS characters of query string.
        """
        states: dict[int, list[str]] = {}
        for chunk in _query_chunks(sorted(set(job_ids)), chunk_size):
            params = httpx.QueryParams([("job_id", str(job_id)) for job_id in chunk])
            data = await self._call("GET", "/jobs/state/", params=params)
            entries = data.get("jobs")
            if not isinstance(entries, list):
                raise SlurmError("unexpected answer: no jobs list", operation="GET /jobs/state/")
            for entry in entries:
                job_id, state = _state_entry(entry)
                states[job_id] = state
        return states

    async def cancel_job(self, job_id: int) -> None:
        """Cancel a job. A job that already ended counts as cancelled; an unknown one raises.

        slurmrestd answers 200 either way and reports per-job failures in
        `status[].error.code`: 2017 for an unknown job, 2021 for one already done.
        """
        operation = f"DELETE /job/{job_id}"
        data = await self._call("DELETE", f"/job/{job_id}", not_found=_JOB_MISSING)
        for entry in _parse(V0044OpenapiKillJobResp, data, operation).status or []:
            error = entry.error
            if error is None or not error.code or error.code == ESLURM_ALREADY_DONE:
                continue
            detail = SlurmErrorDetail(error.code, error.string or "", error.message or "")
            raise _error_for(200, (detail,), operation, not_found=_JOB_MISSING)

    async def get_job_resources(self, job_id: int) -> list[V0044NodeResourceLayout]:
        """Per node: sockets, cores (core_bitmap), memory and gres the job holds there."""
        data = await self._call("GET", f"/resources/{job_id}", not_found=_JOB_MISSING)
        return _parse(V0044OpenapiResourceLayoutResp, data, f"GET /resources/{job_id}").nodes or []

    # Nodes

    async def list_nodes(self) -> list[V0044Node]:
        data = await self._call("GET", "/nodes/")
        return _parse(V0044OpenapiNodesResp, data, "GET /nodes/").nodes or []

    async def get_node(self, name: str) -> V0044Node | None:
        """The node, or None when Slurm has no such node.

        An unknown node is not a 404: slurmrestd answers 200 with `nodes: null`
        and an error numbered 0 ("No error", "Failure to query node NAME").
        """
        path = f"/node/{_segment(name)}"
        data = await self._call("GET", path, tolerate=_only_unspecific_errors)
        nodes = _parse(V0044OpenapiNodesResp, data, f"GET {path}").nodes or []
        return next((node for node in nodes if node.name == name), None)

    async def update_node(self, name: str, update: V0044UpdateNodeMsg) -> None:
        """E.g. `UpdateNodeMsg(state=["DRAIN"], reason=...)`, `state=["UNDRAIN"]`."""
        await self._call("POST", f"/node/{_segment(name)}", body=update, not_found=_NODE_MISSING)

    async def create_node(self, node_conf: str) -> None:
        """`scontrol create`'s node line, e.g. `NodeName=n1 State=EXTERNAL CPUs=4 ...`."""
        body = V0044OpenapiCreateNodeReq(node_conf=node_conf)
        # An unparsable node_conf comes back as 500 "Unspecified error" (-1).
        await self._call("POST", "/new/node/", body=body, unspecified=SlurmRejected)

    async def delete_node(self, name: str) -> None:
        """Remove a dynamic node; one that still runs a job: SlurmRejected, error 2016."""
        await self._call("DELETE", f"/node/{_segment(name)}", not_found=_NODE_MISSING)

    # Partitions and controller

    async def get_partition(self, name: str) -> V0044PartitionInfo | None:
        """The partition, or None (slurmrestd: 200, no partitions, warning "Unable to find")."""
        path = f"/partition/{_segment(name)}"
        data = await self._call("GET", path)
        partitions = _parse(V0044OpenapiPartitionResp, data, f"GET {path}").partitions or []
        return next((partition for partition in partitions if partition.name == name), None)

    async def list_partitions(self) -> list[V0044PartitionInfo]:
        data = await self._call("GET", "/partitions/")
        return _parse(V0044OpenapiPartitionResp, data, "GET /partitions/").partitions or []

    async def ping(self, *, gated: bool = True) -> list[V0044ControllerPing]:
        """Each controller's answer. `responding` is False both when slurmctld is down
        and when the token is bad: slurmrestd answers 200 to /ping/ either way."""
        data = await self._call("GET", "/ping/", gated=gated)
        return _parse(V0044OpenapiPingArrayResp, data, "GET /ping/").pings or []

    async def probe(self) -> None:
        """The health probe (sent even while the gate is closed): SlurmError unless a
        controller responds to slurmrestd with this token."""
        pings = await self.ping(gated=False)
        if not any(ping.responding for ping in pings):
            asked = ", ".join(p.hostname or "?" for p in pings) or "none configured"
            raise SlurmUnavailable(
                f"no controller ({asked}) responds to slurmrestd: slurmctld is down or the token is refused",
                operation="GET /ping/",
                status=200,
            )

    # Plumbing

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: BaseModel | None = None,
        params: _Params | None = None,
        not_found: Collection[int] = (),
        unspecified: type[SlurmError] = SlurmUnavailable,
        tolerate: _Tolerate | None = None,
        timeout: httpx.Timeout | None = None,
        gated: bool = True,
    ) -> dict[str, Any]:
        """One request; its JSON object, or the SlurmError it amounts to."""
        gate = self.gate if gated else None
        if gate is not None and (refused := gate.refusal(operation_template(method, path))) is not None:
            if self.observer is not None:
                self.observer(operation_template(method, path), "NotSent", 0.0)
            raise refused
        started = time.perf_counter()
        outcome = "ok"
        try:
            return await self._request(
                method,
                path,
                body=body,
                params=params,
                not_found=not_found,
                unspecified=unspecified,
                tolerate=tolerate,
                timeout=timeout,
            )
        except SlurmError as error:
            outcome = type(error).__name__
            if gate is not None:
                gate.suspect(error)
            raise
        finally:
            if self.observer is not None:
                self.observer(operation_template(method, path), outcome, time.perf_counter() - started)

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: BaseModel | None,
        params: _Params | None,
        not_found: Collection[int],
        unspecified: type[SlurmError],
        tolerate: _Tolerate | None,
        timeout: httpx.Timeout | None,
    ) -> dict[str, Any]:
        operation = f"{method} {path}"
        headers = self._auth_headers(operation)
        json_body = request_body(body) if body is not None else None
        failure: str | None = None
        try:
            response = await self._http.request(
                method,
                path,
                headers=headers,
                params=params,
                json=json_body,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.TransportError as error:
            # Only the error's type and text are kept: the httpx exception holds the
            # request, whose headers hold the token, so it must not be chained.
            failure = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        if failure is not None:
            raise SlurmUnavailable(f"no answer from slurmrestd ({failure})", operation=operation)
        data = _check(response, operation, not_found=not_found, unspecified=unspecified, tolerate=tolerate)
        # The bridge's models are v0.0.44's: a v0.0.45 answer loses the few fields whose type changed.
        return as_v0044(data) if self.api_version != API_VERSION else data

    def _auth_headers(self, operation: str) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self.user_name:
            headers["X-SLURM-USER-NAME"] = self.user_name
        if self.token_file is not None:
            headers["X-SLURM-USER-TOKEN"] = self._read_token(operation)
        return headers

    def _read_token(self, operation: str) -> str:
        # Looked at on every request so a rotated token (a re-mounted Secret, a new
        # `scontrol token`) is used at once, but read only when the file changed: one
        # stat() instead of open, read and close on every request (each system call
        # gives up the GIL, which the workflow threads are waiting for). A Secret is
        # re-mounted by a symlink swap (a new inode); a rewrite changes the mtime, kept
        # in nanoseconds by Linux file systems.
        assert self.token_file is not None
        try:
            stat = os.stat(self.token_file)
            version = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
            if version == self._token_version and self._token:
                return self._token
            raw = self.token_file.read_text(encoding="utf-8")
        except OSError as error:
            reason = os.strerror(error.errno) if error.errno else type(error).__name__
            raise SlurmAuthError(
                f"cannot read token file {self.token_file}: {reason}", operation=operation
            ) from None
        token = raw.strip().removeprefix("SLURM_JWT=").strip()
        if not token:
            raise SlurmAuthError(f"token file {self.token_file} is empty", operation=operation)
        self._token, self._token_version = token, version
        return token


def _only_unspecific_errors(status: int, errors: tuple[SlurmErrorDetail, ...]) -> bool:
    return status == 200 and all(detail.number in _UNSPECIFIC_ERRORS for detail in errors)


def _check(
    response: httpx.Response,
    operation: str,
    *,
    not_found: Collection[int],
    unspecified: type[SlurmError],
    tolerate: _Tolerate | None,
) -> dict[str, Any]:
    status = response.status_code
    data = _json_object(response)
    errors = _error_details(data)
    _log_warnings(operation, data)
    log.debug("slurm %s -> %s", operation, status)
    if status >= 400 or errors:
        if tolerate is not None and tolerate(status, errors):
            return data if data is not None else {}
        if not errors and data is None:
            text = response.text.strip()[:200] or response.reason_phrase
            errors = (SlurmErrorDetail(None, text),)
        raise _error_for(status, errors, operation, not_found=not_found, unspecified=unspecified)
    if data is None:
        raise SlurmUnavailable(
            f"answer is not a JSON object ({response.headers.get('content-type', 'no content type')})",
            operation=operation,
            status=status,
        )
    return data


def _error_for(
    status: int,
    errors: tuple[SlurmErrorDetail, ...],
    operation: str,
    *,
    not_found: Collection[int],
    unspecified: type[SlurmError] = SlurmUnavailable,
) -> SlurmError:
    numbers = [detail.number for detail in errors if detail.number is not None]
    cls = classify(status, numbers, not_found=not_found, unspecified=unspecified)
    message = "; ".join(str(detail) for detail in errors) or f"HTTP {status}"
    return cls(message, operation=operation, status=status, errors=errors)


def _json_object(response: httpx.Response) -> dict[str, Any] | None:
    if not response.content:
        return None
    try:
        data = response.json()
    except ValueError:  # 401 and 400 come as text/plain
        return None
    return data if isinstance(data, dict) else None


def _error_details(data: Mapping[str, Any] | None) -> tuple[SlurmErrorDetail, ...]:
    raw = data.get("errors") if data is not None else None
    if not isinstance(raw, list):
        return ()
    return tuple(
        SlurmErrorDetail(
            number=entry.get("error_number") if isinstance(entry.get("error_number"), int) else None,
            error=str(entry.get("error") or ""),
            description=str(entry.get("description") or ""),
            source=str(entry.get("source") or ""),
        )
        for entry in raw
        if isinstance(entry, dict)
    )


def _log_warnings(operation: str, data: Mapping[str, Any] | None) -> None:
    raw = data.get("warnings") if data is not None else None
    for entry in raw if isinstance(raw, list) else []:
        if isinstance(entry, dict):
            log.debug("slurm %s warning: %s (%s)", operation, entry.get("description"), entry.get("source"))


def _parse(model: type[_Model], data: dict[str, Any], operation: str) -> _Model:
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        message = f"unexpected answer ({error.error_count()} validation errors), at {where}: {first['msg']}"
        raise SlurmError(message, operation=operation) from None


def _query_chunks(job_ids: Sequence[int], chunk_size: int) -> Iterator[list[int]]:
    """`job_ids` in runs of at most `chunk_size` ids and MAX_QUERY_CHARS of query string."""
    chunk: list[int] = []
    length = 0
    for job_id in job_ids:
        cost = len("job_id=&") + len(str(job_id))
        if chunk and (len(chunk) >= chunk_size or length + cost > MAX_QUERY_CHARS):
            yield chunk
            chunk, length = [], 0
        chunk.append(job_id)
        length += cost
    if chunk:
        yield chunk


def _state_entry(entry: object) -> tuple[int, list[str]]:
    """`{"job_id": "2059", "state": ["PENDING"]}` (the id is a string here) → (2059, ["PENDING"])."""
    operation = "GET /jobs/state/"
    if not isinstance(entry, dict):
        raise SlurmError(f"unexpected answer: job entry {entry!r}", operation=operation)
    raw_id, state = entry.get("job_id"), entry.get("state")
    try:
        job_id = int(raw_id) if isinstance(raw_id, int | str) else None
    except ValueError:
        job_id = None
    if job_id is None or not isinstance(state, list) or not all(isinstance(s, str) for s in state):
        raise SlurmError(f"unexpected answer: job entry {entry!r}", operation=operation)
    return job_id, list(state)


def _segment(name: str) -> str:
    return quote(name, safe="")
