"""/validate enforces the tenant policy (bridge.policy) on pods and workloads, over HTTPS."""

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trustme

from clients.policy_file import PolicyFile
from tests.webhook.conftest import CertFiles, RunningServer, client_for, policy, start_webhook
from tests.webhook.reviews import (
    JOB,
    MANAGED_NS,
    OTHER_NS,
    PODGROUP,
    SCHEDULER,
    Json,
    P,
    pod,
    response_of,
    review,
)
from tests.webhook.test_workloads import job, template, workload
from webhook.app import Webhook
from webhook.namespaces import StaticNamespaces
from webhook.settings import ConfigurationError, load_settings
from webhook.tls import ReloadingCertificate

POLICY = f"""
namespaces:
  {MANAGED_NS}:
    allowed_accounts: [hpc, shared]
    max_priority: 100
    defaults: {{account: hpc}}
default:
  allowed_accounts: []
"""
ACCOUNT_DENIED = f'{P}account="team-b": namespace {MANAGED_NS} may use accounts hpc, shared'


@pytest.fixture(scope="module")
def policy_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("policy") / "policy.yaml"
    path.write_text(POLICY)
    return path


@pytest.fixture(scope="module")
def tenant_server(cert_files: CertFiles, policy_path: Path) -> Iterator[RunningServer]:
    webhook = Webhook(
        policy=policy(), namespaces=StaticNamespaces([MANAGED_NS]), tenant_policy=PolicyFile(policy_path)
    )
    running = start_webhook(webhook, ReloadingCertificate(cert_files.cert, cert_files.key))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def http(tenant_server: RunningServer, ca: trustme.CA) -> Iterator[httpx.Client]:
    with client_for(ca, tenant_server.url) as client:
        yield client


def validate(http: httpx.Client, sent: Json) -> Json:
    answer = http.post("/validate", json=sent)
    assert answer.status_code == 200, answer.text
    return response_of(answer.json(), sent)


def message(response: Json) -> str:
    assert response["allowed"] is False
    text: str = response["status"]["message"]
    return text


def test_a_pod_within_its_policy_is_admitted(http: httpx.Client) -> None:
    for annotations in ({}, {P + "account": "shared", P + "priority": "100"}):
        assert validate(http, review(pod(annotations=annotations)))["allowed"] is True


def test_a_pod_outside_its_policy_is_denied_with_every_reason(http: httpx.Client) -> None:
    sent = review(pod(annotations={P + "account": "team-b", P + "priority": "1000"}))
    assert message(validate(http, sent)) == (
        f"slurm-bridge: pod not accepted: {ACCOUNT_DENIED}; "
        f'{P}priority="1000": namespace {MANAGED_NS} may ask for a priority of at most 100'
    )


def test_unlisted_namespaces_get_the_default_policy(http: httpx.Client) -> None:
    sent = review(pod(namespace=OTHER_NS, scheduler=SCHEDULER, annotations={P + "account": "hpc"}))
    assert message(validate(http, sent)).endswith(
        f'{P}account="hpc": namespace {OTHER_NS} may not choose its accounts; remove the annotation'
    )
    # Pods that are not the bridge's are none of its business.
    assert validate(http, review(pod(namespace=OTHER_NS, annotations={P + "account": "hpc"})))["allowed"]


def test_a_workload_and_its_templates_are_checked(http: httpx.Client) -> None:
    denied = validate(http, review(job(template(), {P + "account": "team-b"}), gvkr=JOB))
    assert message(denied) == f"slurm-bridge: Job not accepted: {ACCOUNT_DENIED}"
    in_template = validate(http, review(job(template(annotations={P + "account": "team-b"}), {}), gvkr=JOB))
    assert message(in_template) == f"slurm-bridge: Job not accepted: in spec.template: {ACCOUNT_DENIED}"
    assert validate(http, review(job(template(), {P + "account": "hpc"}), gvkr=JOB))["allowed"] is True


def test_a_podgroup_is_checked(http: httpx.Client) -> None:
    group = workload(PODGROUP, {"minMember": 2}, {P + "account": "team-b"})
    assert message(validate(http, review(group, gvkr=PODGROUP))).endswith(ACCOUNT_DENIED)


def test_an_existing_violation_does_not_block_updates(http: httpx.Client) -> None:
    old = pod(scheduler=SCHEDULER, annotations={P + "account": "team-b"})
    new = {**old, "metadata": {**old["metadata"], "labels": {"x": "y"}}}
    answer = validate(http, review(new, operation="UPDATE", old=old))
    assert answer["allowed"] is True
    assert ACCOUNT_DENIED in answer["warnings"][0]


def test_a_policy_change_applies_without_a_restart(http: httpx.Client, policy_path: Path) -> None:
    sent = pod(annotations={P + "account": "team-b"})
    assert validate(http, review(sent))["allowed"] is False
    try:
        policy_path.write_text(POLICY.replace("[hpc, shared]", "[hpc, shared, team-b]"))
        stat = policy_path.stat()
        os.utime(policy_path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))
        assert validate(http, review(sent))["allowed"] is True
    finally:
        policy_path.write_text(POLICY)
        os.utime(policy_path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 4_000_000_000))
    assert validate(http, review(sent))["allowed"] is False


def test_the_setting(cert_files: CertFiles, tmp_path: Path) -> None:
    certs = {"tls_cert_file": cert_files.cert, "tls_key_file": cert_files.key}
    assert load_settings(**certs).tenant_policy_file is None
    assert load_settings(**certs, tenant_policy_file="").tenant_policy_file is None
    bad = tmp_path / "policy.yaml"
    bad.write_text("namespaces: {hpc: {allowed_acounts: [a]}}")
    with pytest.raises(
        ConfigurationError, match=r"TENANT_POLICY_FILE \(--tenant-policy-file\): .*allowed_acounts"
    ):
        load_settings(**certs, tenant_policy_file=str(bad))
