"""The Temporal Schedules of the bridge, created or updated at every worker start.

- `slurm-bridge-node-sync` runs node sync every NODE_SYNC_INTERVAL seconds;
- `sweep/<installation>` runs the orphan sweep every SWEEP_INTERVAL seconds
  (0: no sweep, and an existing schedule is deleted).

Operators pause, resume and trigger them like any schedule, in the Temporal UI
or with `temporal schedule toggle|trigger --schedule-id ...`. A worker start
rewrites the action and the interval (so a new setting takes effect) but keeps
whether the schedule is paused and the operator's note.
"""

import logging
from datetime import UTC, datetime, timedelta

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
from temporalio.service import RPCError, RPCStatusCode

from bridge.node_actions import NodeSyncRequest
from bridge.sweep import SweepRequest
from worker.settings import WorkerSettings
from workflows.node_sync import NODE_SYNC_ID_PREFIX, NodeSyncWorkflow
from workflows.sweep import SweepWorkflow, sweep_workflow_id

log = logging.getLogger(__name__)

NODE_SYNC_SCHEDULE_ID = "slurm-bridge-node-sync"
# A run reads, plans and applies in seconds; this bounds one stuck on a hung call.
RUN_TIMEOUT = timedelta(minutes=10)
NOTE = "node sync: Kubernetes nodes ↔ Slurm nodes (taints, drains, external nodes)"


def node_sync_schedule(settings: WorkerSettings) -> Schedule:
    request = NodeSyncRequest(
        scheduler_name=settings.scheduler_name,
        default_partition=settings.partition,
        installation=settings.installation_id,
    )
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
    return await _ensure(client, schedule_id, node_sync_schedule(settings), NOTE, settings.node_sync_interval)


async def _ensure(
    client: Client,
    schedule_id: str,
    schedule: Schedule,
    note: str,
    interval: float,
    *,
    keep_start: bool = False,
) -> ScheduleHandle:
    try:
        handle = await client.create_schedule(schedule_id, schedule)
        log.info("created schedule %s (every %s s)", schedule_id, interval)
        return handle
    except ScheduleAlreadyRunningError:
        pass

    def update(current: ScheduleUpdateInput) -> ScheduleUpdate:
        # Whoever paused it (and why, in the note) decides when it runs again, not a restart.
        state = current.description.schedule.state
        schedule.state = ScheduleState(note=state.note or note, paused=state.paused)
        if keep_start:
            schedule.spec.start_at = current.description.schedule.spec.start_at
        return ScheduleUpdate(schedule=schedule)

    handle = client.get_schedule_handle(schedule_id)
    await handle.update(update)
    log.info("updated schedule %s (every %s s)", schedule_id, interval)
    return handle


# The sweep: one schedule per installation, so two bridges on one Temporal namespace keep theirs.
SWEEP_NOTE = "orphan sweep: adopts, cancels and releases what placements left behind (docs/operations.md)"
# A run scans once and heals in small batches; this bounds one stuck on a hung call.
SWEEP_RUN_TIMEOUT = timedelta(minutes=30)


def sweep_schedule_id(installation: str) -> str:
    return sweep_workflow_id(installation)


def sweep_schedule(settings: WorkerSettings, *, start_at: datetime | None = None) -> Schedule:
    """The sweep's schedule; its first run comes at or after `start_at`."""
    request = SweepRequest(
        installation=settings.installation_id,
        scheduler_name=settings.scheduler_name,
        deletion_slack_seconds=settings.deletion_slack,
    )
    return Schedule(
        action=ScheduleActionStartWorkflow(
            SweepWorkflow.run,
            request,
            # Temporal appends the scheduled time: sweep/prod-a-2026-01-01T00:10:00Z.
            id=sweep_workflow_id(settings.installation_id),
            task_queue=settings.temporal_task_queue,
            execution_timeout=SWEEP_RUN_TIMEOUT,
            static_summary=f"sweep orphans of installation {settings.installation_id}",
        ),
        spec=ScheduleSpec(
            intervals=[ScheduleIntervalSpec(every=timedelta(seconds=settings.sweep_interval))],
            start_at=start_at,
        ),
        policy=SchedulePolicy(
            # Two sweeps at once would only race each other (harmlessly: every action re-reads).
            overlap=ScheduleOverlapPolicy.SKIP,
            catchup_window=timedelta(minutes=1),
        ),
        state=ScheduleState(note=SWEEP_NOTE),
    )


async def ensure_sweep_schedule(
    client: Client, settings: WorkerSettings, *, schedule_id: str | None = None
) -> ScheduleHandle | None:
    """Create or update the sweep schedule; with SWEEP_INTERVAL=0 delete it. Idempotent.

    A new schedule runs first one interval after its creation, not at the next
    multiple of the interval (which may be seconds away): a worker just started
    has its watchers catching up, and a bridge started for a moment (a test, a
    trial run with a copied configuration) must not sweep a shared Slurm. An
    update keeps the start it was created with.
    """
    schedule_id = schedule_id or sweep_schedule_id(settings.installation_id)
    if not settings.sweep_interval:
        try:
            await client.get_schedule_handle(schedule_id).delete()
            log.info("deleted schedule %s (SWEEP_INTERVAL=0)", schedule_id)
        except RPCError as error:
            if error.status != RPCStatusCode.NOT_FOUND:
                raise
        return None
    start_at = datetime.now(UTC) + timedelta(seconds=settings.sweep_interval)
    schedule = sweep_schedule(settings, start_at=start_at)
    return await _ensure(client, schedule_id, schedule, SWEEP_NOTE, settings.sweep_interval, keep_start=True)
