"""The leader's waker finds placements that wait for Slurm even when its own gate never closed.

That is the case of a placement whose step ran on another replica, which saw the outage: the
waker's periodic look finds it by its `WaitingForSlurm` phase, probes once, and signals it. Stand-in
activities on the real dev server (no Slurm): the waker's own decisions are tested.
"""

import asyncio
import contextlib
import uuid

from temporalio.client import Client
from temporalio.worker import Worker

from bridge.models import PodEvent
from clients.slurm_errors import SlurmUnavailable
from clients.slurm_health import SlurmHealth
from tests.unit.test_placement_failures import POD, StandIns, request, state_when
from worker.slurm_waker import SlurmWaker
from workflows.placement import PlacementWorkflow


class Probe:
    def __init__(self) -> None:
        self.calls = 0
        self.away = True

    async def __call__(self) -> None:
        self.calls += 1
        if self.away:
            raise SlurmUnavailable("no controller responds", operation="GET /ping/")


async def test_a_placement_another_replica_saw_wait_is_found_probed_for_and_woken(
    temporal_client: Client,
) -> None:
    stand_ins = StandIns(slurm_away_for_prepare=1)
    task_queue = f"waker-{uuid.uuid4().hex[:8]}"
    probe = Probe()
    gate_closed = asyncio.Event()

    def observe(available: bool) -> None:  # the gate's own word on each change
        if not available:
            gate_closed.set()

    health = SlurmHealth(probe, probe_interval=0.05, observer=observe)
    waker = SlurmWaker(temporal_client, health, task_queue=task_queue, check_interval=0.2, settle=0.1)
    async with Worker(
        temporal_client, task_queue=task_queue, workflows=[PlacementWorkflow], activities=stand_ins.all()
    ):
        handle = await temporal_client.start_workflow(
            PlacementWorkflow.run, request(), id=f"placement/test/waker/{uuid.uuid4()}", task_queue=task_queue
        )
        await state_when(handle, lambda state: state.slurm_unavailable, "the placement told Slurm is away")
        tasks = [asyncio.create_task(waker.run()), asyncio.create_task(health.run())]
        try:
            # Slurm is away here too: the waker's probe closes this gate and signals nobody.
            await asyncio.wait_for(gate_closed.wait(), 30)
            assert not health.available
            assert waker.wakes == 0
            # Slurm answers: the gate's prober opens it, and the waker signals the placement.
            probe.away = False
            await state_when(handle, lambda state: state.phase == "Bound", "the placement Bound")
            assert waker.wakes >= 1
            assert waker.recoveries == 1
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await handle.signal(
            PlacementWorkflow.pod_changed, PodEvent(pod=POD, phase="Succeeded", node_name="node-a")
        )
        assert (await handle.result()).phase == "Done"
    assert len(stand_ins.prepared) == 2  # the failed try, then the one after the signal
