"""The node sync Schedule as the worker writes it, and its setting."""

from pathlib import Path

import pytest
from temporalio.client import ScheduleActionStartWorkflow, ScheduleIntervalSpec, ScheduleOverlapPolicy
from typer.testing import CliRunner

from bridge.node_actions import NodeSyncRequest
from worker.cli import app
from worker.schedules import node_sync_schedule
from worker.settings import ConfigurationError, load_settings


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "jwt"
    path.write_text("SLURM_JWT=secret-token-value\n")
    return path


def test_the_interval_defaults_to_30_seconds_and_the_flag_beats_the_environment(
    monkeypatch: pytest.MonkeyPatch, token_file: Path
) -> None:
    assert load_settings(slurm_jwt_file=token_file).node_sync_interval == 30
    monkeypatch.setenv("NODE_SYNC_INTERVAL", "120")
    assert load_settings(slurm_jwt_file=token_file).node_sync_interval == 120
    assert load_settings(slurm_jwt_file=token_file, node_sync_interval=5).node_sync_interval == 5


@pytest.mark.parametrize("value", ["0", "0.5", "-3", "86401", "often"])
def test_a_bad_interval_stops_the_worker_with_one_line(
    monkeypatch: pytest.MonkeyPatch, token_file: Path, value: str
) -> None:
    monkeypatch.setenv("NODE_SYNC_INTERVAL", value)
    with pytest.raises(ConfigurationError, match="invalid setting NODE_SYNC_INTERVAL"):
        load_settings(slurm_jwt_file=token_file)


def test_the_worker_has_the_flag() -> None:
    result = CliRunner().invoke(app, ["worker", "--help"])
    assert result.exit_code == 0
    assert "--node-sync-interval" in result.output
    assert "NODE_SYNC_INTERVAL" in result.output


def test_the_schedule_runs_node_sync_every_interval_and_never_piles_up(token_file: Path) -> None:
    settings = load_settings(
        slurm_jwt_file=token_file,
        node_sync_interval=45,
        temporal_task_queue="bridge-q",
        scheduler_name="my-scheduler",
        partition="hpc",
    )
    schedule = node_sync_schedule(settings)
    [interval] = schedule.spec.intervals
    assert isinstance(interval, ScheduleIntervalSpec)
    assert interval.every.total_seconds() == 45
    assert schedule.policy.overlap == ScheduleOverlapPolicy.SKIP
    action = schedule.action
    assert isinstance(action, ScheduleActionStartWorkflow)
    assert action.workflow == "NodeSyncWorkflow"
    assert action.id == "node-sync"
    assert action.task_queue == "bridge-q"
    assert action.execution_timeout is not None
    assert list(action.args) == [NodeSyncRequest(scheduler_name="my-scheduler", default_partition="hpc")]
    assert not schedule.state.paused
