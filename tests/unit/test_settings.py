from pathlib import Path

import pytest
from typer.testing import CliRunner

from worker.cli import app
from worker.settings import ConfigurationError, load_settings


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
    ],
)
def test_invalid_configuration_stops_the_worker_with_one_line(
    monkeypatch: pytest.MonkeyPatch, token_file: Path, env: dict[str, str], message: str
) -> None:
    monkeypatch.setenv("SLURM_JWT_FILE", str(token_file))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError, match=message):
        load_settings()
    result = CliRunner().invoke(app, ["worker"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert message in lines[0]
    assert "secret-token-value" not in result.output
