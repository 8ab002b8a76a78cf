"""Failure paths of a placement: final errors end it at once, stuck steps are told and retried.

Stand-in activities on the real dev server, with Temporal's time skipping for the
five-minute bound of a step: the workflow's own decisions, not the I/O, are tested.
"""

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import TimeSkipper, TimeSkippingConfig
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from bridge.failures import KUBE_REJECTED, SLURM_BUSY, SLURM_UNAVAILABLE
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
    SlurmUnavailableInput,
    TellPodsInput,
)
from testbed.waiting import until
from workflows.placement import PlacementWorkflow

HISTORIES = Path(__file__).parent.parent / "histories"
POD = PodRef(namespace="team-a", name="p", uid="uid-1")
RUNNING = JobEvent(job_id=7, states=["RUNNING"], nodes=["node-a"])


class StandIns:
    def __init__(
        self,
        *,
        reject_prepare: bool = False,
        reject_bind: bool = False,
        bind_failures_until_told: bool = False,
        slurm_away_for_prepare: int = 0,
        slurm_busy_for_prepare: int = 0,
        gone_after_busy: bool = False,
        prepare_failures_until_told: bool = False,
        finished_on_recovery: bool = False,
        bind_finds_another_job: bool = False,
    ) -> None:
        # The bind step's answer when the job id names another placement's job (a wiped Slurm).
        self.bind_finds_another_job = bind_finds_another_job
        # The real step's answer for a pod that finished: on a recovery path it has cancelled
        # the job an earlier run left and dropped the finalizer (activities/placement.py).
        self.finished_on_recovery = finished_on_recovery
        self.prepare_failures_until_told = prepare_failures_until_told
        self.reject_prepare = reject_prepare
        self.reject_bind = reject_bind
        self.slurm_away_for_prepare = slurm_away_for_prepare
        self.slurm_busy_for_prepare = slurm_busy_for_prepare
        # The real step's answer once the pods were deleted: nothing to claim, nothing submitted.
        self.gone_after_busy = gone_after_busy
        self.prepared: list[PrepareInput] = []
        self.slurm_reports: list[tuple[str, bool]] = []
        self.slurm_report_reasons: list[str] = []
        self.bind_failures_until_told = bind_failures_until_told
        self.told: list[tuple[str, str]] = []
        self.released: list[ReleaseInput] = []
        self.bind_attempts = 0

    @activity.defn(name="prepare_and_submit")
    async def prepare_and_submit(self, given: PrepareInput) -> Prepared:
        self.prepared.append(given)
        if self.finished_on_recovery and given.recovery:
            return Prepared(
                submitted=False, pods=given.request.pods, detail=f"pod {POD.key} is gone or finished"
            )
        if len(self.prepared) <= self.slurm_away_for_prepare:
            raise ApplicationError(
                "Slurm does not answer: POST /job/submit: ReadTimeout",
                type=SLURM_UNAVAILABLE,
                non_retryable=True,
            )
        if len(self.prepared) <= self.slurm_busy_for_prepare:
            raise ApplicationError(
                "Slurm takes no new job now: MaxJobCount limit reached (Batch job submission failed) [2007]",
                type=SLURM_BUSY,
                non_retryable=True,
            )
        if self.gone_after_busy:
            return Prepared(
                submitted=False, pods=given.request.pods, detail=f"pod {POD.key} is gone or finished"
            )
        if self.prepare_failures_until_told and not any(
            reason == "PlacementStuck" for reason, _ in self.told
        ):
            raise RuntimeError("slurmrestd answered 502")  # retryable: maybe the job was submitted
        if self.reject_prepare:
            raise ApplicationError(
                "Kubernetes API 403 Forbidden: pods is forbidden", type=KUBE_REJECTED, non_retryable=True
            )
        return Prepared(submitted=True, pods=given.request.pods, job_id=7, partition="p", job=RUNNING)

    @activity.defn(name="bind")
    async def bind(self, given: BindInput) -> BindResult:
        self.bind_attempts += 1
        assert given.placement_id.endswith(f"@{POD.uid}")  # the job's comment must name it
        if self.bind_finds_another_job:
            return BindResult(job=JobEvent(job_id=given.job_id, states=[], gone=True))
        if self.reject_bind:
            raise ApplicationError(
                "Kubernetes API 403 Forbidden: pods/binding is forbidden",
                type=KUBE_REJECTED,
                non_retryable=True,
            )
        if self.bind_failures_until_told and not any(reason == "PlacementStuck" for reason, _ in self.told):
            raise RuntimeError("API server overloaded")  # retryable: not classified as final
        return BindResult(job=RUNNING, slurm_nodes=["node-a"], nodes=["node-a"])

    @activity.defn(name="check_job")
    async def check_job(self, given: CheckJobInput) -> JobEvent:
        return RUNNING

    @activity.defn(name="tell_pods")
    async def tell_pods(self, given: TellPodsInput) -> None:
        self.told.append((given.reason, given.message))

    @activity.defn(name="report_slurm_unavailable")
    async def report_slurm_unavailable(self, given: SlurmUnavailableInput) -> None:
        self.slurm_reports.append((given.message, given.condition))
        self.slurm_report_reasons.append(given.reason)

    @activity.defn(name="release")
    async def release(self, given: ReleaseInput) -> list[str]:
        self.released.append(given)
        return []

    def all(self) -> list[Callable[..., Awaitable[Any]]]:
        return [
            self.prepare_and_submit,
            self.bind,
            self.check_job,
            self.tell_pods,
            self.release,
            self.report_slurm_unavailable,
        ]


def stand_in_worker(temporal_client: Client, stand_ins: StandIns, task_queue: str) -> Worker:
    """The placement workflow, sandboxed (the guard production skips), on the stand-ins."""
    return Worker(
        temporal_client,
        task_queue=task_queue,
        workflows=[PlacementWorkflow],
        unsandboxed_workflow_runner=SandboxedWorkflowRunner(),
        activities=stand_ins.all(),
    )


def request() -> PlacementRequest:
    return PlacementRequest(
        group="team-a/p", namespace="team-a", pods=[POD], installation="test", events=[PodEvent(pod=POD)]
    )


@contextlib.asynccontextmanager
async def placement_on(
    stand_ins: StandIns, name: str, starter: Client, given: PlacementRequest | None = None
) -> AsyncIterator[WorkflowHandle[Any, PlacementState]]:
    """A placement started through `starter` (a time-skipping client, or the plain one), run by a
    worker on the stand-ins until the block ends."""
    task_queue = f"failures-{uuid.uuid4().hex[:8]}"
    async with stand_in_worker(starter, stand_ins, task_queue):
        yield await starter.start_workflow(
            PlacementWorkflow.run,
            given or request(),
            id=f"placement/test/{name}/{uuid.uuid4()}",
            task_queue=task_queue,
        )


async def state_when(
    handle: WorkflowHandle[Any, Any], holds: Callable[[PlacementState], object], what: str
) -> PlacementState:
    """The placement's state once `holds(state)`: asked by query, which has no event to wait on
    (bounded; a stuck step gives up after 2 s)."""

    phase = ["no answer"]

    async def asked() -> PlacementState | None:
        state: PlacementState = await handle.query(PlacementWorkflow.current_state)
        phase[0] = state.phase
        return state if holds(state) else None

    # An RPCError: the workflow has not had its first task yet.
    return await until(asked, lambda: f"{what} (last phase: {phase[0]})", 30, 0.2, ignoring=RPCError)


@pytest.mark.parametrize("step", ["prepare_and_submit", "bind"])
async def test_a_final_kubernetes_error_fails_the_placement_at_once_and_releases(
    temporal_client: Client, step: str
) -> None:
    # bind runs as a local activity first: its final error must fail the placement the same way
    # (the SDK raises a local activity's failure unwrapped; the step goes on as an activity).
    stand_ins = StandIns(reject_prepare=step == "prepare_and_submit", reject_bind=step == "bind")
    cause = await failed_placement(temporal_client, stand_ins, "reject")
    assert cause.type == KUBE_REJECTED
    [release] = stand_ins.released
    assert (release.reason, release.condition) == (KUBE_REJECTED, True)
    assert "403 Forbidden" in release.message
    assert stand_ins.bind_attempts == (2 if step == "bind" else 0)  # the local try, then the activity


async def failed_placement(temporal_client: Client, stand_ins: StandIns, name: str) -> ApplicationError:
    """Run a placement on the stand-ins until it fails for good; the failure's cause."""
    async with placement_on(stand_ins, name, temporal_client) as handle:
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
    assert isinstance(failure.value.cause, ApplicationError)
    return failure.value.cause


async def bound_then_done(
    temporal_client: Client, stand_ins: StandIns, given: PlacementRequest, name: str
) -> None:
    """Run a placement on the stand-ins until it is bound, then finish its pod: it must end Done."""
    async with placement_on(stand_ins, name, temporal_client, given) as handle:
        await state_when(handle, lambda state: state.phase == "Bound", "the placement Bound")
        await handle.signal(
            PlacementWorkflow.pod_changed, PodEvent(pod=POD, phase="Succeeded", node_name="node-a")
        )
        assert (await handle.result()).phase == "Done"


async def test_a_step_stuck_past_its_bound_is_told_on_the_pod_and_tried_again(
    temporal_client: Client,
) -> None:
    stand_ins = StandIns(bind_failures_until_told=True)
    # A short bound (5 minutes by default): the step gives up after 2 s, tells, pauses, tries again.
    stuck = request().model_copy(update={"step_bound_seconds": 2.0})
    await bound_then_done(temporal_client, stand_ins, stuck, "stuck")
    [message] = [m for reason, m in stand_ins.told if reason == "PlacementStuck"]
    assert "bind to the nodes of Slurm job 7" in message
    assert "API server overloaded" in message
    assert stand_ins.bind_attempts > 1
    assert [r.cancel_job for r in stand_ins.released] == [True]


async def test_slurm_away_waits_for_the_gates_signal_then_submits_as_a_recovery(
    temporal_client: Client,
) -> None:
    stand_ins = StandIns(slurm_away_for_prepare=2)
    async with placement_on(stand_ins, "away", temporal_client) as handle:
        # Told once, whatever the number of tries while Slurm is away.
        for expected_tries in (2, 3):

            def told_away(state: PlacementState, tries: int = expected_tries) -> bool:
                return len(stand_ins.prepared) >= tries - 1 and bool(state.slurm_unavailable)

            await state_when(handle, told_away, f"try {expected_tries - 1} told Slurm is away")
            await handle.signal(PlacementWorkflow.slurm_available)
        await state_when(handle, lambda state: state.phase == "Bound", "the placement Bound")
        await handle.signal(
            PlacementWorkflow.pod_changed, PodEvent(pod=POD, phase="Succeeded", node_name="node-a")
        )
        assert (await handle.result()).phase == "Done"
    # A try after Slurm was away may follow a submission whose answer was lost: it looks first.
    assert [given.recovery for given in stand_ins.prepared] == [False] + [True] * (
        len(stand_ins.prepared) - 1
    )
    assert len(stand_ins.prepared) >= 3
    [(message, condition)] = stand_ins.slurm_reports
    assert "ReadTimeout" in message
    assert condition  # not bound: PodScheduled=False says why
    assert not any(reason == "PlacementStuck" for reason, _ in stand_ins.told)


async def test_slurm_busy_submits_again_after_backing_off_without_a_recovery_search(
    temporal_client: Client,
) -> None:
    stand_ins = StandIns(slurm_busy_for_prepare=2)
    skipper = TimeSkipper(temporal_client, config=TimeSkippingConfig(enabled=False))
    async with placement_on(stand_ins, "busy", skipper.client) as handle:
        state = await state_when(handle, lambda state: bool(state.slurm_unavailable), "told Slurm is busy")
        assert "MaxJobCount" in state.slurm_unavailable
        # Each pause is a workflow timer: forwarded in steps until the third try is made.
        for _ in range(12):
            if len(stand_ins.prepared) >= 3:
                break
            await skipper.fast_forward(handle, timedelta(seconds=10))
        state = await state_when(handle, lambda state: state.phase == "Bound", "the placement Bound")
        assert state.slurm_unavailable == ""
        await handle.signal(
            PlacementWorkflow.pod_changed, PodEvent(pod=POD, phase="Succeeded", node_name="node-a")
        )
        assert (await handle.result()).phase == "Done"
    history = await handle.fetch_history()
    timers = [
        event.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_TIMER_STARTED
    ]
    # The pauses before the second and the third try: 15 s, then 30 s, each up to a fifth longer.
    assert timedelta(seconds=15) <= timers[0] <= timedelta(seconds=18)
    assert timedelta(seconds=30) <= timers[1] <= timedelta(seconds=36)
    # Slurm's answer said it made no job: no try searches for one.
    assert [given.recovery for given in stand_ins.prepared] == [False, False, False]
    # Told once, as busy (the Event's and PodScheduled's reason), not as an outage or a stuck step.
    assert stand_ins.slurm_report_reasons == [SLURM_BUSY]
    [(message, condition)] = stand_ins.slurm_reports
    assert "MaxJobCount limit reached" in message
    assert "submits again by itself" in message
    assert condition
    assert not any(reason == "PlacementStuck" for reason, _ in stand_ins.told)


async def test_pods_deleted_while_slurm_is_busy_end_the_pause(temporal_client: Client) -> None:
    """The pause waits for the pods' change, not for its timer: the pods are let go at once."""
    stand_ins = StandIns(slurm_busy_for_prepare=1, gone_after_busy=True)
    async with placement_on(stand_ins, "busy-gone", temporal_client) as handle:
        await state_when(handle, lambda state: bool(state.slurm_unavailable), "told Slurm is busy")
        await handle.signal(PlacementWorkflow.pod_changed, PodEvent(pod=POD, deleting=True))
        result = await handle.result()
    assert len(stand_ins.prepared) == 2  # tried again: the step lets the deleted pod go
    assert result.job_id is None
    events = (await handle.fetch_history()).events
    kinds = [event.event_type for event in events]
    assert EventType.EVENT_TYPE_TIMER_CANCELED in kinds  # the pause ended before its timer
    assert EventType.EVENT_TYPE_TIMER_FIRED not in kinds


async def test_a_submission_tried_again_after_being_stuck_looks_for_its_job_first(
    temporal_client: Client,
) -> None:
    """The retry is a new activity (attempt 1): the stuck one may have submitted before failing."""
    stand_ins = StandIns(prepare_failures_until_told=True)
    stuck = request().model_copy(update={"step_bound_seconds": 2.0})
    await bound_then_done(temporal_client, stand_ins, stuck, "stuck-submit")
    assert any(reason == "PlacementStuck" for reason, _ in stand_ins.told)
    # Attempts of the first activity carry recovery=False (the activity sees its attempt number);
    # the activity scheduled after the report must look for the job a lost answer may have created.
    assert stand_ins.prepared[0].recovery is False
    assert stand_ins.prepared[-1].recovery is True


async def test_a_reset_run_told_first_that_its_pods_finished_still_releases_what_the_first_run_left(
    temporal_client: Client,
) -> None:
    """The pod watcher's word can reach a reset run before its first workflow task.

    The first run was bound and then terminated (no cleanup); the pod finished meanwhile, and
    the watcher's signal, refused by the terminated run, is delivered to the reset one before
    it runs. With no live pod left, the run must still run the submitting step as a recovery:
    that step cancels the job the first run left and takes the finalizer off.
    """
    stand_ins = StandIns(finished_on_recovery=True)
    task_queue = f"failures-{uuid.uuid4().hex[:8]}"
    workflow_id = f"placement/test/reset-finished/{uuid.uuid4()}"
    async with stand_in_worker(temporal_client, stand_ins, task_queue):
        handle = await temporal_client.start_workflow(
            PlacementWorkflow.run, request(), id=workflow_id, task_queue=task_queue
        )
        await state_when(handle, lambda state: state.phase == "Bound", "the placement Bound")
    # No worker polls now: the reset run's first task waits until the signal is in its history.
    await handle.terminate(reason="test: terminated while bound")
    first_task = next(
        e.event_id
        for e in (await handle.fetch_history()).events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
    reset = await temporal_client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=temporal_client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=workflow_id),
            reason="test: reset after terminate",
            workflow_task_finish_event_id=first_task,
            request_id=f"reset-{workflow_id}",
        )
    )
    again = temporal_client.get_workflow_handle(workflow_id, run_id=reset.run_id, result_type=PlacementState)
    await again.signal(
        PlacementWorkflow.pod_changed, PodEvent(pod=POD, phase="Succeeded", node_name="node-a")
    )
    async with stand_in_worker(temporal_client, stand_ins, task_queue):
        state = await again.result()
    if os.environ.get("SLURM_BRIDGE_RECORD_HISTORY"):
        # The reset run's history (tests/unit/test_replay.py replays every golden one).
        history = await again.fetch_history()
        (HISTORIES / "placement-reset-pods-finished.json").write_text(history.to_json())
    assert [given.recovery for given in stand_ins.prepared] == [False, True]
    assert stand_ins.prepared[-1].request.pods == [POD]
    assert (state.phase, state.history[-1].detail) == (
        "Done",
        f"nothing to place: pod {POD.key} is gone or finished",
    )


async def test_a_job_id_that_names_another_job_fails_the_placement_without_cancelling_that_job(
    temporal_client: Client,
) -> None:
    stand_ins = StandIns(bind_finds_another_job=True)
    cause = await failed_placement(temporal_client, stand_ins, "another")
    assert cause.type == "SlurmJobEnded"
    [release] = stand_ins.released
    assert (release.job_id, release.cancel_job) == (7, False)  # job 7 is somebody else's now
