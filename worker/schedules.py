"""The Temporal Schedule that runs node sync, created or updated at every worker start.

Operators pause, resume and trigger it like any schedule, in the Temporal UI
or with `temporal schedule pause|unpause|trigger --schedule-id slurm-bridge-node-sync`.
A worker start rewrites the action and the interval (so a new setting takes
effect) but keeps whether the schedule is paused and the operator's note.
"""

import logging
from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleHandle,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
    ScheduleUpdate,
    ScheduleUpdateInput,
)

from bridge.node_actions import NodeSyncRequest
from worker.settings import WorkerSettings
from workflows.node_sync import NODE_SYNC_ID_PREFIX, NodeSyncWorkflow

log = logging.getLogger(__name__)

NODE_SYNC_SCHEDULE_ID = "slurm-bridge-node-sync"
# A run reads, plans and applies in seconds; this bounds one stuck on a hung call.
RUN_TIMEOUT = timedelta(minutes=10)
NOTE = "node sync: Kubernetes nodes ↔ Slurm nodes (taints, drains, external nodes)"


def node_sync_schedule(settings: WorkerSettings) -> Schedule:
    request = NodeSyncRequest(scheduler_name=settings.scheduler_name, default_partition=settings.partition)
    return Schedule(
        action=ScheduleActionStartWorkflow(
            NodeSyncWorkflow.run,
            request,
            # Temporal appends the scheduled time: node-sync-2026-01-01T00:00:30Z.
            id=NODE_SYNC_ID_PREFIX,
            task_queue=settings.temporal_task_queue,
            execution_timeout=RUN_TIMEOUT,
            static_summary="sync Kubernetes nodes with Slurm",
        ),
        spec=ScheduleSpec(
            intervals=[ScheduleIntervalSpec(every=timedelta(seconds=settings.node_sync_interval))]
        ),
        policy=SchedulePolicy(
            # A run still going when the next is due makes the next one pointless.
            overlap=ScheduleOverlapPolicy.SKIP,
            # Runs missed while Temporal was down are not worth catching up: one is enough.
            catchup_window=timedelta(minutes=1),
        ),
        state=ScheduleState(note=NOTE),
    )


async def ensure_node_sync_schedule(
    client: Client, settings: WorkerSettings, *, schedule_id: str = NODE_SYNC_SCHEDULE_ID
) -> ScheduleHandle:
    """Create the schedule, or bring an existing one up to date; idempotent."""
    schedule = node_sync_schedule(settings)
    try:
        handle = await client.create_schedule(schedule_id, schedule)
        log.info("created schedule %s (every %s s)", schedule_id, settings.node_sync_interval)
        return handle
    except ScheduleAlreadyRunningError:
        pass

    def update(current: ScheduleUpdateInput) -> ScheduleUpdate:
        # Whoever paused it (and why, in the note) decides when it runs again, not a restart.
        state = current.description.schedule.state
        schedule.state = ScheduleState(note=state.note or NOTE, paused=state.paused)
        return ScheduleUpdate(schedule=schedule)

    handle = client.get_schedule_handle(schedule_id)
    await handle.update(update)
    log.info("updated schedule %s (every %s s)", schedule_id, settings.node_sync_interval)
    return handle
