"""The chart's Temporal values: mTLS Secrets mounted as the files the worker reads, and tuning."""

from pathlib import Path
from typing import Any

import helm_python as helm
import pytest

from tests.deploy.chart import KUBERNETES_VERSIONS, Manifest, container, manifests, one, render, validate
from worker.settings import WorkerSettings, load

MTLS = {
    "temporal": {
        "address": "temporal-frontend.temporal.svc:7233",
        "namespace": "slurm-bridge",
        "mtls": {"secretName": "bridge-mtls", "certKey": "client.pem", "keyKey": "client-key.pem"},
        "caSecret": {"name": "frontend-ca", "key": "bundle.pem"},
        "serverName": "temporal-frontend",
        "credentialsReloadInterval": 10,
    },
    "worker": {"maxConcurrentActivities": 50, "maxConcurrentWorkflowTasks": 20, "maxCachedWorkflows": 300},
}


def worker_parts(documents: list[Manifest]) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
    """ConfigMap data; the worker container's mounts and the pod's volumes, by name."""
    deployment = one(documents, "Deployment", "slurm-bridge")
    mounts = {m["name"]: m for m in container(deployment, "worker")["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    return one(documents, "ConfigMap")["data"], mounts, volumes


def projected_file(mounts: dict[str, Any], volumes: dict[str, Any], volume: str, key: str) -> str:
    item = next(i for i in volumes[volume]["secret"]["items"] if i["key"] == key)
    return f"{mounts[volume]['mountPath']}/{item['path']}"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_mtls_renders_valid_manifests(version: str) -> None:
    for document in manifests(MTLS):
        validate(document, version)


def test_the_secrets_are_the_files_the_worker_reads() -> None:
    config, mounts, volumes = worker_parts(manifests(MTLS))
    assert config["TEMPORAL_TLS_CERT_FILE"] == projected_file(mounts, volumes, "temporal-mtls", "client.pem")
    assert config["TEMPORAL_TLS_KEY_FILE"] == projected_file(
        mounts, volumes, "temporal-mtls", "client-key.pem"
    )
    assert config["TEMPORAL_TLS_CA_FILE"] == projected_file(mounts, volumes, "temporal-ca", "bundle.pem")
    assert volumes["temporal-mtls"]["secret"]["secretName"] == "bridge-mtls"
    assert volumes["temporal-ca"]["secret"]["secretName"] == "frontend-ca"
    # Whole-volume mounts: a subPath mount would never see a renewed Secret.
    assert all("subPath" not in mounts[name] for name in ("temporal-mtls", "temporal-ca"))
    assert config["TEMPORAL_TLS_SERVER_NAME"] == "temporal-frontend"
    assert config["TEMPORAL_CREDENTIALS_RELOAD_INTERVAL"] == "10"
    assert config["TEMPORAL_MAX_CONCURRENT_ACTIVITIES"] == "50"
    assert config["TEMPORAL_MAX_CONCURRENT_WORKFLOW_TASKS"] == "20"
    assert config["TEMPORAL_MAX_CACHED_WORKFLOWS"] == "300"


def test_without_mtls_nothing_is_mounted_and_the_worker_reads_no_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config, mounts, volumes = worker_parts(manifests())
    assert "temporal-mtls" not in mounts
    assert "temporal-ca" not in volumes
    # The rendered ConfigMap, as the worker's environment, gives the worker's own defaults.
    token = tmp_path / "auth-token"
    token.write_text("t")
    for name, value in config.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLURM_JWT_FILE", str(token))
    settings = load(WorkerSettings)
    assert settings.temporal_tls_cert_file is None
    assert settings.temporal_tls_ca_file is None
    assert settings.temporal_tls_server_name is None
    assert not settings.temporal_tls_enabled
    defaults = WorkerSettings.model_fields
    for field in (
        "temporal_credentials_reload_interval",
        "temporal_max_concurrent_activities",
        "temporal_max_concurrent_workflow_tasks",
        "temporal_max_cached_workflows",
    ):
        assert getattr(settings, field) == defaults[field].default, field


def test_a_changed_tuning_value_rolls_the_worker() -> None:
    def checksum(values: dict[str, Any]) -> str:
        deployment = one(manifests(values), "Deployment", "slurm-bridge")
        return str(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum({}) != checksum({"worker": {"maxCachedWorkflows": 10}})


@pytest.mark.parametrize(
    "bad",
    [
        {"worker": {"maxConcurrentWorkflowTasks": 1}},
        {"worker": {"maxCachedWorkflows": -1}},
        {"worker": {"maxConcurrentActivities": "100"}},
        {"temporal": {"mtls": {"secretName": "Bridge_MTLS"}}},
        {"temporal": {"caSecret": {"name": "ca", "key": ""}}},
        {"temporal": {"credentialsReloadInterval": 0}},
        {"temporal": {"serverName": "has space"}},
        {"temporal": {"mtls": {"secretName": "x", "cert": "tls.crt"}}},
    ],
)
def test_helm_rejects_bad_temporal_values(bad: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        render(bad)
