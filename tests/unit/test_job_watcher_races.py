"""The job watcher's pass on stand-ins for Slurm and Temporal, while its answers are out: the
followed jobs change (the pod watcher forgets a job whenever its last pod goes), and a start
reaches its placement without waiting for the running jobs' probe, older jobs' probes or the
pending reasons' re-reads (at a site's size, 5,000 running and 5,000 pending jobs, one pass's
probes and its 20 re-reads took seconds under a busy slurmctld). And what a pass costs when
little is due: at 10,000 followed jobs, four passes a second."""

import asyncio
import json
import logging
from typing import Any, cast

import pytest
from temporalio.client import Client

from bridge.models import JobEvent
from clients.slurm_client import SlurmClient
from clients.slurm_errors import SlurmNotFound
from worker.job_registry import LiveJobs
from worker.job_watcher import (
    MAX_REFRESHES,
    PENDING_REFRESH_SECONDS,
    PROBE_GROUP,
    REFRESH_CHOICE_SECONDS,
    RUNNING_PROBE_SECONDS,
    JobWatcher,
)

PLACEMENT = "placement/site/team/p/uid-1@uid-1"
RUNNING_JOB, PENDING_JOB = 1, 2
TIMEOUT = 5.0


class Slurm:
    """Jobs as Slurm has them; a probe naming a held id, or a read of one, waits for `release`."""

    def __init__(self) -> None:
        self.states = {RUNNING_JOB: ["RUNNING"], PENDING_JOB: ["PENDING"]}
        self.reason = "Resources"
        self.started = 0  # slurmctld's count of started jobs
        self.hold_probes: set[int] = set()
        self.hold_reads: set[int] = set()
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def jobs_started(self) -> int:
        return self.started

    async def job_states(self, job_ids: list[int]) -> dict[int, list[str]]:
        if self.hold_probes.intersection(job_ids):
            await self._held()
        return {job_id: list(self.states[job_id]) for job_id in job_ids if job_id in self.states}

    async def get_job_components(self, job_id: int) -> list[dict[str, Any]]:
        if job_id not in self.states:
            raise SlurmNotFound(f"job {job_id} not found", operation="GET /job/{job_id}", status=404)
        answer = {
            "job_id": job_id,
            "job_state": list(self.states[job_id]),
            "state_reason": self.reason if self.states[job_id] == ["PENDING"] else "None",
            "comment": PLACEMENT,
            "admin_comment": json.dumps({"pods": ["team/p"]}),
            "nodes": "n1" if "RUNNING" in self.states[job_id] else "",
        }
        if job_id in self.hold_reads:
            await self._held()
        return [answer]

    def start(self, job_id: int) -> None:
        self.states[job_id] = ["RUNNING"]
        self.started += 1

    async def _held(self) -> None:
        self.holding.set()
        await self.release.wait()


class Signals:
    """Temporal as the watcher sees it: every `job_changed` event, in the order delivered."""

    def __init__(self) -> None:
        self.events: list[JobEvent] = []
        self.arrived = asyncio.Condition()

    def get_workflow_handle(self, workflow_id: str) -> "Signals":
        return self

    async def signal(self, _signal: object, event: JobEvent) -> None:
        async with self.arrived:
            self.events.append(event)
            self.arrived.notify_all()

    async def told(self, job_id: int, state: str) -> None:
        """Until the job was told in `state` ("gone": Slurm does not know it)."""

        def arrived() -> bool:
            return any(
                e.job_id == job_id and (state in e.states or (e.gone and state == "gone"))
                for e in self.events
            )

        async with self.arrived:
            await asyncio.wait_for(self.arrived.wait_for(arrived), TIMEOUT)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watcher_of(slurm: Slurm, signals: Signals, clock: Clock) -> JobWatcher:
    jobs = LiveJobs()
    for job_id in slurm.states:
        jobs.track(job_id, PLACEMENT)
    return JobWatcher(
        cast(SlurmClient, slurm),
        cast(Client, signals),
        jobs,
        installation="site",
        ready=asyncio.Event(),
        interval=0.25,
        pending_reason_grace=0.0,
        clock=clock,
    )


async def first_pass(watcher: JobWatcher, signals: Signals) -> None:
    """Both jobs read once: one told RUNNING, the other its pending reason."""
    await watcher.poll()
    await watcher.wait_idle()
    await signals.told(RUNNING_JOB, "RUNNING")
    await signals.told(PENDING_JOB, "PENDING")


async def test_a_job_forgotten_while_its_read_is_out_is_neither_signalled_nor_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    slurm, signals = Slurm(), Signals()
    slurm.states = {7: ["RUNNING"]}
    slurm.hold_reads = {7}
    watcher = watcher_of(slurm, signals, Clock())
    caplog.set_level(logging.INFO, logger="worker.job_watcher")

    passing = asyncio.create_task(watcher.poll())
    await asyncio.wait_for(slurm.holding.wait(), TIMEOUT)  # the pass reads the job it has not seen yet
    watcher.jobs.forget(7)  # meanwhile its last pod went
    slurm.release.set()
    await passing
    await watcher.wait_idle()

    assert signals.events == []
    assert "Slurm job 7" not in caplog.text
    await watcher.close()


async def test_a_start_is_told_while_the_running_jobs_probe_is_still_out() -> None:
    slurm, signals, clock = Slurm(), Signals(), Clock()
    watcher = watcher_of(slurm, signals, clock)
    await first_pass(watcher, signals)

    clock.now += RUNNING_PROBE_SECONDS  # the running job is due for its probe too
    slurm.start(PENDING_JOB)
    slurm.hold_probes = {RUNNING_JOB}
    passing = asyncio.create_task(watcher.poll())
    await signals.told(PENDING_JOB, "RUNNING")

    assert slurm.holding.is_set()  # the running job's probe is still out
    assert not passing.done()
    slurm.release.set()
    await passing
    await watcher.close()


async def test_a_pass_does_not_wait_for_pending_reasons_and_a_later_start_is_not_undone() -> None:
    slurm, signals, clock = Slurm(), Signals(), Clock()
    watcher = watcher_of(slurm, signals, clock)
    await first_pass(watcher, signals)

    clock.now += PENDING_REFRESH_SECONDS  # the pending job is due for a re-read of its reason
    slurm.reason = "Priority"
    slurm.hold_reads = {PENDING_JOB}
    await asyncio.wait_for(watcher.poll(), TIMEOUT)  # done while its re-read is out
    await asyncio.wait_for(slurm.holding.wait(), TIMEOUT)
    gets = watcher.job_gets

    slurm.start(PENDING_JOB)  # the job starts while the re-read is out
    await asyncio.wait_for(watcher.poll(), TIMEOUT)
    await signals.told(PENDING_JOB, "RUNNING")
    slurm.release.set()  # the re-read answers as the job was when it was asked: pending
    await watcher.wait_idle()

    told = [event for event in signals.events if event.job_id == PENDING_JOB]
    assert told[-1].states == ["RUNNING"]  # the stale pending answer told nobody
    assert watcher.job_gets == gets + 1  # the re-read out was not asked again meanwhile
    await watcher.close()


async def test_the_newest_jobs_are_probed_first_and_their_starts_told_before_the_older_answer() -> None:
    slurm, signals, clock = Slurm(), Signals(), Clock()
    older = list(range(100, 100 + PROBE_GROUP))  # a whole group of jobs waiting longer
    slurm.states.update({job_id: ["PENDING"] for job_id in older})
    newest = older[-1] + 1
    slurm.states[newest] = ["PENDING"]
    watcher = watcher_of(slurm, signals, clock)
    await first_pass(watcher, signals)

    slurm.start(newest)
    slurm.hold_probes = {older[0]}  # the older jobs' group answers late
    passing = asyncio.create_task(watcher.poll())
    await signals.told(newest, "RUNNING")

    assert slurm.holding.is_set()
    assert not passing.done()
    slurm.release.set()
    await passing
    await watcher.close()


async def test_a_running_job_slurm_no_longer_knows_is_told_gone() -> None:
    """slurmctld restarted without its state, or an operator purged the job: the probe's answer
    leaves it out, and that is news (it was once taken for no change, and the pods kept running
    until their placement's own slow re-check)."""
    slurm, signals, clock = Slurm(), Signals(), Clock()
    watcher = watcher_of(slurm, signals, clock)
    await first_pass(watcher, signals)

    del slurm.states[RUNNING_JOB]
    clock.now += RUNNING_PROBE_SECONDS
    await asyncio.wait_for(watcher.poll(), TIMEOUT)
    await signals.told(RUNNING_JOB, "gone")
    await watcher.close()


async def test_a_pass_walks_the_followed_jobs_only_when_one_may_be_due() -> None:
    slurm, signals, clock = Slurm(), Signals(), Clock()
    watcher = watcher_of(slurm, signals, clock)
    await first_pass(watcher, signals)  # probes both jobs (the running one due again 2 s later)
    clock.now += 0.25
    await watcher.poll()  # what the first pass read is new: walked once more
    walked = watcher.walks

    # Nothing started and no probe due: the passes ask slurmctld's count alone.
    for _ in range(int(RUNNING_PROBE_SECONDS / 0.25) - 2):
        clock.now += 0.25
        await watcher.poll()
    assert watcher.walks == walked
    clock.now += 0.25  # the running job's probe is due
    await watcher.poll()
    assert watcher.walks == walked + 1

    slurm.start(PENDING_JOB)  # slurmctld's count moves: the pending jobs are probed at once
    clock.now += 0.25
    await watcher.poll()
    await signals.told(PENDING_JOB, "RUNNING")
    assert watcher.walks == walked + 2
    clock.now += 0.25  # the start was news: walked once more, then quiet again
    await watcher.poll()
    clock.now += 0.25
    await watcher.poll()
    assert watcher.walks == walked + 3
    await watcher.close()


async def test_pending_reasons_are_re_read_at_most_max_refreshes_a_second() -> None:
    """At 5,000 pending jobs, 20 re-reads on each of four passes a second were 16% of the
    watcher's CPU; a pending reason is worth less than that."""
    slurm, signals, clock = Slurm(), Signals(), Clock()
    slurm.states.update({job_id: ["PENDING"] for job_id in range(100, 100 + 5 * MAX_REFRESHES)})
    watcher = watcher_of(slurm, signals, clock)
    await first_pass(watcher, signals)
    clock.now += PENDING_REFRESH_SECONDS  # every pending job is due for a re-read of its reason
    gets = watcher.job_gets

    passes = int(2 * REFRESH_CHOICE_SECONDS / 0.25)  # two seconds of passes
    for _ in range(passes):
        await watcher.poll()
        await watcher.wait_idle()
        clock.now += 0.25

    assert watcher.job_gets - gets == 2 * MAX_REFRESHES
    await watcher.close()
