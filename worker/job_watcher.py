"""Job watcher: the one place that polls Slurm for job changes.

Each interval it asks slurmrestd only for the jobs changed since the previous
answer (`GET /jobs/?update_time=`), so the cost is one small request per
interval however many pods wait, and signals the placements whose pods the
changed bridge jobs name. Waiting placements themselves never poll.
"""

import asyncio
import logging

from pydantic import BaseModel
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.slurm import job_event, placement_of
from activities.slurm_client import SlurmClient, SlurmError
from bridge.models import JobEvent
from worker.delivery import LatestPerKey
from workflows.placement import PlacementWorkflow

log = logging.getLogger(__name__)


class JobWatcher:
    def __init__(
        self,
        slurm: SlurmClient,
        temporal: Client,
        *,
        ready: asyncio.Event,
        interval: float,
    ) -> None:
        self.slurm = slurm
        self.temporal = temporal
        self.ready = ready
        self.interval = interval
        self.passes = 0
        self._delivery: LatestPerKey[JobEvent] = LatestPerKey(self._deliver)

    async def run(self) -> None:
        # Placements are started by the pod watcher; signalling before its first
        # list would only find fewer of them.
        await self.ready.wait()
        since: int | None = None  # the first pass lists every job: nothing missed across restarts
        while True:
            try:
                jobs, next_since = await self.slurm.list_jobs(update_time=since)
            except SlurmError as error:
                log.warning("listing Slurm jobs failed: %s", error)
            else:
                for job in jobs:
                    self._route(job)
                since = next_since
                self.passes += 1
            await asyncio.sleep(self.interval)

    async def close(self) -> None:
        await self._delivery.close()

    def _route(self, job: BaseModel) -> None:
        wid = placement_of(job)
        if wid is None:
            return  # not a bridge job
        event = job_event(job)
        # Keyed by job too: an old job of the same placement must not displace the current one.
        self._delivery.submit(f"{wid}#{event.job_id}", event)

    async def _deliver(self, key: str, event: JobEvent) -> None:
        wid = key.rsplit("#", 1)[0]
        try:
            await self.temporal.get_workflow_handle(wid).signal(PlacementWorkflow.job_changed, event)
        except RPCError as error:
            if error.status != RPCStatusCode.NOT_FOUND:
                raise
