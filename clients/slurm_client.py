"""Async client for slurmrestd (REST API v0.0.44, or v0.0.45: SLURM_API_VERSION): the only way to Slurm.

Messages are v0.0.44's models on either version (bridge/slurm_api/versions.py says why that holds).

One `httpx.AsyncClient`; the JWT file is looked at before every request and read
again whenever it changed (so a rotated token is picked up at once); the token is
kept in the client's memory only, never logged or put in an error.

Every failure is a `SlurmError` (clients/slurm_errors.py: which answer is which).

Timeouts and retries: point requests (one job, one node, the states of a few
hundred named jobs) wait `timeout`; listing every job (`list_jobs`: ~8 KB per
job, 16 MB and 0.7 s at 2,000 jobs on an otherwise idle 2-core slurmctld, 248 MiB
and 40 s at 30,000, slower on a busy one) waits `listing_timeout`. The client
retries nothing by itself but a read that met a kept-alive connection out of step
(asked once more, on another connection): its callers do, with backoff (Temporal's
activity retry policy, the job watcher's exponential backoff, the signal
delivery's), so a slow slurmrestd is never asked again at once.

Its size (about 670 lines) is one method per slurmrestd call; how answers become errors
is clients/slurm_errors.py's.
"""

import contextlib
import logging
import os
import re
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple, Protocol, Self, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from bridge.models import ENDED_JOB_STATES
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
from clients.slurm_errors import (
    ESLURM_ALREADY_DONE,
    JOB_MISSING,
    NODE_MISSING,
    SUBMIT_BUSY,
    SlurmAuthError,
    SlurmBusy,
    SlurmError,
    SlurmErrorDetail,
    SlurmNotFound,
    SlurmRejected,
    SlurmUnavailable,
    Tolerate,
    check_answer,
    error_for,
    json_object,
    only_unspecific_errors,
    parse_answer,
)

log = logging.getLogger(__name__)

_Model = TypeVar("_Model", bound=BaseModel)


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


class RawAnswer(NamedTuple):
    """`get_raw`'s answer, as slurmrestd sent it: not classified, not parsed into models."""

    status: int
    reason: str  # the HTTP reason phrase: all an answer without a JSON body says
    data: dict[str, Any] | None  # the body's JSON object; None for anything else (an error page, nothing)


# Query parameters: a mapping, or QueryParams when a name repeats (`job_id=1&job_id=2`).
_Params = Mapping[str, str] | httpx.QueryParams


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
        listing_timeout: float = 240.0,
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
        # Listing every job: megabytes from a slurmrestd that may be busy, and one given up on
        # is built to the end all the same; within the submission's 5-minute attempt
        # (workflows/placement.py). Connecting still fails as fast as for any other request.
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
        return await self._submit(V0044JobSubmitReq(job=job))

    async def submit_het_job(self, components: Sequence[V0044JobDescMsg]) -> int:
        """Submit ONE heterogeneous job of `components` (for the bridge: EXTERNAL_JOBs); the leader's id.

        Each component carries its own size (`nodes`, `cpus_per_task`, `memory_per_node`,
        `shared`...) and its own `comment`/`admin_comment`: Slurm keeps a comment on the
        component it was given to only, so set it on every component a reader may look at.
        Seen on slurmctld 26.05.5 (v0.0.44, `{"jobs": [...]}`): the answer's job_id is
        component 0's (the leader); the components get consecutive ids, leader + offset,
        each with `het_job_id` = the leader and `het_job_offset` 0, 1, ... (`het_job_id_set`
        "L-L+n"); they are scheduled together (all PENDING, then all RUNNING in one pass);
        `cancel_job(leader)` cancels every component, while cancelling a non-leader id
        cancels that component ALONE (the others keep running). A one-element list is a
        het job of one component (`het_job_id` = its id, state id "N+0"). Errors as for
        `submit_job`: a bad component is refused whole (422, error 2000 "HetJob submission
        failed" for an unknown partition in component 1), a field of the wrong type in
        any component is 200 with a warning and no job_id (SlurmRejected).
        """
        if not components:
            # slurmrestd: 500, error 11 "Refusing HetJob submission without any components".
            raise ValueError("a heterogeneous job needs at least one component")
        return await self._submit(V0044JobSubmitReq(jobs=list(components)))

    async def _submit(self, body: V0044JobSubmitReq) -> int:
        try:
            data = await self._call("POST", "/job/submit", body=body)
        except SlurmRejected as error:
            if not error.error_numbers & SUBMIT_BUSY:
                raise
            raise SlurmBusy(
                error.message, operation=error.operation, status=error.status, errors=error.errors
            ) from None
        answer = parse_answer(V0044OpenapiJobSubmitResponse, data, "POST /job/submit")
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
        data = await self._call("POST", f"/job/{job_id}", body=job, not_found=JOB_MISSING)
        answer = parse_answer(V0044OpenapiJobPostResponse, data, operation)
        for result in answer.results or []:
            if result.error_code:
                detail = SlurmErrorDetail(result.error_code, result.error or "", result.why or "")
                raise error_for(200, (detail,), operation, not_found=JOB_MISSING)

    async def get_job(self, job_id: int) -> V0044JobInfo:
        operation = f"GET /job/{job_id}"
        data = await self._call("GET", f"/job/{job_id}", not_found=JOB_MISSING)
        jobs = parse_answer(V0044OpenapiJobInfoResp, data, operation).jobs or []
        for job in jobs:
            if job.job_id == job_id:
                return job
        if jobs:  # an array or het job answers with its members; the first is the leader
            return jobs[0]
        raise SlurmNotFound(f"no job {job_id}", operation=operation, status=200)

    async def get_job_components(self, job_id: int) -> list[V0044JobInfo]:
        """Every component of the job `job_id` belongs to, sorted by `het_job_offset`; an
        ordinary job is a one-element list.

        Measured on slurmctld 26.05.5 (v0.0.44), a het job L of components L, L+1, L+2:
        `GET /job/L` answers every component once, in offset order; `GET /job/L+1` answers
        that component alone (once here; ../shared/slurm/README.md saw it twice), with
        `het_job_id` L. So for a non-leader id the leader is read too (a second request)
        and the whole het job comes back: the component named is one of them. Should the
        leader's own GET answer 404 (not seen: it would mean the leader was purged before
        its components) the components at hand are returned. An ordinary job has
        `het_job_id` 0 (set) and `het_job_offset` 0. Components are de-duplicated by job id.
        """
        jobs = await self._job_answer(job_id)
        own = next((job for job in jobs if job.job_id == job_id), jobs[0] if jobs else None)
        if own is None:
            raise SlurmNotFound(f"no job {job_id}", operation=f"GET /job/{job_id}", status=200)
        leader = _het_leader(own)
        if leader is None:
            return [own]
        if not any(job.job_id == leader for job in jobs):
            with contextlib.suppress(SlurmNotFound):  # purged: the components at hand are all
                jobs = [*jobs, *await self._job_answer(leader)]
        components: dict[int, V0044JobInfo] = {}
        for job in jobs:
            if job.job_id is not None and _het_leader(job) == leader:
                components.setdefault(job.job_id, job)
        return sorted(components.values(), key=_het_offset)

    async def _job_answer(self, job_id: int) -> list[V0044JobInfo]:
        data = await self._call("GET", f"/job/{job_id}", not_found=JOB_MISSING)
        return parse_answer(V0044OpenapiJobInfoResp, data, f"GET /job/{job_id}").jobs or []

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
        answer = parse_answer(V0044OpenapiJobInfoResp, data, "GET /jobs/")
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

        A heterogeneous job is answered under its LEADER's id, with one state for the
        whole job. Measured on slurmctld 26.05.5 (v0.0.44), het job 3056 of components
        3056, 3057, 3058: `?job_id=3056` answers every component, each as "<its own
        id>+<offset>": "3056+0", "3057+1", "3058+2", in offset order; `?job_id=3057`
        answers "3057+1" alone; `?job_id=3056&job_id=3057` lists "3057+1" twice (once for
        the leader, once for itself), so duplicates are expected, across chunks too. An
        ordinary job stays "3055". The entries carry no het_job_id: the leader is id -
        offset, as a het job's component ids are consecutive (each component's
        `het_job_id` is that leader, checked on the bed). A non-leader id asked alone is
        thus reported under its leader's id. The components' states combine into one:
        the first ended component's (ENDED_JOB_STATES; cancelling a non-leader id ends
        that component alone, the others stay RUNNING), else the first PENDING one's,
        else the leader's (the lowest offset listed).
        """
        states: dict[int, list[str]] = {}
        het_jobs: dict[int, dict[int, list[str]]] = {}  # leader -> offset -> that component's states
        for chunk in _query_chunks(sorted(set(job_ids)), chunk_size):
            params = httpx.QueryParams([("job_id", str(job_id)) for job_id in chunk])
            data = await self._call("GET", "/jobs/state/", params=params)
            entries = data.get("jobs")
            if not isinstance(entries, list):
                raise SlurmError("unexpected answer: no jobs list", operation="GET /jobs/state/")
            for entry in entries:
                job_id, offset, state = _state_entry(entry)
                if offset is None:
                    states[job_id] = state
                else:
                    het_jobs.setdefault(job_id, {})[offset] = state
        for leader, components in het_jobs.items():
            states[leader] = _het_job_state(components)
        return states

    async def jobs_started(self) -> int:
        """How many jobs slurmctld started since its statistics were reset (`GET /diag/`, as `sdiag`).

        Every job start goes through slurmctld's one start path, which counts it once the job
        is RUNNING: while the count stays the same, no pending job started. The job watcher
        asks this (one answer of constant size, whatever the number of jobs) before probing
        thousands of pending jobs' states. The count restarts at midnight and with slurmctld:
        any change, downwards too, is a change. (slurmctld's count of cancelled jobs is no
        such signal: a cancel through slurmrestd leaves it unchanged, seen on 26.05.)
        """
        data = await self._call("GET", "/diag/")
        stats = data.get("statistics")
        started = stats.get("jobs_started") if isinstance(stats, dict) else None
        if not isinstance(started, int) or isinstance(started, bool):
            raise SlurmError("unexpected answer: no jobs_started in statistics", operation="GET /diag/")
        return started

    async def cancel_job(self, job_id: int) -> None:
        """Cancel a job. A job that already ended counts as cancelled; an unknown one raises.

        slurmrestd answers 200 either way and reports per-job failures in
        `status[].error.code`: 2017 for an unknown job, 2021 for one already done.
        """
        operation = f"DELETE /job/{job_id}"
        data = await self._call("DELETE", f"/job/{job_id}", not_found=JOB_MISSING)
        for entry in parse_answer(V0044OpenapiKillJobResp, data, operation).status or []:
            error = entry.error
            if error is None or not error.code or error.code == ESLURM_ALREADY_DONE:
                continue
            detail = SlurmErrorDetail(error.code, error.string or "", error.message or "")
            raise error_for(200, (detail,), operation, not_found=JOB_MISSING)

    async def get_job_resources(self, job_id: int) -> list[V0044NodeResourceLayout]:
        """Per node: sockets, cores (core_bitmap), memory and gres the job holds there."""
        data = await self._call("GET", f"/resources/{job_id}", not_found=JOB_MISSING)
        return parse_answer(V0044OpenapiResourceLayoutResp, data, f"GET /resources/{job_id}").nodes or []

    # Nodes

    async def list_nodes(self) -> list[V0044Node]:
        data = await self._call("GET", "/nodes/")
        return parse_answer(V0044OpenapiNodesResp, data, "GET /nodes/").nodes or []

    async def get_node(self, name: str) -> V0044Node | None:
        """The node, or None when Slurm has no such node.

        An unknown node is not a 404: slurmrestd answers 200 with `nodes: null`
        and an error numbered 0 ("No error", "Failure to query node NAME").
        """
        path = f"/node/{_segment(name)}"
        data = await self._call("GET", path, tolerate=only_unspecific_errors)
        nodes = parse_answer(V0044OpenapiNodesResp, data, f"GET {path}").nodes or []
        return next((node for node in nodes if node.name == name), None)

    async def update_node(self, name: str, update: V0044UpdateNodeMsg) -> None:
        """E.g. `UpdateNodeMsg(state=["DRAIN"], reason=...)`, `state=["UNDRAIN"]`."""
        await self._call("POST", f"/node/{_segment(name)}", body=update, not_found=NODE_MISSING)

    async def create_node(self, node_conf: str) -> None:
        """`scontrol create`'s node line, e.g. `NodeName=n1 State=EXTERNAL CPUs=4 ...`."""
        body = V0044OpenapiCreateNodeReq(node_conf=node_conf)
        # An unparsable node_conf comes back as 500 "Unspecified error" (-1).
        await self._call("POST", "/new/node/", body=body, unspecified=SlurmRejected)

    async def delete_node(self, name: str) -> None:
        """Remove a dynamic node; one that still runs a job: SlurmRejected, error 2016."""
        await self._call("DELETE", f"/node/{_segment(name)}", not_found=NODE_MISSING)

    # Partitions and controller

    async def get_partition(self, name: str) -> V0044PartitionInfo | None:
        """The partition, or None (slurmrestd: 200, no partitions, warning "Unable to find")."""
        path = f"/partition/{_segment(name)}"
        data = await self._call("GET", path)
        partitions = parse_answer(V0044OpenapiPartitionResp, data, f"GET {path}").partitions or []
        return next((partition for partition in partitions if partition.name == name), None)

    async def list_partitions(self) -> list[V0044PartitionInfo]:
        data = await self._call("GET", "/partitions/")
        return parse_answer(V0044OpenapiPartitionResp, data, "GET /partitions/").partitions or []

    async def ping(self, *, gated: bool = True) -> list[V0044ControllerPing]:
        """Each controller's answer. `responding` is False both when slurmctld is down
        and when the token is bad: slurmrestd answers 200 to /ping/ either way."""
        data = await self._call("GET", "/ping/", gated=gated)
        return parse_answer(V0044OpenapiPingArrayResp, data, "GET /ping/").pings or []

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

    # Diagnostics

    async def get_raw(self, path: str) -> RawAnswer:
        """`GET path` (e.g. `/diag/`) with this client's token, user and API version; any HTTP
        answer, whatever its status, comes back as it is.

        For `slurm-bridge doctor`, which tells a refused token from a silent slurmctld by
        the answer's own status and error numbers and words each in its own way. Only no
        answer at all raises: SlurmUnavailable "no answer (ConnectError)", naming the kind
        of failure; an unreadable token file raises SlurmAuthError, as for any request.
        Not gated (a diagnosis asks even while Slurm is thought away, as `probe` does),
        not told to the observer (it is no request of the bridge's work), and the body is
        not adapted to v0.0.44 (no model reads it).
        """
        operation = f"GET {path}"
        headers = self._auth_headers(operation)
        failure: str | None = None
        try:
            response = await self._http.get(path, headers=headers)
        except httpx.TransportError as error:
            # As in _request: the httpx exception holds the token, so it must not be chained.
            failure = type(error).__name__
        if failure is not None:
            raise SlurmUnavailable(f"no answer ({failure})", operation=operation)
        log.debug("slurm %s -> %s", operation, response.status_code)
        return RawAnswer(response.status_code, response.reason_phrase, json_object(response))

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
        tolerate: Tolerate | None = None,
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
        tolerate: Tolerate | None,
        timeout: httpx.Timeout | None,
    ) -> dict[str, Any]:
        operation = f"{method} {path}"
        headers = self._auth_headers(operation)
        json_body = request_body(body) if body is not None else None
        failure: str | None = None
        # A read meeting a kept-alive connection out of step (bytes before the status
        # line; closed as the request went out) is asked again, once: httpcore has
        # dropped that connection, so the second try goes on another. Seen once in CI
        # against slurmrestd 26.05. A write is never sent twice: Slurm may have acted on it.
        attempts = 2 if method == "GET" else 1
        for attempt in range(1, attempts + 1):
            try:
                response = await self._http.request(
                    method,
                    path,
                    headers=headers,
                    params=params,
                    json=json_body,
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                )
            except httpx.RemoteProtocolError as error:
                failure = _failure(error)
                if attempt < attempts:
                    log.info("slurm %s: %s; asking again on another connection", operation, failure)
                    continue
            except httpx.TransportError as error:
                failure = _failure(error)
            else:
                failure = None
            break
        if failure is not None:
            raise SlurmUnavailable(f"no answer from slurmrestd ({failure})", operation=operation)
        data = check_answer(
            response, operation, not_found=not_found, unspecified=unspecified, tolerate=tolerate
        )
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


def _failure(error: httpx.TransportError) -> str:
    # Only the error's type and text are kept: the httpx exception holds the request,
    # whose headers hold the token, so it must not be chained.
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


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


# A heterogeneous job's component in `GET /jobs/state/`: "<component id>+<offset>".
_HET_STATE_ID = re.compile(r"([0-9]+)\+([0-9]+)")
_JOB_STATE_ID = re.compile(r"[0-9]+")


class _StateEntry(NamedTuple):
    job_id: int  # the job's own id; for a het job's component, the LEADER's
    offset: int | None  # a het job's component: its het_job_offset; None for an ordinary job
    state: list[str]


def _state_entry(entry: object) -> _StateEntry:
    """`{"job_id": "2059", "state": ["PENDING"]}` (the id is a string here) → (2059, None, ["PENDING"]);
    a het job's component `{"job_id": "3052+1", ...}` → (3051, 1, [...]): its leader and offset.

    26.05.5 sends no `het_job_id` in these entries, so the leader is the component's id
    minus its offset (a het job's ids are consecutive); a `het_job_id` in the entry (a
    number, or a set number struct) would name the leader itself and is used first.
    """
    operation = "GET /jobs/state/"
    if not isinstance(entry, dict):
        raise SlurmError(f"unexpected answer: job entry {entry!r}", operation=operation)
    raw_id, state = entry.get("job_id"), entry.get("state")
    if not isinstance(state, list) or not all(isinstance(s, str) for s in state):
        raise SlurmError(f"unexpected answer: job entry {entry!r}", operation=operation)
    het = _HET_STATE_ID.fullmatch(raw_id) if isinstance(raw_id, str) else None
    if het is not None:
        offset = int(het.group(2))
        leader = _number(entry.get("het_job_id")) or int(het.group(1)) - offset
        if leader < 1:
            raise SlurmError(f"unexpected answer: job entry {entry!r}", operation=operation)
        return _StateEntry(leader, offset, list(state))
    # Digits only: int() would also read "3_1" (an array task's form) as 31, and "+1" as 1.
    if isinstance(raw_id, int) or (isinstance(raw_id, str) and _JOB_STATE_ID.fullmatch(raw_id)):
        return _StateEntry(int(raw_id), None, list(state))
    raise SlurmError(f"unexpected answer: job entry {entry!r}", operation=operation)


def _number(value: object) -> int | None:
    """A positive integer given as `5`, `"5"` or `{"set": true, "number": 5}`; None otherwise."""
    if isinstance(value, dict):
        value = value.get("number") if value.get("set") else None
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _het_job_state(components: Mapping[int, list[str]]) -> list[str]:
    """One state for a het job from its components' (by offset): the first ended component's,
    else the first pending one's, else the leader's (the lowest offset at hand)."""
    by_offset = [components[offset] for offset in sorted(components)]
    for state in by_offset:
        if ENDED_JOB_STATES.intersection(state):
            return state
    for state in by_offset:
        if "PENDING" in state:
            return state
    return by_offset[0]


def _het_leader(job: V0044JobInfo) -> int | None:
    """The het job's leader id; None for an ordinary job (`het_job_id` 0)."""
    het = job.het_job_id
    return het.number if het is not None and het.set and het.number else None


def _het_offset(job: V0044JobInfo) -> int:
    offset = job.het_job_offset
    return (offset.number or 0) if offset is not None and offset.set else 0


def _segment(name: str) -> str:
    return quote(name, safe="")
