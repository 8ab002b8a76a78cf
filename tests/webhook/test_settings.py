"""Configuration: flags over environment, and one clear line for every mistake."""

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from bridge.labels import parse_selector
from tests.webhook.conftest import CertFiles
from webhook.command import webhook
from webhook.settings import DEFAULT_BRIDGE_SERVICE_ACCOUNT, ConfigurationError, load_settings
from worker.settings import WorkerSettings

ENV = (
    "WEBHOOK_TLS_CERT_FILE",
    "WEBHOOK_TLS_KEY_FILE",
    "WEBHOOK_PORT",
    "MANAGED_NAMESPACES",
    "MANAGED_NAMESPACE_SELECTOR",
    "SCHEDULER_NAME",
    "BRIDGE_SERVICE_ACCOUNTS",
    "KUBECONFIG",
    "DRA_DEVICE_CLASSES",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def certs_env(cert_files: CertFiles, monkeypatch: pytest.MonkeyPatch) -> CertFiles:
    monkeypatch.setenv("WEBHOOK_TLS_CERT_FILE", str(cert_files.cert))
    monkeypatch.setenv("WEBHOOK_TLS_KEY_FILE", str(cert_files.key))
    return cert_files


def test_defaults(certs_env: CertFiles) -> None:
    settings = load_settings()
    assert settings.port == 9443
    assert settings.scheduler_name == "slurm-bridge-scheduler"
    assert settings.managed_namespaces == []
    assert settings.selector is None
    assert settings.bridge_service_accounts == [DEFAULT_BRIDGE_SERVICE_ACCOUNT]
    # The worker's default too: what the webhook admits, the worker submits.
    assert settings.dra_device_classes == str(WorkerSettings.model_fields["dra_device_classes"].default)


def test_dra_device_classes_are_read_from_the_environment_and_the_flag_wins(
    certs_env: CertFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRA_DEVICE_CLASSES", "dra.cpu=cpu")
    assert load_settings().device_classes.names == ["dra.cpu"]
    flagged = load_settings(dra_device_classes="gpu.h100.example.com=gpu:h100")
    assert str(flagged.device_classes) == "gpu.h100.example.com=gpu:h100"


def test_environment_is_read_and_flags_win(certs_env: CertFiles, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEBHOOK_PORT", "8443")
    monkeypatch.setenv("MANAGED_NAMESPACES", "hpc, ml ,")
    monkeypatch.setenv("BRIDGE_SERVICE_ACCOUNTS", "system:serviceaccount:a:b,system:serviceaccount:c:d")
    monkeypatch.setenv("SCHEDULER_NAME", "env-scheduler")
    settings = load_settings(port=10443, scheduler_name=None)
    assert settings.port == 10443
    assert settings.scheduler_name == "env-scheduler"
    assert settings.managed_namespaces == ["hpc", "ml"]
    assert settings.bridge_service_accounts == ["system:serviceaccount:a:b", "system:serviceaccount:c:d"]


def test_an_empty_selector_means_unset_not_everything(
    certs_env: CertFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MANAGED_NAMESPACE_SELECTOR", "  ")
    assert load_settings().selector is None
    assert load_settings(managed_namespace_selector="team in (a,b)").selector == parse_selector(
        "team in (b,a)"
    )


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"tls_cert_file": None, "tls_key_file": None},
            "WEBHOOK_TLS_CERT_FILE (--tls-cert-file): is required",
        ),
        ({"tls_cert_file": Path("/nonexistent.crt")}, "WEBHOOK_TLS_CERT_FILE (--tls-cert-file): cannot read"),
        ({"port": 70000}, "WEBHOOK_PORT (--port)"),
        ({"managed_namespaces": "ok,Not_OK"}, 'MANAGED_NAMESPACES (--managed-namespaces): "Not_OK" is not'),
        (
            {"managed_namespace_selector": "a in (b"},
            "MANAGED_NAMESPACE_SELECTOR (--managed-namespace-selector)",
        ),
        ({"scheduler_name": "Bad Name"}, "SCHEDULER_NAME (--scheduler-name)"),
        (
            {"dra_device_classes": "gpu.nvidia.com=gpu:"},
            'DRA_DEVICE_CLASSES (--dra-device-classes): gpu.nvidia.com: "" is not a GRES type',
        ),
    ],
)
def test_each_mistake_names_its_setting(
    cert_files: CertFiles, overrides: dict[str, object], expected: str
) -> None:
    given: dict[str, object] = {"tls_cert_file": cert_files.cert, "tls_key_file": cert_files.key, **overrides}
    if overrides.get("tls_cert_file", 1) is None:
        given = {}
    with pytest.raises(ConfigurationError) as caught:
        load_settings(**given)
    assert expected in str(caught.value)
    assert "\n" not in str(caught.value)


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("webhook")(webhook)
    app.command("other")(lambda: None)  # two commands, so `webhook` is a subcommand as in slurm-bridge
    return app


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], "slurm-bridge: invalid setting WEBHOOK_TLS_CERT_FILE (--tls-cert-file): is required"),
        (["--managed-namespace-selector", "=x"], "invalid setting MANAGED_NAMESPACE_SELECTOR"),
        (["--log-level", "loud"], "invalid setting --log-level"),
        (["--dra-device-classes", "Gpu=gpu"], "invalid setting DRA_DEVICE_CLASSES (--dra-device-classes)"),
    ],
)
def test_the_command_exits_with_one_line(args: list[str], expected: str, cert_files: CertFiles) -> None:
    if args:
        args = ["--tls-cert-file", str(cert_files.cert), "--tls-key-file", str(cert_files.key), *args]
    result = CliRunner().invoke(cli(), ["webhook", *args])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert expected in lines[0]


def test_a_certificate_that_does_not_load_is_reported_at_start(cert_files: CertFiles) -> None:
    args = ["webhook", "--tls-cert-file", str(cert_files.key), "--tls-key-file", str(cert_files.key)]
    result = CliRunner().invoke(cli(), args)
    assert result.exit_code == 2
    assert "invalid setting WEBHOOK_TLS_CERT_FILE/WEBHOOK_TLS_KEY_FILE" in result.output


def test_help_lists_every_option() -> None:
    result = CliRunner().invoke(cli(), ["webhook", "--help"], env={"COLUMNS": "200"})
    for option in (
        "--tls-cert-file",
        "--tls-key-file",
        "--port",
        "--managed-namespaces",
        "--managed-namespace-selector",
        "--scheduler-name",
        "--bridge-service-accounts",
        "--kubeconfig",
        "--dra-device-classes",
    ):
        assert option in result.output
