"""The Slurm side of the benchmark: clients that keep timestamps, foreign jobs, slurmctld's own clock.

* `ActivitySlurm` is the activities' `SlurmClient`; `WatcherSlurm` the job
  watcher's (its own connection). Both count requests by operation (method and
  path with ids folded), with response bytes and time to headers; a listing of
  every job (`GET /jobs/`) is one operation of its own, so it is never hidden.
* `running_times` reads when slurmctld started each job from its log
  (`LogTimeFormat=iso8601_ms`: milliseconds, on the same machine clock), and
  `scheduler_passes` groups those starts into slurmctld's scheduling passes.
"""

import asyncio
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from bench.probes import CountingTransport
from bridge.slurm_api.v0044 import V0044JobDescMsg, V0044JobInfo
from clients.slurm_client import JOB_STATE_CHUNK, SlurmClient
from testbed.slurm_bed import SlurmTestBed

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
    """The job watcher's Slurm client: when its probe first saw each job RUNNING (its requests counted)."""

    def __init__(self, *args: Any, counter: CountingTransport, **kwargs: Any) -> None:
        super().__init__(*args, transport=counter, **kwargs)
        self.counter = counter
        self.probed_running: dict[int, float] = {}  # job id → first `GET /jobs/state/` that said RUNNING
        self.read_running: dict[int, float] = {}  # job id → first `GET /job/{id}` that said RUNNING
        self.reasons: dict[int, list[str]] = {}  # job id → pending reasons read
        self.running = asyncio.Event()  # cleared: the watcher's next request waits (a control window)
        self.running.set()

    async def job_states(
        self, job_ids: Collection[int], *, chunk_size: int = JOB_STATE_CHUNK
    ) -> dict[int, list[str]]:
        await self.running.wait()
        states = await super().job_states(job_ids, chunk_size=chunk_size)
        now = time.time()
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


# Starts logged this close together came from one scheduling pass (a pass over a few hundred
# pending jobs takes a few ms on the bed; passes are a second or ~0.3 s apart).
SAME_PASS_SECONDS = 0.05


@dataclass
class SchedulerPass:
    """One slurmctld scheduling pass that started some of the run's jobs."""

    at: float  # Unix time of its first start
    jobs: int
    scheduler: str  # "main" or "backfill"
    last: float = 0.0  # its latest start so far

    def __post_init__(self) -> None:
        self.last = self.last or self.at


def scheduler_passes(starts: Iterable[tuple[float, str]]) -> list[SchedulerPass]:
    """Job starts (time, scheduler) grouped into the passes that made them, in time order.

    slurmctld starts a submitted job only in a scheduling pass: the main scheduler's, which its
    background loop runs on whole seconds (`_slurmctld_background` waits until the next second,
    then runs `schedule()` for the jobs queued meanwhile), or a backfill pass (every
    `bf_interval`). A pod therefore waits for the next pass after its job is submitted.
    """
    passes: list[SchedulerPass] = []
    for at, scheduler in sorted(starts):
        current = passes[-1] if passes else None
        if current is not None and current.scheduler == scheduler and at - current.last <= SAME_PASS_SECONDS:
            current.jobs += 1
            current.last = at
        else:
            passes.append(SchedulerPass(at=at, jobs=1, scheduler=scheduler))
    return passes


def start_passes(bed: SlurmTestBed, job_ids: Iterable[int]) -> list[SchedulerPass]:
    """The passes that started these jobs, from slurmctld's log; empty when it cannot be read."""
    try:
        starts = bed.job_starts(job_ids)
    except OSError:
        return []
    return scheduler_passes((at.timestamp(), scheduler) for at, scheduler in starts.values())
