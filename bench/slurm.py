"""The Slurm side of the benchmark: clients that keep timestamps, foreign jobs, slurmctld's own clock.

* `ActivitySlurm` is the activities' `SlurmClient`; `WatcherSlurm` the job
  watcher's (its own connection). Both count requests by operation (method and
  path with ids folded), with response bytes and time to headers; a listing of
  every job (`GET /jobs/`) is one operation of its own, so it is never hidden.
* `running_times` reads when slurmctld started each job from its log
  (`LogTimeFormat=iso8601_ms`: milliseconds, on the same machine clock).
"""

import asyncio
import time
from collections.abc import Collection, Iterable
from typing import Any

from activities.slurm_client import JOB_STATE_CHUNK, SlurmClient
from bench.probes import CountingTransport
from bridge.slurm_api.v0044 import V0044JobDescMsg, V0044JobInfo
from tests.slurm_bed import SlurmTestBed

LISTING = "GET /jobs/"  # every job slurmctld holds: the request the normal path must not make


def _running(states: Iterable[str] | None) -> bool:
    return "RUNNING" in (states or ())


def _note_reason(reasons: dict[int, list[str]], job: V0044JobInfo) -> None:
    """The pending reasons a job showed the bridge, in order, each once."""
    if job.job_id is None or "PENDING" not in (job.job_state or ()):
        return
    seen = reasons.setdefault(job.job_id, [])
    reason = str(job.state_reason or "")
    if reason not in seen:
        seen.append(reason)


class ActivitySlurm(SlurmClient):
    """The activities' Slurm client: when each job was submitted, first read RUNNING, and cancelled."""

    def __init__(self, *args: Any, counter: CountingTransport, **kwargs: Any) -> None:
        super().__init__(*args, transport=counter, **kwargs)
        self.counter = counter
        self.submitted: dict[int, float] = {}  # job id → submit answered
        self.read_running: dict[int, float] = {}  # job id → first GET /job/{id} that said RUNNING
        self.reasons: dict[int, list[str]] = {}  # job id → pending reasons read
        self.cancelled: dict[int, float] = {}  # job id → cancel answered

    async def submit_job(self, job: V0044JobDescMsg) -> int:
        job_id = await super().submit_job(job)
        self.submitted[job_id] = time.time()
        return job_id

    async def get_job(self, job_id: int) -> V0044JobInfo:
        job = await super().get_job(job_id)
        _note_reason(self.reasons, job)
        if _running(job.job_state):
            self.read_running.setdefault(job_id, time.time())
        return job

    async def cancel_job(self, job_id: int) -> None:
        await super().cancel_job(job_id)
        self.cancelled.setdefault(job_id, time.time())


class WatcherSlurm(SlurmClient):
    """The job watcher's Slurm client: when its probe first saw each job RUNNING, and each pass."""

    def __init__(self, *args: Any, counter: CountingTransport, **kwargs: Any) -> None:
        super().__init__(*args, transport=counter, **kwargs)
        self.counter = counter
        self.probed_running: dict[int, float] = {}  # job id → first `GET /jobs/state/` that said RUNNING
        self.read_running: dict[int, float] = {}  # job id → first `GET /job/{id}` that said RUNNING
        self.reasons: dict[int, list[str]] = {}  # job id → pending reasons read
        self.passes: list[tuple[float, int]] = []  # (answered at, job ids asked about)
        self.running = asyncio.Event()  # cleared: the watcher's next request waits (a control window)
        self.running.set()

    async def job_states(
        self, job_ids: Collection[int], *, chunk_size: int = JOB_STATE_CHUNK
    ) -> dict[int, list[str]]:
        await self.running.wait()
        states = await super().job_states(job_ids, chunk_size=chunk_size)
        now = time.time()
        self.passes.append((now, len(job_ids)))
        for job_id, state in states.items():
            if _running(state):
                self.probed_running.setdefault(job_id, now)
        return states

    async def get_job(self, job_id: int) -> V0044JobInfo:
        job = await super().get_job(job_id)
        _note_reason(self.reasons, job)
        if _running(job.job_state):
            self.read_running.setdefault(job_id, time.time())
        return job


def running_times(bed: SlurmTestBed, job_ids: Iterable[int]) -> dict[int, float]:
    """When slurmctld started each job (Unix time, ms precision), from its log; absent: no line."""
    try:
        starts = bed.job_start_times(job_ids)
    except OSError:
        return {}
    return {job_id: at.timestamp() for job_id, at in starts.items()}
