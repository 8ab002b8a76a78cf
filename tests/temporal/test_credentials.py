"""mTLS from files, and a worker that moves to renewed credentials without a restart.

Real Temporal (the session's dev server, in a namespace other than `default`)
behind a real mutual-TLS front (tests/temporal/tls_proxy.py); certificates are
made per test with trustme.
"""

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import trustme
from kubernetes.aio.client import Configuration as KubeConfiguration
from temporalio import workflow
from temporalio.client import Client
from temporalio.service import TLSConfig
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from clients.kube_client import KubeClient
from clients.slurm_client import SlurmClient
from testbed.waiting import until
from tests.temporal.tls_proxy import MutualTLSProxy
from worker.main import Bridge
from worker.settings import ConfigurationError, TemporalSettings, WorkerSettings, load
from worker.temporal_connection import (
    CredentialReloader,
    TemporalCredentials,
    connect_temporal,
    ensure_search_attributes,
)

SERVER_NAME = "temporal.test"  # not the address dialled (127.0.0.1): TEMPORAL_TLS_SERVER_NAME must be used


@workflow.defn(sandboxed=False)
class WaitForGo:
    def __init__(self) -> None:
        self.go = False

    @workflow.run
    async def run(self) -> str:
        await workflow.wait_condition(lambda: self.go)
        return "went"

    @workflow.signal
    def proceed(self) -> None:
        self.go = True


@dataclass
class Pki:
    server_ca: trustme.CA
    server_cert: trustme.LeafCert
    files: Path

    def client_cert(self, ca: trustme.CA, name: str = "slurm-bridge") -> trustme.LeafCert:
        return ca.issue_cert(name, common_name=name)

    def install(self, cert: trustme.LeafCert, key_of: trustme.LeafCert | None = None) -> None:
        """Write the client certificate and key files (as a Secret volume update would)."""
        for path, data in (
            (self.files / "tls.crt", b"".join(blob.bytes() for blob in cert.cert_chain_pems)),
            (self.files / "tls.key", (key_of or cert).private_key_pem.bytes()),
        ):
            staged = path.with_suffix(".new")
            staged.write_bytes(data)
            staged.replace(path)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    server_ca = trustme.CA()
    pki = Pki(server_ca, server_ca.issue_cert(SERVER_NAME), tmp_path)
    server_ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    return pki


@pytest.fixture
async def proxy(temporal_env: WorkflowEnvironment, pki: Pki) -> AsyncIterator[Callable[[trustme.CA], Any]]:
    upstream = temporal_env.client.service_client.config.target_host
    proxies: list[MutualTLSProxy] = []

    async def start(client_ca: trustme.CA) -> MutualTLSProxy:
        front = await MutualTLSProxy(upstream, pki.server_cert, client_ca).__aenter__()
        proxies.append(front)
        return front

    yield start
    for front in proxies:
        await front.__aexit__()


def mtls_settings(front: MutualTLSProxy, pki: Pki, namespace: str, **more: Any) -> TemporalSettings:
    return load(
        TemporalSettings,
        temporal_address=f"127.0.0.1:{front.port}",
        temporal_namespace=namespace,
        temporal_tls_cert_file=pki.files / "tls.crt",
        temporal_tls_key_file=pki.files / "tls.key",
        temporal_tls_ca_file=pki.files / "ca.crt",
        temporal_tls_server_name=SERVER_NAME,
        temporal_credentials_reload_interval=1,
        **more,
    )


def reloader(client: Client) -> CredentialReloader:
    plugin = client.config()["plugins"][0]
    assert isinstance(plugin, CredentialReloader)
    return plugin


async def test_mtls_from_files_reaches_a_namespace_other_than_default(
    proxy: Callable[[trustme.CA], Any], pki: Pki, other_namespace: str
) -> None:
    client_ca = trustme.CA()
    front = await proxy(client_ca)
    pki.install(pki.client_cert(client_ca))
    settings = mtls_settings(front, pki, other_namespace)
    assert settings.temporal_tls_enabled  # implied by the files, TEMPORAL_TLS unset

    client = await connect_temporal(settings)
    assert client.namespace == other_namespace
    await ensure_search_attributes(client)  # registers in this namespace, over mTLS
    assert await client.count_workflows() is not None

    # Without a client certificate the front refuses the connection.
    refused_before = front.handshakes_refused
    plain_tls = load(
        TemporalSettings,
        temporal_address=f"127.0.0.1:{front.port}",
        temporal_tls_ca_file=pki.files / "ca.crt",
        temporal_tls_server_name=SERVER_NAME,
    )
    with pytest.raises(RuntimeError):
        await connect_temporal(plain_tls)
    assert front.handshakes_refused > refused_before


async def test_a_running_worker_moves_to_rotated_certificates(
    proxy: Callable[[trustme.CA], Any], pki: Pki, other_namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    old_ca, new_ca = trustme.CA(), trustme.CA()
    front = await proxy(old_ca)
    pki.install(pki.client_cert(old_ca))
    client = await connect_temporal(mtls_settings(front, pki, other_namespace))
    task_queue = f"tq-{uuid.uuid4()}"
    worker = Worker(
        client, task_queue=task_queue, workflows=[WaitForGo], workflow_runner=UnsandboxedWorkflowRunner()
    )
    caplog.set_level(logging.INFO, logger="worker.main")
    async with worker:
        handle = await client.start_workflow(
            WaitForGo.run, id=f"wf-{uuid.uuid4()}", task_queue=task_queue, run_timeout=timedelta(minutes=2)
        )
        # The workflow has run its first task on this worker (it is waiting for the signal).
        # Polled: the SDK's worker tells nobody when a workflow runs on it (nor, below, reconnects).
        await until(
            lambda: bool(worker._workflow_worker and worker._workflow_worker._running_workflows),
            "the workflow running on the worker",
            timeout=20,
            interval=0.1,
        )

        # Server side: the old CA is no longer trusted and every connection is dropped, so the
        # old certificate cannot get back in. Then the Secret volume gets the new certificate.
        front.trust(new_ca)
        pki.install(pki.client_cert(new_ca))
        await until(lambda: "reconnected to Temporal" in caplog.text, "the reconnection logged", 20, 0.1)

        # Client calls (the watchers') and the worker's pollers both use the new connection.
        await handle.signal(WaitForGo.proceed)
        assert await asyncio.wait_for(handle.result(), 30) == "went"
    assert reloader(client)._watch is None  # the watch ends with the worker


async def test_renewed_files_that_do_not_connect_keep_the_connection_in_use(
    proxy: Callable[[trustme.CA], Any], pki: Pki, other_namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    client_ca = trustme.CA()
    front = await proxy(client_ca)
    first = pki.client_cert(client_ca)
    pki.install(first)
    client = await connect_temporal(mtls_settings(front, pki, other_namespace))
    plugin = reloader(client)

    assert not await plugin.reload()  # nothing changed

    # Half a rotation: the new certificate is there, its key is not yet.
    second = pki.client_cert(client_ca)
    pki.install(second, key_of=first)
    caplog.set_level(logging.WARNING, logger="worker.main")
    assert not await plugin.reload()
    assert "do not connect" in caplog.text
    assert isinstance(plugin.in_use.tls, TLSConfig)
    assert plugin.in_use.tls.client_cert == b"".join(blob.bytes() for blob in first.cert_chain_pems)
    await client.count_workflows()  # still connected with the first certificate

    # The key arrives: the next check reconnects.
    pki.install(second)
    assert await plugin.reload()
    front.drop_connections()  # only the new connection can get back in now... and it does
    await client.count_workflows()


async def test_a_rotated_api_key_is_used_without_a_restart(
    temporal_env: WorkflowEnvironment, tmp_path: Path, other_namespace: str
) -> None:
    key_file = tmp_path / "api-key"
    key_file.write_text("first-key\n")
    settings = load(
        TemporalSettings,
        temporal_address=temporal_env.client.service_client.config.target_host,
        temporal_namespace=other_namespace,
        temporal_api_key_file=key_file,
    )
    client = await connect_temporal(settings)
    assert client.api_key == "first-key"
    key_file.write_text("second-key\n")
    assert await reloader(client).reload()
    assert client.api_key == "second-key"
    await client.count_workflows()


async def test_without_credential_files_nothing_is_watched(temporal_env: WorkflowEnvironment) -> None:
    address = temporal_env.client.service_client.config.target_host
    client = await connect_temporal(load(TemporalSettings, temporal_address=address))
    assert client.config()["plugins"] == []
    assert TemporalCredentials.read(load(TemporalSettings, temporal_tls=True)).tls is True


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "jwt"
    path.write_text("SLURM_JWT=t\n")
    return path


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"temporal_tls_cert_file": "CERT"}, "invalid setting TEMPORAL_TLS_KEY_FILE"),
        ({"temporal_tls_key_file": "CERT"}, "set both TEMPORAL_TLS_CERT_FILE and TEMPORAL_TLS_KEY_FILE"),
        ({"temporal_tls_ca_file": "/nonexistent/ca.crt"}, "invalid setting TEMPORAL_TLS_CA_FILE"),
        ({"temporal_api_key_file": "/nonexistent/key"}, "cannot read /nonexistent/key"),
        ({"temporal_credentials_reload_interval": 0}, "TEMPORAL_CREDENTIALS_RELOAD_INTERVAL"),
        ({"temporal_max_concurrent_workflow_tasks": 1}, "TEMPORAL_MAX_CONCURRENT_WORKFLOW_TASKS"),
        ({"temporal_max_cached_workflows": 10**9}, "TEMPORAL_MAX_CACHED_WORKFLOWS"),
        ({"temporal_max_concurrent_activities": 0}, "TEMPORAL_MAX_CONCURRENT_ACTIVITIES"),
    ],
)
def test_invalid_temporal_settings_name_the_setting(
    token_file: Path, overrides: dict[str, Any], message: str
) -> None:
    values = {key: str(token_file) if value == "CERT" else value for key, value in overrides.items()}
    with pytest.raises(ConfigurationError, match=message):
        load(WorkerSettings, slurm_jwt_file=token_file, **values)


def test_tuning_defaults_and_empty_files_mean_unset(
    token_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("TEMPORAL_TLS_CERT_FILE", "TEMPORAL_TLS_KEY_FILE", "TEMPORAL_TLS_CA_FILE"):
        monkeypatch.setenv(name, "")  # what the Helm chart renders without mTLS
    monkeypatch.setenv("TEMPORAL_TLS_SERVER_NAME", "")
    monkeypatch.setenv("TEMPORAL_MAX_CACHED_WORKFLOWS", "50")
    settings = load(WorkerSettings, slurm_jwt_file=token_file)
    assert settings.temporal_tls_cert_file is None
    assert settings.temporal_tls_server_name is None
    assert not settings.temporal_tls_enabled
    assert settings.temporal_max_concurrent_activities == 20
    assert settings.temporal_max_concurrent_workflow_tasks == 10
    assert settings.temporal_max_cached_workflows == 50


async def test_the_tuning_settings_are_accepted_by_a_worker(
    temporal_client: Client, token_file: Path, task_queue: str
) -> None:
    settings = load(
        WorkerSettings,
        slurm_jwt_file=token_file,
        temporal_max_concurrent_activities=7,
        temporal_max_concurrent_workflow_tasks=5,
        temporal_max_cached_workflows=3,
    )
    worker = Worker(
        temporal_client,
        task_queue=task_queue,
        workflows=[WaitForGo],
        max_concurrent_activities=settings.temporal_max_concurrent_activities,
        max_concurrent_workflow_tasks=settings.temporal_max_concurrent_workflow_tasks,
        max_cached_workflows=settings.temporal_max_cached_workflows,
    )
    async with worker:
        handle = await temporal_client.start_workflow(
            WaitForGo.run, id=f"wf-{uuid.uuid4()}", task_queue=task_queue
        )
        await handle.signal(WaitForGo.proceed)
        assert await asyncio.wait_for(handle.result(), 30) == "went"


async def test_the_bridge_gives_its_worker_the_tuning_settings(
    temporal_client: Client, token_file: Path, task_queue: str
) -> None:
    """worker/main.py's Bridge builds the worker a `slurm-bridge worker` process runs: its config."""
    settings = load(
        WorkerSettings,
        slurm_jwt_file=token_file,
        temporal_task_queue=task_queue,
        temporal_max_concurrent_activities=7,
        temporal_max_concurrent_workflow_tasks=5,
        temporal_max_cached_workflows=3,
        temporal_sticky_timeout=4.5,
    )
    # Clients that are never called: building the Bridge connects nothing.
    kube = KubeClient(KubeConfiguration())
    slurm = SlurmClient(settings.slurm_rest_url, user_name=None, token_file=token_file)
    try:
        config = Bridge(temporal_client, kube, slurm, settings).worker.config()
    finally:
        await kube.close()
        await slurm.close()
    assert config.get("task_queue") == task_queue
    assert config.get("max_concurrent_activities") == 7
    assert config.get("max_concurrent_workflow_tasks") == 5
    assert config.get("max_cached_workflows") == 3
    assert config.get("sticky_queue_schedule_to_start_timeout") == timedelta(seconds=4.5)
    assert config.get("tuner") is None  # a tuner would take the place of the two maxima
