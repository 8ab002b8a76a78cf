"""Exactly one Slurm job per placement on every recovery path, on real Slurm.

The normal path submits without looking (no listing of the cluster's jobs); the
paths on which a job of the placement may already exist look first and adopt it:
an activity attempt after the first, a workflow reset, an operator's retry.
"""

from typing import Any

import pytest
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import WorkflowHandle
from temporalio.service import RPCError

from bridge.models import PlacementState
from testbed.waiting import until
from tests.e2e.conftest import ON_REAL_KUBE, StackFactory
from tests.e2e.harness import Stack, bound, finished_cleanly, job_id_of
from worker.operations import retry_placement
from workflows.placement import PlacementWorkflow

pytestmark = pytest.mark.slurm


async def jobs_of(stack: Stack, pod: str) -> list[dict[str, Any]]:
    """Every job Slurm has (or had, within MinJobAge) for the pod."""
    return [j for j in await stack.partition_jobs() if f"{stack.namespace}/{pod}" in j["admin_comment"]]


async def reset_to_first_task(
    stack: Stack, handle: WorkflowHandle[Any, Any], reason: str
) -> WorkflowHandle[Any, PlacementState]:
    """What `temporal workflow reset --type FirstWorkflowTask` does; the new run's handle."""
    first_task = next(
        e.event_id
        for e in (await handle.fetch_history()).events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
    reset = await stack.temporal.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=stack.temporal.namespace,
            workflow_execution=WorkflowExecution(workflow_id=handle.id),
            reason=reason,
            workflow_task_finish_event_id=first_task,
            request_id=f"reset-{handle.id}",
        )
    )
    return stack.temporal.get_workflow_handle(handle.id, run_id=reset.run_id, result_type=PlacementState)


async def bound_again(again: WorkflowHandle[Any, PlacementState], job_id: int | None) -> PlacementState:
    """The reset run's state once it has bound again, to `job_id` (a query has no event to wait on)."""
    seen: list[object] = ["no answer"]

    async def bound_to_the_job() -> PlacementState | None:
        state = await again.query(PlacementWorkflow.current_state)
        seen[0] = (state.phase, state.job_id)
        return state if (state.phase, state.job_id) == ("Bound", job_id) else None

    return await until(
        bound_to_the_job,
        lambda: f"the reset run Bound to job {job_id} (last: {seen[0]})",
        30,
        0.2,
        ignoring=RPCError,  # the new run has not had its first workflow task yet
    )


async def test_an_attempt_after_the_submission_adopts_the_job(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=1)
    # The first Event after the submission fails: the activity is tried again, after submitting.
    stack.fake.fail_next("POST", r"/events$", 500)
    stack.create_pod("flaky")

    pod = await stack.wait_pod("flaky", bound)
    assert [j["job_id"] for j in await jobs_of(stack, "flaky")] == [job_id_of(pod)]
    messages = [e["message"] for e in stack.events("flaky") if e["reason"] == "SlurmJobSubmitted"]
    assert messages == [
        f"Slurm job {job_id_of(pod)} adopted (it already existed) in partition {stack.partition.name}"
    ]

    stack.kube.set_pod_phase(stack.namespace, "flaky", "Succeeded")
    await stack.wait_pod("flaky", finished_cleanly)


@ON_REAL_KUBE
async def test_a_reset_placement_adopts_its_job(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=1)
    created = stack.create_pod("rewound")
    pod = await stack.wait_pod("rewound", bound)
    job_id = job_id_of(pod)
    handle = stack.handle(created)
    # An operator resets the placement to its first step: it runs prepare_and_submit again.
    again = await reset_to_first_task(stack, handle, "test: reset to the first workflow task")

    await bound_again(again, job_id)
    assert [j["job_id"] for j in await jobs_of(stack, "rewound")] == [job_id]

    stack.kube.set_pod_phase(stack.namespace, "rewound", "Succeeded")
    await stack.wait_pod("rewound", finished_cleanly)
    assert (await again.result()).phase == "Done"


@ON_REAL_KUBE
async def test_retry_after_a_terminated_placement_adopts_the_job_it_left(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=1)
    stack.create_pod("holder")
    await stack.wait_pod("holder", bound)
    created = stack.create_pod("waiting")
    pending = job_id_of(await stack.wait_pod("waiting", job_id_of))

    # Terminate skips every cleanup: the pending job, the finalizer and the claim stay.
    await stack.handle(created).terminate(reason="test: an operator's terminate")
    await retry_placement(stack.temporal, stack.pod("waiting") or {}, stack.settings.temporal_task_queue)

    stack.kube.set_pod_phase(stack.namespace, "holder", "Succeeded")
    pod = await stack.wait_pod("waiting", bound)
    assert job_id_of(pod) == pending
    assert [j["job_id"] for j in await jobs_of(stack, "waiting")] == [pending]

    stack.kube.set_pod_phase(stack.namespace, "waiting", "Succeeded")
    await stack.wait_pod("holder", finished_cleanly)
    await stack.wait_pod("waiting", finished_cleanly)


@ON_REAL_KUBE
async def test_a_reset_run_whose_pods_finished_cancels_the_job_left_running(make_stack: StackFactory) -> None:
    """Terminated while bound, the pod finished meanwhile: the reset run must not leave the job running."""
    stack = await make_stack(nodes=1)
    created = stack.create_pod("orphaned")
    job_id = job_id_of(await stack.wait_pod("orphaned", bound))
    handle = stack.handle(created)
    await handle.terminate(reason="test: terminated while bound")
    stack.kube.set_pod_phase(stack.namespace, "orphaned", "Succeeded")  # nobody is told

    again = await reset_to_first_task(stack, handle, "test: reset after terminate")
    assert (await again.result()).phase == "Done"
    jobs = await jobs_of(stack, "orphaned")
    assert [j["job_id"] for j in jobs] == [job_id]
    assert "CANCELLED" in jobs[0]["job_state"]
    await stack.wait_pod("orphaned", finished_cleanly)
