"""Operator actions shared by the CLI and the tests: find, inspect, retry placements."""

from dataclasses import dataclass
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from bridge import grouping, keys
from bridge import search_attributes as sa
from bridge.models import GENERATION_SEPARATOR, PlacementState, PodRef, installation_of, workflow_id_of
from bridge.pod_events import claim_of, pod_event
from worker.pod_watcher import (
    DEFAULT_INSTALLATION,
    group_workflow_id,
    solo_group,
    start_placement_workflow,
)
from workflows.placement import PlacementWorkflow


class RetryRefused(Exception):
    """The placement cannot be retried now; the message says why."""


def pod_ref(pod: dict[str, Any]) -> PodRef:
    meta = pod["metadata"]
    return PodRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


async def retry_placement(
    client: Client,
    pod: dict[str, Any],
    task_queue: str,
    group: grouping.Group | None = None,
    *,
    members: list[dict[str, Any]] | None = None,
    installation: str = DEFAULT_INSTALLATION,
) -> str:
    """Start the placement of a pod's group again after it failed or was stopped.

    The whole group is retried: the pods the failed placement claimed (`members`,
    the group's pods as listed; default: this pod). The new run keeps the failed
    placement's id and generation and looks for a job it may have left behind
    (an operator who terminated a placement skipped its cleanup), so retrying
    never submits a second job.
    """
    ref = pod_ref(pod)
    claim = claim_of(pod)
    group = group or solo_group(ref)
    if claim is not None:
        installation = installation_of(claim)
    wid = workflow_id_of(claim) if claim else group_workflow_id(group, installation)
    try:
        description = await client.get_workflow_handle(wid).describe()
    except RPCError as error:
        if error.status != RPCStatusCode.NOT_FOUND:
            raise
        description = None
    if description is not None and description.status == WorkflowExecutionStatus.RUNNING:
        raise RetryRefused(f"the placement of {ref.key} is still running; nothing to retry")
    if description is not None and description.status == WorkflowExecutionStatus.COMPLETED:
        raise RetryRefused(f"the placement of {ref.key} completed; a finished pod is not placed again")
    if not _placeable(pod):
        raise RetryRefused(f"pod {ref.key} is bound or being deleted; only pending pods can be placed")
    same = [p for p in (members or [pod]) if claim_of(p) == claim] or [pod]
    placeable = [
        pod_event(p)
        for p in same
        if not (p.get("spec") or {}).get("nodeName") and not p["metadata"].get("deletionTimestamp")
    ]
    generation = claim.rpartition(GENERATION_SEPARATOR)[2] if claim else ref.uid
    handle = await start_placement_workflow(
        client,
        pod_event(pod),
        group,
        task_queue,
        installation=installation,
        generation=generation,
        members=placeable,
        retry=True,
    )
    return handle.result_run_id or ""


def _placeable(pod: dict[str, Any]) -> bool:
    return not (pod.get("spec") or {}).get("nodeName") and not pod["metadata"].get("deletionTimestamp")


@dataclass(frozen=True)
class PlacementSummary:
    workflow_id: str
    run_id: str
    status: str
    pod: str
    phase: str
    job_id: int | None
    nodes: list[str]
    started: str


async def find_placements(client: Client, query: str, limit: int = 100) -> list[PlacementSummary]:
    """Placements matching a visibility query, newest first."""
    found = []
    async for execution in client.list_workflows(query, limit=limit):
        attributes = execution.typed_search_attributes
        found.append(
            PlacementSummary(
                workflow_id=execution.id,
                run_id=execution.run_id,
                status=execution.status.name if execution.status else "UNKNOWN",
                pod=attributes.get(sa.PLACEMENT_GROUP) or "",
                phase=visible_phase(attributes.get(sa.PLACEMENT_PHASE) or "", execution.status),
                job_id=attributes.get(sa.SLURM_JOB_ID),
                nodes=list(attributes.get(sa.SLURM_NODES) or []),
                started=execution.start_time.isoformat(timespec="seconds"),
            )
        )
    return sorted(found, key=lambda p: p.started, reverse=True)


# A placement upserts its phase only where an operator searches for it (each upsert is a
# billable action): Pending at start and with a pending reason, Bound, Failed. The rest
# follows from the execution status; v1 placements upserted every phase.
_WAITING = "('Pending', 'Translating', 'Submitted', 'Running')"
PHASE_QUERIES = {
    "Pending": f"PlacementPhase IN {_WAITING} AND ExecutionStatus = 'Running'",
    "Bound": "PlacementPhase = 'Bound' AND ExecutionStatus = 'Running'",
    "Done": "(PlacementPhase = 'Done' OR ExecutionStatus = 'Completed')",
    "Failed": "(PlacementPhase = 'Failed' OR ExecutionStatus IN ('Failed', 'Terminated', 'TimedOut'))",
}


def visible_phase(attribute: str, status: WorkflowExecutionStatus | None) -> str:
    """The phase an operator should see, from the last upserted phase and the execution status."""
    if status == WorkflowExecutionStatus.COMPLETED:
        return "Done"
    if status in (
        WorkflowExecutionStatus.FAILED,
        WorkflowExecutionStatus.TERMINATED,
        WorkflowExecutionStatus.TIMED_OUT,
    ):
        return "Failed"
    if status == WorkflowExecutionStatus.CANCELED:
        return "Cancelled"
    return attribute


def placements_query(
    *, namespace: str | None = None, name: str | None = None, phase: str | None = None
) -> str:
    clauses = [keys.PLACEMENT_TYPE_CLAUSE]
    for key, value in ((sa.POD_NAMESPACE, namespace), (sa.POD_NAME, name)):
        if value:
            clauses.append(f"{key.name} = '{value.replace(chr(39), '')}'")
    if phase:
        clauses.append(
            PHASE_QUERIES.get(phase) or f"{sa.PLACEMENT_PHASE.name} = '{phase.replace(chr(39), '')}'"
        )
    return " AND ".join(clauses)


async def placement_state(client: Client, summary: PlacementSummary) -> PlacementState:
    handle = client.get_workflow_handle(summary.workflow_id, run_id=summary.run_id)
    return await handle.query(PlacementWorkflow.current_state)
