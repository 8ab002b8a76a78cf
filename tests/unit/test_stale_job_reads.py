"""An activity's read of the job is older than a signal handled meanwhile: the signal's news stays.

Found by the SIGKILL test (tests/e2e/test_kill_points.py): the worker that took over the submission
read the job PENDING, the job watcher then signalled RUNNING, the signal was handled first, and the
placement, back at PENDING, waited for the 10-minute safety re-check instead of binding.
"""

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from bridge.models import (
    BindInput,
    BindResult,
    CheckJobInput,
    JobEvent,
    PlacementRequest,
    PodEvent,
    PodRef,
    Prepared,
    PrepareInput,
    ReleaseInput,
)
from workflows.placement import PlacementWorkflow

POD = PodRef(namespace="team-a", name="p", uid="uid-1")
PENDING = JobEvent(job_id=7, states=["PENDING"], reason="None")
RUNNING = JobEvent(job_id=7, states=["RUNNING"], nodes=["node-a"])


class StandIns:
    def __init__(self) -> None:
        self.submitting = asyncio.Event()
        self.signalled = asyncio.Event()
        self.bound = asyncio.Event()

    @activity.defn(name="prepare_and_submit")
    async def prepare_and_submit(self, given: PrepareInput) -> Prepared:
        # The job is read here (PENDING); the watcher's RUNNING signal goes out before this returns.
        self.submitting.set()
        await self.signalled.wait()
        return Prepared(submitted=True, pods=given.request.pods, job_id=7, partition="p", job=PENDING)

    @activity.defn(name="bind")
    async def bind(self, given: BindInput) -> BindResult:
        self.bound.set()
        return BindResult(job=RUNNING, slurm_nodes=["node-a"], nodes=["node-a"])

    @activity.defn(name="check_job")
    async def check_job(self, given: CheckJobInput) -> JobEvent:
        return RUNNING

    @activity.defn(name="release")
    async def release(self, given: ReleaseInput) -> list[str]:
        return []

    def all(self) -> list[Callable[..., Awaitable[Any]]]:
        return [self.prepare_and_submit, self.bind, self.check_job, self.release]


async def test_a_running_signal_is_not_undone_by_the_submissions_older_read(temporal_client: Client) -> None:
    stand_ins = StandIns()
    task_queue = f"stale-{uuid.uuid4().hex[:8]}"
    request = PlacementRequest(
        group="team-a/p", namespace="team-a", pods=[POD], installation="test", events=[PodEvent(pod=POD)]
    )
    async with Worker(
        temporal_client, task_queue=task_queue, workflows=[PlacementWorkflow], activities=stand_ins.all()
    ):
        handle = await temporal_client.start_workflow(
            PlacementWorkflow.run, request, id=f"placement/test/stale/{uuid.uuid4()}", task_queue=task_queue
        )
        await stand_ins.submitting.wait()
        await handle.signal(PlacementWorkflow.job_changed, RUNNING)
        stand_ins.signalled.set()

        # Bound on the signal's news, not 10 minutes later by the safety re-check.
        await asyncio.wait_for(stand_ins.bound.wait(), 20)
        await handle.signal(
            PlacementWorkflow.pod_changed, PodEvent(pod=POD, phase="Succeeded", node_name="node-a")
        )
        assert (await handle.result()).phase == "Done"


def test_a_view_of_a_job_only_moves_forward() -> None:
    ended = JobEvent(job_id=7, states=["CANCELLED"])
    gone = JobEvent(job_id=7, states=[], gone=True)
    requeued = JobEvent(job_id=7, states=["PENDING"], restarts=1)
    assert PENDING.progress < RUNNING.progress < ended.progress < gone.progress
    assert RUNNING.progress < requeued.progress  # a requeued job is pending again, and that is news
