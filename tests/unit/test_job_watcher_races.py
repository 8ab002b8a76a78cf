"""The job watcher's pass on stand-ins for Slurm and Temporal: its followed jobs change while a
read of one is out (the pod watcher forgets a job whenever its last pod goes)."""

import asyncio
import json
import logging
from typing import Any, cast

import pytest
from temporalio.client import Client

from clients.slurm_client import SlurmClient
from worker.job_registry import LiveJobs
from worker.job_watcher import JobWatcher

PLACEMENT = "placement/site/team/p/uid-1@uid-1"


class HeldSlurm:
    """Answers the probe at once and holds every read of a job until `release` is set."""

    def __init__(self) -> None:
        self.reading = asyncio.Event()
        self.release = asyncio.Event()

    async def jobs_started(self) -> int:
        return 0

    async def job_states(self, job_ids: list[int]) -> dict[int, list[str]]:
        return {job_id: ["RUNNING"] for job_id in job_ids}

    async def get_job_components(self, job_id: int) -> list[dict[str, Any]]:
        self.reading.set()
        await self.release.wait()
        pods = json.dumps({"pods": ["team/p"]})
        return [
            {
                "job_id": job_id,
                "job_state": ["RUNNING"],
                "comment": PLACEMENT,
                "admin_comment": pods,
                "nodes": "n1",
            }
        ]


class Signals:
    def __init__(self) -> None:
        self.sent: list[str] = []
        self._workflow = ""

    def get_workflow_handle(self, workflow_id: str) -> "Signals":
        self._workflow = workflow_id
        return self

    async def signal(self, *args: object) -> None:
        self.sent.append(self._workflow)


async def test_a_job_forgotten_while_its_read_is_out_is_neither_signalled_nor_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    jobs = LiveJobs()
    jobs.track(7, PLACEMENT)
    slurm, signals = HeldSlurm(), Signals()
    watcher = JobWatcher(
        cast(SlurmClient, slurm),
        cast(Client, signals),
        jobs,
        installation="site",
        ready=asyncio.Event(),
        interval=0.25,
    )
    caplog.set_level(logging.INFO, logger="worker.job_watcher")

    passing = asyncio.create_task(watcher.poll())
    await slurm.reading.wait()  # the pass reads the job it has not seen yet
    jobs.forget(7)  # meanwhile its last pod went
    slurm.release.set()
    await passing
    await watcher.wait_idle()

    assert signals.sent == []
    assert "Slurm job 7" not in caplog.text
