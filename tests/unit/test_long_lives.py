"""A placement lives as long as its pods, with bounded history and cost.

Time skipping (Temporal's, on the real dev server) runs ten simulated days of a
bound pod in seconds: the safety re-check backs off, the workflow continues-as-new
with its state before its history grows large, and the pods' end still releases
the job. The activities are stand-ins: this is about the workflow's own clockwork.
"""

import asyncio
import os
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError
from temporalio.testing import TimeSkipper, TimeSkippingConfig
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from bridge import search_attributes as sa
from bridge.models import (
    BindInput,
    BindResult,
    CheckJobInput,
    JobEvent,
    PlacementRequest,
    PlacementState,
    PodEvent,
    PodRef,
    Prepared,
    PrepareInput,
    ReleaseInput,
)
from testbed.waiting import until
from workflows.placement import MAX_RECHECK, PlacementWorkflow

HISTORIES = Path(__file__).parent.parent / "histories"

POD = PodRef(namespace="team-a", name="notebook", uid="uid-1")
RUNNING = JobEvent(job_id=7, states=["RUNNING"], nodes=["node-a"])


class StandIns:
    """The placement's activities, answering as a healthy cluster would, counting calls."""

    def __init__(self) -> None:
        self.checks = 0
        self.released: list[ReleaseInput] = []

    @activity.defn(name="prepare_and_submit")
    async def prepare_and_submit(self, given: PrepareInput) -> Prepared:
        return Prepared(submitted=True, pods=given.request.pods, job_id=7, partition="p", job=RUNNING)

    @activity.defn(name="bind")
    async def bind(self, given: BindInput) -> BindResult:
        return BindResult(job=RUNNING, slurm_nodes=["node-a"], nodes=["node-a"])

    @activity.defn(name="check_job")
    async def check_job(self, given: CheckJobInput) -> JobEvent:
        self.checks += 1
        return RUNNING

    @activity.defn(name="release")
    async def release(self, given: ReleaseInput) -> None:
        self.released.append(given)


async def query_when_ready(handle: WorkflowHandle[Any, PlacementState]) -> PlacementState:
    """The state query, once the run that continued-as-new has had its first workflow task."""

    async def answered() -> PlacementState | None:
        try:
            return await handle.query(PlacementWorkflow.current_state)
        except RPCError as error:
            if "not scheduled yet" not in str(error):
                raise
            return None  # Temporal tells no one when the task runs: asked again

    return await until(answered, "the new run's first workflow task", 30, 0.2)


def notebook(limit: int) -> tuple[PlacementRequest, str]:
    """A placement of the one pod with this history limit (2,000 by default; lower to see it act),
    and a fresh workflow id for it."""
    request = PlacementRequest(
        group="team-a/notebook",
        namespace="team-a",
        pods=[POD],
        installation="test",
        events=[PodEvent(pod=POD)],
        history_events_limit=limit,
    )
    return request, f"placement/test/team-a/notebook/{uuid.uuid4()}"


def worker(client: Client, stand_ins: StandIns) -> Worker:
    """A worker of the placement on these stand-ins, on a queue of its own, sandboxed: the guard
    production skips."""
    return Worker(
        client,
        task_queue=f"long-lives-{uuid.uuid4().hex[:8]}",
        workflows=[PlacementWorkflow],
        unsandboxed_workflow_runner=SandboxedWorkflowRunner(),
        activities=[stand_ins.prepare_and_submit, stand_ins.bind, stand_ins.check_job, stand_ins.release],
    )


DAYS = 10


@pytest.mark.slow
async def test_a_pod_bound_for_days_keeps_a_bounded_history(temporal_client: Client) -> None:
    stand_ins = StandIns()
    skipper = TimeSkipper(temporal_client, config=TimeSkippingConfig(enabled=False))
    limit = 150  # events per run before continue-as-new
    request, workflow_id = notebook(limit)
    async with worker(temporal_client, stand_ins) as running:
        task_queue = running.task_queue
        handle = await skipper.client.start_workflow(
            PlacementWorkflow.run, request, id=workflow_id, task_queue=task_queue
        )
        # The default re-check: every 10 minutes at first, backing off to every 6 hours while
        # nothing changes, so a bound pod costs a few actions a day. Ten days are ~46 re-checks
        # of ~11 events: three continue-as-new at this limit (90 days took 2 min of test time
        # and proved nothing more).
        await skipper.fast_forward(handle, timedelta(days=DAYS))

        # Visibility is eventually consistent and emits no event: ask until the last
        # continue-as-new is indexed (bounded).
        runs: list[WorkflowExecution] = []

        async def indexed() -> bool:
            runs[:] = [run async for run in temporal_client.list_workflows(f"WorkflowId = '{workflow_id}'")]
            # More than one run: a long life continues as new; one of them running.
            return len(runs) > 1 and sum(run.status == WorkflowExecutionStatus.RUNNING for run in runs) == 1

        await until(indexed, lambda: f"the runs indexed (last: {[run.status for run in runs]})", 30, 0.2)
        latest: WorkflowHandle[Any, PlacementState] = temporal_client.get_workflow_handle(
            workflow_id, result_type=PlacementState
        )
        history = await latest.fetch_history()
        assert len(history.events) <= limit + 20  # bounded, whatever the lifetime
        state = await query_when_ready(latest)
        assert (state.phase, state.job_id, state.nodes) == ("Bound", 7, ["node-a"])

        # A handful of checks while backing off from 10 min to 6 h, then 4 a day.
        backing_off = 6
        assert stand_ins.checks <= backing_off + DAYS * (timedelta(days=1) / MAX_RECHECK) + 2

        # The pod finishes: the run that holds the placement now releases the job, once.
        await latest.signal(
            PlacementWorkflow.pod_changed, PodEvent(pod=POD, phase="Succeeded", node_name="node-a")
        )
        result = await latest.result()
        assert result.phase == "Done"
        assert [r.cancel_job for r in stand_ins.released] == [True]
        # The search attributes set at the start survive every continue-as-new.
        described = await latest.describe()
        assert described.typed_search_attributes.get(sa.PLACEMENT_PHASE) == "Bound"


class NoNodeFits(StandIns):
    """No bridge node passes the pod's node rules until `fits`; each prepare is announced."""

    def __init__(self) -> None:
        super().__init__()
        self.fits = False
        self.prepares = 0
        self.prepared = asyncio.Event()

    @activity.defn(name="prepare_and_submit")
    async def prepare_and_submit(self, given: PrepareInput) -> Prepared:
        self.prepares += 1
        self.prepared.set()
        if not self.fits:
            return Prepared(submitted=False, pods=given.request.pods, unschedulable="0/2 nodes are available")
        return await super().prepare_and_submit(given)


async def test_a_placement_no_node_fits_for_long_continues_as_new_and_binds_later(
    temporal_client: Client,
) -> None:
    # Each node change wakes an unschedulable placement to look again: its history grows with
    # the cluster's churn, so it must continue as new before it is submitted too. It failed
    # ("no Slurm job") at its first continue-as-new, and its pods were released unplaced.
    stand_ins = NoNodeFits()
    limit = 40
    request, workflow_id = notebook(limit)
    async with worker(temporal_client, stand_ins) as running:
        task_queue = running.task_queue
        await temporal_client.start_workflow(
            PlacementWorkflow.run, request, id=workflow_id, task_queue=task_queue
        )
        for wakes in range(1, 13):  # ~10 events per look: past the limit more than once
            await asyncio.wait_for(stand_ins.prepared.wait(), 30)
            stand_ins.prepared.clear()
            assert stand_ins.prepares == wakes
            latest = temporal_client.get_workflow_handle(workflow_id, result_type=PlacementState)
            await latest.signal(PlacementWorkflow.nodes_changed)
        await asyncio.wait_for(stand_ins.prepared.wait(), 30)
        latest = temporal_client.get_workflow_handle(workflow_id, result_type=PlacementState)
        state = await query_when_ready(latest)
        assert (state.phase, state.job_id) == ("Unschedulable", None)
        assert len((await latest.fetch_history()).events) <= limit + 20
        assert stand_ins.released == []  # nothing was given back: the pods still wait for a node

        # A node fits again: the placement submits, binds, and ends with its pod.
        stand_ins.fits = True
        stand_ins.prepared.clear()
        await latest.signal(PlacementWorkflow.nodes_changed)
        await asyncio.wait_for(stand_ins.prepared.wait(), 30)

        async def bound() -> bool:
            return (await latest.query(PlacementWorkflow.current_state)).phase == "Bound"

        await until(bound, "the placement bound", 30, 0.1)
        await latest.signal(
            PlacementWorkflow.pod_changed, PodEvent(pod=POD, phase="Succeeded", node_name="node-a")
        )
        assert (await latest.result()).phase == "Done"
        assert [r.cancel_job for r in stand_ins.released] == [True]
        if os.environ.get("SLURM_BRIDGE_RECORD_HISTORY"):
            # The last run, continued before anything was submitted: it prepares again, submits,
            # binds and ends (tests/unit/test_replay.py replays every golden history).
            history = await latest.fetch_history()
            (HISTORIES / "placement-continued-unschedulable.json").write_text(history.to_json())
