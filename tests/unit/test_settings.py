import re
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from pydantic_settings import BaseSettings
from typer.testing import CliRunner

from worker.cli import app
from worker.doctor import DoctorSettings
from worker.settings import ConfigurationError, OperatorSettings, WorkerSettings, load_settings


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "jwt"
    path.write_text("SLURM_JWT=secret-token-value\n")
    return path


def test_flags_override_environment(monkeypatch: pytest.MonkeyPatch, token_file: Path) -> None:
    monkeypatch.setenv("TEMPORAL_ADDRESS", "from-env:7233")
    monkeypatch.setenv("SLURM_PARTITION", "env-partition")
    settings = load_settings(slurm_jwt_file=token_file, temporal_address="from-flag:7233")
    assert settings.temporal_address == "from-flag:7233"
    assert settings.partition == "env-partition"
    assert settings.scheduler_name == "slurm-bridge-scheduler"
    assert settings.mcs_label == "kubernetes"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SLURM_JWT_FILE": "/nonexistent/jwt"}, "invalid setting SLURM_JWT_FILE"),
        ({"SLURM_REST_URL": "slurm:6820"}, "must start with http:// or https://"),
        ({"TEMPORAL_ADDRESS": "no-port"}, "must be host:port"),
        ({"JOB_WATCH_INTERVAL": "0"}, "JOB_WATCH_INTERVAL"),
        ({"SLURM_PROBE_INTERVAL": "0"}, "SLURM_PROBE_INTERVAL"),
        (
            {"DRA_DEVICE_CLASSES": "gpu.nvidia.com=gpu,gpu.h100.example.com"},
            'invalid setting DRA_DEVICE_CLASSES: "gpu.h100.example.com" has no "="',
        ),
    ],
)
def test_invalid_configuration_stops_the_worker_with_one_line(
    monkeypatch: pytest.MonkeyPatch, token_file: Path, env: dict[str, str], message: str
) -> None:
    monkeypatch.setenv("SLURM_JWT_FILE", str(token_file))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        load_settings()
    result = CliRunner().invoke(app, ["worker"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert message in lines[0]
    assert "secret-token-value" not in result.output


def _flags(command: str) -> set[str]:
    group: Any = typer.main.get_command(app)  # typer's own click group
    params = group.commands[command].params
    return {option for param in params for option in [*param.opts, *param.secondary_opts]}


@pytest.mark.parametrize(
    ("command", "kind"),
    [
        ("worker", WorkerSettings),
        ("doctor", DoctorSettings),
        ("status", OperatorSettings),
        ("list", OperatorSettings),
        ("retry", OperatorSettings),
    ],
)
def test_every_setting_has_a_flag_named_after_it(command: str, kind: type[BaseSettings]) -> None:
    flags = _flags(command)
    missing = [name for name in kind.model_fields if "--" + name.replace("_", "-") not in flags]
    assert missing == []
    assert {"--temporal-tls", "--no-temporal-tls"} <= flags
    if kind is not OperatorSettings:
        assert {"--leader-election", "--no-leader-election"} <= flags


def test_each_flag_reaches_the_settings_and_wins_over_the_environment(
    monkeypatch: pytest.MonkeyPatch, token_file: Path, tmp_path: Path
) -> None:
    started: list[WorkerSettings] = []

    async def run_worker(settings: WorkerSettings) -> None:
        started.append(settings)

    monkeypatch.setattr("worker.main.run_worker", run_worker)
    monkeypatch.setattr("worker.logs.configure", lambda *_: None)
    monkeypatch.setattr("worker.cli.done", sys.exit)  # not os._exit: this is the test's process
    monkeypatch.setenv("INSTALLATION_ID", "from-env")
    monkeypatch.setenv("LEADER_ELECTION", "false")
    arguments = {
        "--slurm-jwt-file": str(token_file),
        "--installation-id": "from-flag",
        "--deletion-slack": "5",
        "--eviction-patience": "7",
        "--sweep-interval": "0",
        "--lease-duration": "30",
        "--renew-deadline": "20",
        "--retry-period": "4",
        "--lease-name": "bridge-lease",
        "--lease-namespace": "ops",
        "--temporal-max-concurrent-activities": "7",
        "--temporal-max-concurrent-workflow-tasks": "9",
        "--temporal-max-cached-workflows": "0",
        "--temporal-credentials-reload-interval": "60",
        "--health-port": "0",
        "--tenant-policy-file": "",
        "--dra-device-classes": "gpu.h100.example.com = gpu:h100, dra.cpu=cpu",
    }
    result = CliRunner().invoke(
        app, ["worker", "--leader-election", *[part for pair in arguments.items() for part in pair]]
    )
    assert result.exit_code == 0, result.output
    [settings] = started
    assert settings.leader_election
    assert (settings.installation_id, settings.deletion_slack, settings.eviction_patience) == (
        "from-flag",
        5,
        7,
    )
    assert (settings.sweep_interval, settings.lease_duration, settings.renew_deadline) == (0, 30, 20)
    assert (settings.retry_period, settings.lease_name, settings.lease_namespace) == (
        4,
        "bridge-lease",
        "ops",
    )
    assert settings.temporal_max_concurrent_activities == 7
    assert settings.temporal_max_concurrent_workflow_tasks == 9
    assert settings.temporal_max_cached_workflows == 0
    assert settings.temporal_credentials_reload_interval == 60
    assert (settings.health_port, settings.tenant_policy_file) == (0, None)
    assert str(settings.device_classes) == "dra.cpu=cpu,gpu.h100.example.com=gpu:h100"


def test_the_default_dra_device_classes_are_todays(token_file: Path) -> None:
    settings = load_settings(slurm_jwt_file=token_file)
    assert settings.dra_device_classes == "dra.cpu=cpu,gpu.example.com=gpu,gpu.nvidia.com=gpu"
    assert load_settings(slurm_jwt_file=token_file, dra_device_classes="").device_classes.classes == ()


def test_a_bad_flag_is_named_like_its_variable(monkeypatch: pytest.MonkeyPatch, token_file: Path) -> None:
    monkeypatch.setenv("SLURM_JWT_FILE", str(token_file))
    result = CliRunner().invoke(app, ["worker", "--sweep-interval", "5"])
    assert result.exit_code == 2
    assert result.output.strip() == (
        "slurm-bridge: invalid setting SWEEP_INTERVAL (--sweep-interval): "
        "must be 0 (no sweep) or at least 60 seconds"
    )
