"""Workflow changes must not break placements in flight.

Each golden history is a real placement of today's one placement type
(`PlacementWorkflow`), recorded with SLURM_BRIDGE_RECORD_HISTORY=1 by
tests/e2e/test_placement.py (`placement-bound-done.json`, and `placement-slurm-busy.json`: a
submission refused for a full job queue, the pause, the submission again, bound, done),
tests/e2e/test_slurm_outage.py (`placement-slurm-away.json`) and, on stand-in activities, a reset run by
tests/unit/test_placement_failures.py (`placement-reset-pods-finished.json`) and a run
continued while no node fitted by tests/unit/test_long_lives.py
(`placement-continued-unschedulable.json`: it prepares again, submits, binds, ends). Replaying
them with today's code fails with a NondeterminismError when a change alters the commands
an existing history expects. Replay compares the commands, not their attributes: that the
histories are today's placements (the steps' attempt timeouts as the workflow asks for them
now) is checked on its own. While the project is 0.x such a change records the histories
again; from the first release on it ships behind `workflow.patched()` or as a new type
(docs/architecture.md, "Workflow versioning").
"""

import json
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from bridge import keys
from worker.main import unsandboxed_runner
from workflows.placement import ATTEMPT_TIMEOUT, SUBMISSION_ATTEMPT_TIMEOUT, PlacementWorkflow

HISTORIES = Path(__file__).parent.parent / "histories"


@pytest.mark.parametrize("sandbox_every_workflow", [False, True], ids=["as-in-production", "all-sandboxed"])
async def test_recorded_placements_replay_with_the_current_workflow(sandbox_every_workflow: bool) -> None:
    files = sorted(HISTORIES.glob("*.json"))
    assert files, "no golden histories"
    replayer = Replayer(
        workflows=[PlacementWorkflow],
        data_converter=pydantic_data_converter,
        unsandboxed_workflow_runner=unsandboxed_runner(sandbox_every_workflow=sandbox_every_workflow),
    )
    for file in files:
        history = WorkflowHistory.from_json(file.stem, file.read_text())
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert result.replay_failure is None, f"{file.name}: {result.replay_failure}"


def _seconds(duration: str) -> timedelta:
    return timedelta(seconds=float(duration.removesuffix("s")))


def test_the_golden_histories_are_todays_placements() -> None:
    """A step's attempt timeout changes no command, so replay passes on a stale history: each
    step's attempt timeout in the histories must be the one the workflow asks for today
    (its own, capped by the step's bound)."""
    attempt_timeouts = {"prepare_and_submit": SUBMISSION_ATTEMPT_TIMEOUT, "release": ATTEMPT_TIMEOUT}
    for file in sorted(HISTORIES.glob("*.json")):
        for event in json.loads(file.read_text())["events"]:
            scheduled = event.get("activityTaskScheduledEventAttributes")
            if scheduled is None or scheduled["activityType"]["name"] not in attempt_timeouts:
                continue
            step = scheduled["activityType"]["name"]
            wanted = min(attempt_timeouts[step], _seconds(scheduled["scheduleToCloseTimeout"]))
            recorded = _seconds(scheduled["startToCloseTimeout"])
            assert recorded == wanted, f"{file.name}: {step} attempt {recorded}, today {wanted}: record again"


def test_one_placement_type_named_like_its_class() -> None:
    definition = workflow._Definition.must_from_class(PlacementWorkflow)
    assert definition.name == keys.PLACEMENT_WORKFLOW_TYPE == PlacementWorkflow.__name__


def test_the_placement_runs_unsandboxed_in_production_and_sandboxed_in_tests() -> None:
    """The sandbox cost memory and CPU per placement; the tests keep its guard (worker/main.py)."""
    assert workflow._Definition.must_from_class(PlacementWorkflow).sandboxed is False
    assert isinstance(unsandboxed_runner(sandbox_every_workflow=False), UnsandboxedWorkflowRunner)
    assert isinstance(unsandboxed_runner(sandbox_every_workflow=True), SandboxedWorkflowRunner)
