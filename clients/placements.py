"""Start a placement: the one way a placement workflow run begins (the pod watcher, retry, the sweep).

By type name (`PLACEMENT_WORKFLOW_TYPE`), so this layer needs no workflow code: whoever starts
a placement — a watcher of new pods, an operator's retry, the sweep adopting a job — gives it the
same search attributes, reuse policy and summary shape, and the Temporal UI shows them alike.
"""

from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)

from bridge import keys
from bridge import search_attributes as sa
from bridge.models import PlacementRequest, PodRef


async def start_placement(
    temporal: Client,
    workflow_id: str,
    request: PlacementRequest,
    *,
    task_queue: str,
    summary: str,
    pod: PodRef | None = None,
    job_id: int | None = None,
) -> WorkflowHandle[Any, Any]:
    """Start a new run of the placement `workflow_id`; WorkflowAlreadyStartedError while one runs.

    A closed run of the same id may be followed by a new one (the group's next generation, or
    the sweep's adoption of a job its last run left). `pod`: the pod the UI names (the request's
    first by default); `job_id`: the Slurm job the run takes over, shown from its first moment.

    Never an eager start, although the pod watcher runs beside a worker of this task queue: the
    first task would run in the pod watcher's replica, and Temporal keeps a workflow's later
    tasks (and `bind` in them) on the worker that ran its last, so every placement would stay in
    the leader while the other replicas idle. From the task queue, the first task goes to
    whichever replica polls first, and the placement stays there.
    """
    first = pod or request.pods[0]
    attributes: list[SearchAttributePair[Any]] = [
        SearchAttributePair(sa.POD_NAMESPACE, first.namespace),
        SearchAttributePair(sa.POD_NAME, first.name),
        SearchAttributePair(sa.POD_UID, first.uid),
        SearchAttributePair(sa.PLACEMENT_GROUP, request.group),
        SearchAttributePair(sa.PLACEMENT_PHASE, "Pending"),
    ]
    if job_id is not None:
        attributes.append(SearchAttributePair(sa.SLURM_JOB_ID, job_id))
    return await temporal.start_workflow(
        keys.PLACEMENT_WORKFLOW_TYPE,
        request,
        id=workflow_id,
        task_queue=task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        search_attributes=TypedSearchAttributes(attributes),
        static_summary=summary,
    )
