"""The chart's `tenantPolicy`: one ConfigMap, mounted into the worker and the webhook as the file
their TENANT_POLICY_FILE names, holding exactly the policy of the values (docs/tenant-policy.md)."""

from pathlib import Path
from typing import Any

import pytest

from bridge.annotations import JobAnnotations
from bridge.policy import PolicySet, parse_policy
from clients.policy_file import PolicyFile
from tests.deploy.chart import (
    KUBERNETES_VERSIONS,
    Manifest,
    container,
    env_of,
    find,
    manifests,
    one,
    validate,
)
from worker.settings import ConfigurationError, WorkerSettings, load

POLICY: dict[str, Any] = {
    "namespaces": {
        "team-a": {
            "allowed_accounts": ["team-a", "shared"],
            "allowed_qos": ["normal"],
            "allowed_partitions": ["batch", "gpu"],
            "allowed_reservations": [],  # may not use one: an empty list must survive rendering
            "allowed_user_ids": [1001, 1000000],  # a large id must stay a number
            "allowed_group_ids": [2001],
            "max_priority": 100,
            "defaults": {"account": "team-a", "qos": "normal", "partition": "batch"},
        },
        "platform": {},  # listed, no restrictions
    },
    "default": {"allowed_accounts": ["guest"], "max_priority": 0},
}
VALUES = {"tenantPolicy": {"enabled": True, "policy": POLICY}}
POLICY_CONFIGMAP = "slurm-bridge-tenant-policy"


def worker_config(documents: list[Manifest]) -> dict[str, str]:
    return dict(one(documents, "ConfigMap", "slurm-bridge")["data"])


def policy_file_of(deployment: Manifest, name: str) -> tuple[str, str]:
    """The policy file the `name` container sees (mount path + the ConfigMap's key) and its ConfigMap."""
    mounts = [m for m in container(deployment, name)["volumeMounts"] if m["name"] == "tenant-policy"]
    volumes = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "tenant-policy"]
    assert len(mounts) == len(volumes) == 1
    [mount], [volume] = mounts, volumes
    # A whole-directory mount: a subPath would never see the ConfigMap change.
    assert "subPath" not in mount
    assert mount["readOnly"] is True
    # No `items`: every key of the ConfigMap is a file of that name in the directory.
    assert set(volume) == {"name", "configMap"}
    assert set(volume["configMap"]) == {"name"}
    return f"{mount['mountPath']}/policy.yaml", str(volume["configMap"]["name"])


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_a_tenant_policy_renders_valid_manifests(version: str) -> None:
    for document in manifests(VALUES):
        validate(document, version)


def test_the_policy_is_the_file_the_worker_and_the_webhook_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    documents = manifests(VALUES)
    data = one(documents, "ConfigMap", POLICY_CONFIGMAP)["data"]
    assert set(data) == {"policy.yaml"}
    # What the values say, parsed by the same code the worker and the webhook use.
    rendered = parse_policy(data["policy.yaml"])
    assert rendered == PolicySet.model_validate(POLICY)
    assert rendered.for_namespace("team-a").allowed_reservations == []
    assert rendered.for_namespace("team-a").allowed_user_ids == [1001, 1000000]

    worker_file, worker_configmap = policy_file_of(one(documents, "Deployment", "slurm-bridge"), "worker")
    webhook = one(documents, "Deployment", "slurm-bridge-webhook")
    webhook_file, webhook_configmap = policy_file_of(webhook, "webhook")
    assert worker_configmap == webhook_configmap == POLICY_CONFIGMAP
    assert worker_config(documents)["TENANT_POLICY_FILE"] == worker_file
    assert env_of(webhook, "webhook")["TENANT_POLICY_FILE"] == webhook_file

    # The worker's settings from the rendered ConfigMap, with the file where the volume puts it.
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(data["policy.yaml"])
    token = tmp_path / "auth-token"
    token.write_text("t")
    for name, value in worker_config(documents).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLURM_JWT_FILE", str(token))
    monkeypatch.setenv("TENANT_POLICY_FILE", str(policy_file))
    settings = load(WorkerSettings)
    assert settings.tenant_policy_file == policy_file
    policy = PolicyFile(settings.tenant_policy_file).current()
    assert policy.check("team-a", JobAnnotations(account="team-b")) == [
        'slurmjob.slinky.slurm.net/account="team-b": namespace team-a may use accounts team-a, shared'
    ]
    assert policy.check("platform", JobAnnotations(account="anything", priority=10**6)) == []
    assert policy.check("elsewhere", JobAnnotations(priority=1)) == [
        'slurmjob.slinky.slurm.net/priority="1": namespace elsewhere may ask for a priority of at most 0'
    ]


def test_without_a_tenant_policy_nothing_is_mounted_and_nothing_is_restricted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `policy` set but not enabled: still nothing (enabled is the switch).
    documents = manifests({"tenantPolicy": {"enabled": False, "policy": POLICY}})
    assert find(documents, "ConfigMap", POLICY_CONFIGMAP) == []
    for deployment, name in (("slurm-bridge", "worker"), ("slurm-bridge-webhook", "webhook")):
        deployed = one(documents, "Deployment", deployment)
        assert "tenant-policy" not in {v["name"] for v in deployed["spec"]["template"]["spec"]["volumes"]}
        assert "tenant-policy" not in {m["name"] for m in container(deployed, name)["volumeMounts"]}
    assert "TENANT_POLICY_FILE" not in env_of(one(documents, "Deployment", "slurm-bridge-webhook"), "webhook")
    config = worker_config(documents)
    assert config["TENANT_POLICY_FILE"] == ""
    token = tmp_path / "auth-token"
    token.write_text("t")
    for name, value in config.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLURM_JWT_FILE", str(token))
    assert load(WorkerSettings).tenant_policy_file is None


def test_a_policy_change_rolls_no_pod() -> None:
    """The kubelet refreshes the mounted file and both re-read it: no Deployment's pods change."""

    def templates(policy: dict[str, Any]) -> list[Any]:
        documents = manifests({"tenantPolicy": {"enabled": True, "policy": policy}})
        return [
            one(documents, "Deployment", name)["spec"]["template"]
            for name in ("slurm-bridge", "slurm-bridge-webhook")
        ]

    stricter = {**POLICY, "default": {"allowed_accounts": []}}
    assert templates(POLICY) == templates(stricter)
    before, after = (
        one(manifests({"tenantPolicy": {"enabled": True, "policy": p}}), "ConfigMap", POLICY_CONFIGMAP)
        for p in (POLICY, stricter)
    )
    assert before["data"] != after["data"]


def test_a_policy_the_worker_cannot_read_is_refused_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chart's schema leaves each namespace's policy open: a typo renders, the worker refuses it."""
    typo = {"namespaces": {"team-a": {"allowed_acounts": ["team-a"]}}}
    data = one(manifests({"tenantPolicy": {"enabled": True, "policy": typo}}), "ConfigMap", POLICY_CONFIGMAP)
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(data["data"]["policy.yaml"])
    token = tmp_path / "auth-token"
    token.write_text("t")
    monkeypatch.setenv("SLURM_JWT_FILE", str(token))
    monkeypatch.setenv("TENANT_POLICY_FILE", str(policy_file))
    with pytest.raises(
        ConfigurationError, match=r"invalid setting TENANT_POLICY_FILE\b.*namespaces\.team-a\.allowed_acounts"
    ):
        load(WorkerSettings)
