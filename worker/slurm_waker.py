"""Wakes the placements that wait for Slurm, once the Slurm-health gate sees it answer.

Leader only (it runs with the watchers), so each placement is signalled once per
recovery, whatever the number of replicas. A placement whose step found Slurm
away sets its `PlacementPhase` search attribute to `WaitingForSlurm` and waits for
the `slurm_available` signal (workflows/placement.py); the waker finds those of
its own task queue with one visibility query and signals them. Nothing else is
signalled, and nothing at all while Slurm answers: the normal path costs no
action.

When: each time this replica's gate opens again (`SlurmHealth.on_recovery`), and
once more `settle` seconds later for a placement whose wait began just before the
recovery and was not yet visible to the query. A placement may also wait because
another replica's step found Slurm away while this replica saw no failure: every
`check_interval` seconds the waker looks for waiting placements and, if there are
any, asks the gate (one probe); Slurm answering wakes them, Slurm away closes the
gate, whose recovery then wakes them. Each placement also has its own safety timer.
"""

import asyncio
import contextlib
import logging

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from bridge import keys
from bridge import search_attributes as sa
from clients.slurm_errors import SlurmUnavailable
from clients.slurm_health import SlurmHealth
from workflows.placement import WAITING_FOR_SLURM, PlacementWorkflow

log = logging.getLogger(__name__)

CHECK_INTERVAL_SECONDS = 30.0
SETTLE_SECONDS = 3.0
SIGNAL_CONCURRENCY = 32


def waiting_query(task_queue: str) -> str:
    """The running placements of this bridge (its task queue) that wait for Slurm."""
    queue = task_queue.replace("'", "")
    return (
        f"{keys.PLACEMENT_TYPE_CLAUSE} AND ExecutionStatus = 'Running' "
        f"AND {sa.PLACEMENT_PHASE.name} = '{WAITING_FOR_SLURM}' AND TaskQueue = '{queue}'"
    )


class SlurmWaker:
    def __init__(
        self,
        temporal: Client,
        health: SlurmHealth,
        *,
        task_queue: str,
        check_interval: float = CHECK_INTERVAL_SECONDS,
        settle: float = SETTLE_SECONDS,
    ) -> None:
        self.temporal = temporal
        self.health = health
        self.query = waiting_query(task_queue)
        self.check_interval = check_interval
        self.settle = settle
        self.wakes = 0  # slurm_available signals delivered
        self.recoveries = 0  # gate openings acted on

    async def run(self) -> None:
        """Until cancelled; a failed pass is logged and tried at the next occasion."""
        recovered = asyncio.Event()
        stop = self.health.on_recovery(recovered.set)
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(recovered.wait(), self.check_interval)
                after_recovery = recovered.is_set()
                recovered.clear()
                try:
                    if after_recovery:
                        self.recoveries += 1
                        await self.wake_waiting(probe=False)
                        await asyncio.sleep(self.settle)
                        await self.wake_waiting(probe=False)
                    else:
                        await self.wake_waiting(probe=True)
                except (RPCError, RuntimeError) as error:
                    log.warning("waking the placements that wait for Slurm failed: %s", error)
        finally:
            stop()

    async def wake_waiting(self, *, probe: bool) -> int:
        """Signal every placement waiting for Slurm, if Slurm answers; how many were signalled."""
        if not self.health.available:
            return 0  # the gate's recovery wakes them
        ids = [execution.id async for execution in self.temporal.list_workflows(self.query)]
        if not ids:
            return 0
        if probe:
            suspicion = SlurmUnavailable(
                f"{len(ids)} placements wait for Slurm", operation="GET /ping/", retryable=True
            )
            if await self.health.confirm(suspicion):
                return 0  # away here too: the gate closed, and its recovery wakes them
        slots = asyncio.Semaphore(SIGNAL_CONCURRENCY)
        woken = await asyncio.gather(*(self._wake(workflow_id, slots) for workflow_id in ids))
        count = sum(woken)
        self.wakes += count
        log.info("Slurm answers: woke %d placements that waited for it", count)
        return count

    async def _wake(self, workflow_id: str, slots: asyncio.Semaphore) -> bool:
        async with slots:
            try:
                await self.temporal.get_workflow_handle(workflow_id).signal(PlacementWorkflow.slurm_available)
            except RPCError as error:
                if error.status == RPCStatusCode.NOT_FOUND:
                    return False  # it ended meanwhile
                raise
        return True
