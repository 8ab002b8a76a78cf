"""Workflow upgrades must not break placements in flight.

Each golden history is a real placement recorded by tests/e2e/test_placement.py,
test_slurm_outage.py or (a reset run, on stand-in activities)
tests/unit/test_placement_failures.py with SLURM_BRIDGE_RECORD_HISTORY=1, one set per workflow type
(`placement-v1-*`: PlacementWorkflow, `placement-v2-*`: Placement, `placement-v3-*`:
PlacementV3). Replaying them with today's code fails with a NondeterminismError when a
change alters the commands an existing history expects: gate such changes with
`workflow.patched()`, or make the new flow a new type (docs/architecture.md).
"""

from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from worker.main import unsandboxed_runner
from workflows.placement import PlacementWorkflow, PlacementWorkflowV2
from workflows.placement_v1 import PlacementWorkflowV1

HISTORIES = Path(__file__).parent.parent / "histories"


@pytest.mark.parametrize("sandbox_every_workflow", [False, True], ids=["as-in-production", "all-sandboxed"])
async def test_recorded_placements_replay_with_the_current_workflow(sandbox_every_workflow: bool) -> None:
    files = sorted(HISTORIES.glob("*.json"))
    assert files, "no golden histories"
    replayer = Replayer(
        workflows=[PlacementWorkflow, PlacementWorkflowV2, PlacementWorkflowV1],
        data_converter=pydantic_data_converter,
        unsandboxed_workflow_runner=unsandboxed_runner(sandbox_every_workflow=sandbox_every_workflow),
    )
    for file in files:
        history = WorkflowHistory.from_json(file.stem, file.read_text())
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert result.replay_failure is None, f"{file.name}: {result.replay_failure}"


def test_the_placement_runs_unsandboxed_in_production_and_sandboxed_in_tests() -> None:
    """The sandbox cost memory and CPU per placement; the tests keep its guard (worker/main.py)."""
    for placement in (PlacementWorkflow, PlacementWorkflowV2):
        assert workflow._Definition.must_from_class(placement).sandboxed is False
    assert isinstance(unsandboxed_runner(sandbox_every_workflow=False), UnsandboxedWorkflowRunner)
    assert isinstance(unsandboxed_runner(sandbox_every_workflow=True), SandboxedWorkflowRunner)
