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


FULL_LISTING_SECONDS = 15.0


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
        # What each placement was last told about each job, and the placements that
        # are gone: slurmrestd lists every job whenever any job changed, so without
        # this every listing would signal every placement again (each a billable action).
        self._told: dict[str, JobEvent] = {}
        self._closed: set[str] = set()

    async def run(self) -> None:
        # Placements are started by the pod watcher; signalling before its first
        # list would only find fewer of them.
        await self.ready.wait()
        since: int | None = None  # the first pass lists every job: nothing missed across restarts
        # Every so often ask for everything regardless: a change slurmctld does not
        # stamp (seen on a quiet controller) must not wait for the placements' own
        # long re-check. Only changed jobs are signalled, so this costs one listing.
        full_every = max(1, round(FULL_LISTING_SECONDS / self.interval))
        while True:
            if self.passes % full_every == 0:
                since = None
            try:
                jobs, next_since = await self.slurm.list_jobs(update_time=since)
            except SlurmError as error:
                log.warning("listing Slurm jobs failed: %s", error)
            else:
                listed = {self._route(job) for job in jobs}
                if jobs:  # a non-empty answer lists every job: forget the ones Slurm dropped
                    for key in set(self._told) - listed:
                        del self._told[key]
                    self._closed &= listed
                since = next_since
                self.passes += 1
            await asyncio.sleep(self.interval)

    async def close(self) -> None:
        await self._delivery.close()

    def _route(self, job: BaseModel) -> str:
        wid = placement_of(job)
        if wid is None:
            return ""  # not a bridge job
        event = job_event(job)
        # Keyed by job too: an old job of the same placement must not displace the current one.
        key = f"{wid}#{event.job_id}"
        if key not in self._closed and self._told.get(key) != event:
            self._delivery.submit(key, event)
        return key

    async def _deliver(self, key: str, event: JobEvent) -> None:
        wid = key.rsplit("#", 1)[0]
        try:
            await self.temporal.get_workflow_handle(wid).signal(PlacementWorkflow.job_changed, event)
        except RPCError as error:
            if error.status != RPCStatusCode.NOT_FOUND:
                raise
            self._closed.add(key)  # the placement is over; its job changes concern nobody
            return
        self._told[key] = event
