"""A whole bridge per test: real Temporal, real Slurm, the fake Kubernetes API, real wire.

Each test gets its own Slurm partition with its own external nodes, a fresh
fake API server whose Node objects carry the same names, a namespace named
after the partition (so pod keys never collide across tests), and a Bridge
(worker + pod watcher + job watcher) on its own task queue.
"""

import asyncio
import contextlib
import json
import socket
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from temporalio.client import (
    Client,
    ScheduleActionExecution,
    ScheduleActionExecutionStartWorkflow,
    ScheduleOverlapPolicy,
    WorkflowHandle,
)

from bridge import keys
from bridge.models import PlacementState, PodRef
from bridge.slurm_api import API_VERSION
from clients.kube_client import KubeClient, api_path
from clients.slurm_client import SlurmClient
from clients.slurm_errors import SlurmUnavailable
from testbed.kube_backend import KubeBackend, fake_of
from testbed.kube_fake import ApiError, FakeKubeServer
from testbed.kube_real.cluster import ApiFailure
from testbed.slurm_bed import SlurmTestBed, TestPartition
from testbed.waiting import until
from testbed.worker_env import bed_settings as bed_settings  # re-exported: the e2e tests' import
from testbed.worker_env import settings_env as settings_env  # (testbed: kill points use them too)
from testbed.worker_env import stop_process
from worker.main import Bridge
from worker.pod_watcher import workflow_id
from worker.settings import WorkerSettings
from workflows.placement import PlacementWorkflow

Pod = dict[str, Any]
Predicate = Callable[[Pod | None], object]


def bed_client(bed: SlurmTestBed, api_version: str = API_VERSION) -> SlurmClient:
    return SlurmClient(
        bed.rest_url, user_name=bed.user_name, token_file=bed.jwt_file, api_version=api_version
    )


def make_pod(
    namespace: str,
    name: str,
    *,
    cpu: str = "1",
    memory: str = "256Mi",
    annotations: dict[str, str] | None = None,
    scheduler: str = keys.DEFAULT_SCHEDULER_NAME,
    devices: dict[str, str] | None = None,
) -> Pod:
    """`devices`: extended resources ("nvidia.com/gpu": "2"), as request and limit alike."""
    requests = {"cpu": cpu, "memory": memory, **(devices or {})}
    resources: dict[str, Any] = {"requests": requests}
    if devices:
        resources["limits"] = dict(devices)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name, "annotations": annotations or {}},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": resources,
                }
            ],
        },
    }


@dataclass
class Stack:
    kube: KubeBackend
    temporal: Client
    slurm: SlurmClient
    slurm_bed: SlurmTestBed
    partition: TestPartition
    settings: WorkerSettings
    kubeconfig: Path
    bridge: Bridge | None = None
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def namespace(self) -> str:
        return self.partition.name

    @property
    def fake(self) -> FakeKubeServer:
        """The fake API server, for what only it can do (faults, holds, its clock)."""
        return fake_of(self.kube)

    # -- the bridge ------------------------------------------------------------

    async def start_bridge(self, kube_client: KubeClient | None = None) -> Bridge:
        """`kube_client`: the bridge's own client, when a test gives it another identity or
        records its requests; by default one with the stack's kubeconfig (cluster admin)."""
        from clients.kube_client import load_configuration

        if kube_client is None:
            kube_client = KubeClient(await load_configuration(str(self.kubeconfig)))
        self.bridge = Bridge(
            self.temporal, kube_client, self.slurm, self.settings, sandbox_every_workflow=True
        )
        self._task = asyncio.create_task(self.bridge.run())
        await asyncio.wait_for(self.bridge.pod_watcher.synced.wait(), 10)
        # Placements read nodes from the cache from here on (before, they list).
        await asyncio.wait_for(self.bridge.node_cache.wait_until(lambda cache: cache.synced), 10)
        return self.bridge

    async def stop_bridge(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.bridge is not None:
            await self.bridge.kube.close()
        self._task = self.bridge = None

    async def partition_jobs(self) -> list[dict[str, Any]]:
        """Every job Slurm knows in this test's partition, ended ones included."""
        try:
            jobs, _ = await self.slurm.list_jobs()
        except SlurmUnavailable:
            # Asked once more: slurmrestd closes idle connections, and a request that meets a
            # closed one gets no answer (the bridge's own callers retry with backoff).
            jobs, _ = await self.slurm.list_jobs()
        dumped = [job.model_dump(mode="json") for job in jobs]
        return [job for job in dumped if job.get("partition") == self.partition.name]

    async def start_replica(self) -> "Replica":
        """Another worker process's worth of bridge: same task queue, own clients and watchers."""
        from clients.kube_client import load_configuration

        kube_client = KubeClient(await load_configuration(str(self.kubeconfig)))
        slurm = bed_client(self.slurm_bed, self.settings.slurm_api_version)
        # A connection of its own, as a second process would have (one client
        # cannot host two workers on the same task queue).
        temporal = await Client.connect(
            self.temporal.service_client.config.target_host,
            namespace=self.temporal.namespace,
            data_converter=self.temporal.data_converter,
        )
        bridge = Bridge(temporal, kube_client, slurm, self.settings, sandbox_every_workflow=True)
        task = asyncio.create_task(bridge.run())
        await asyncio.wait_for(bridge.pod_watcher.synced.wait(), 10)
        return Replica(bridge, task)

    # -- Kubernetes ------------------------------------------------------------

    def create_pod(self, name: str, **kwargs: Any) -> Pod:
        kwargs.setdefault("scheduler", self.settings.scheduler_name)
        return self.kube.create_object("pods", make_pod(self.namespace, name, **kwargs))

    def pod(self, name: str) -> Pod | None:
        return self.kube.get_object("pods", name, self.namespace)

    async def wait_pod(self, name: str, predicate: Predicate, timeout: float = 30) -> Pod:
        """Wait, event-driven, until predicate(pod) holds; returns the pod ({} once gone)."""

        def check() -> tuple[Pod] | None:
            # A one-tuple is truthy even for a gone pod ({}), which wait_for needs.
            pod = self.pod(name)
            return (pod or {},) if predicate(pod) else None

        found = await self.kube.wait_for_async(check, timeout)
        assert found is not None
        return found[0]

    async def finish(self, *names: str) -> None:
        """The pods end (Succeeded, as a kubelet reports it); until their placements have cancelled
        the jobs and let go of the pods."""
        for name in names:
            self.kube.set_pod_phase(self.namespace, name, "Succeeded")
        for name in names:
            await self.wait_pod(name, finished_cleanly)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [
            e
            for e in self.kube.objects("events", self.namespace)
            if e.get("involvedObject", {}).get("name") == name
        ]

    def handle(self, pod: Pod) -> WorkflowHandle[PlacementWorkflow, PlacementState]:
        meta = pod["metadata"]
        ref = PodRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
        return self.temporal.get_workflow_handle_for(PlacementWorkflow.run, workflow_id(ref))


@dataclass
class Replica:
    bridge: Bridge
    task: asyncio.Task[None]

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.bridge.kube.close()
        await self.bridge.slurm.close()


def bound(pod: Pod | None) -> str | None:
    """The node a pod is bound to, if any."""
    node = (pod or {}).get("spec", {}).get("nodeName")
    return str(node) if node else None


def kubelet_stops(kube: KubeBackend, namespace: str, name: str, phase: str = "Failed") -> None:
    """Play a kubelet whose pod was deleted: it reports the pod's end, then confirms the deletion
    (a delete with grace 0), after which the pod goes once its finalizers are gone."""
    kube.set_pod_phase(namespace, name, phase)
    try:
        kube.delete_object("pods", name, namespace, grace_period_seconds=0)
    except (ApiError, ApiFailure) as error:
        if (error.code if isinstance(error, ApiError) else error.status) != 404:
            raise


def finished_cleanly(pod: Pod | None) -> bool:
    """Gone, or no longer held by the bridge's finalizer."""
    return pod is None or keys.FINALIZER not in (pod["metadata"].get("finalizers") or [])


def job_id_of(pod: Pod | None) -> int | None:
    label = ((pod or {}).get("metadata", {}).get("labels") or {}).get(keys.LABEL_SLURM_JOB_ID)
    return int(label) if label else None


async def wait_job_state(
    slurm: SlurmClient, job_id: int, done: Callable[[list[str]], object], timeout: float = 30
) -> dict[str, Any]:
    """Poll Slurm (it has no watch) until `done(job_state)` holds; the job as JSON. Bounded."""
    seen: list[Any] = [None]

    async def reached() -> dict[str, Any] | None:
        job: dict[str, Any] = (await slurm.get_job(job_id)).model_dump(mode="json")
        seen[0] = job["job_state"]
        return job if done(job["job_state"]) else None

    return await until(reached, lambda: f"job {job_id} (still {seen[0]})", timeout, interval=0.1)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def kube_path(namespace: str, name: str) -> str:
    return api_path("pods", namespace=namespace, name=name)


async def slurm_bridge(stack: Stack, *args: str) -> Any:
    """Run the real `slurm-bridge` command against this test's Temporal server; its JSON output."""
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("slurm-bridge")),
        *args,
        "--temporal-address",
        stack.temporal.service_client.config.target_host,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return json.loads(out)


R = TypeVar("R")


async def run_scheduled(temporal: Client, schedule_id: str, result_type: type[R], timeout: float = 60) -> R:
    """Trigger a Schedule and return the result of the run it started after this call."""
    handle = temporal.get_schedule_handle(schedule_id)
    asked = datetime.now(UTC)
    await handle.trigger(overlap=ScheduleOverlapPolicy.BUFFER_ONE)

    # Polling Temporal's schedule state: it sends no event.
    async def started() -> list[ScheduleActionExecution]:
        recent = (await handle.describe()).info.recent_actions
        return [r.action for r in recent if r.started_at >= asked]

    action = (await until(started, f"schedule {schedule_id} to start a run", timeout))[-1]
    assert isinstance(action, ScheduleActionExecutionStartWorkflow)
    run = temporal.get_workflow_handle(action.workflow_id, result_type=result_type)
    return await asyncio.wait_for(run.result(), timeout)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def worker_env(stack: Stack, **extra: str) -> dict[str, str]:
    """The environment a `slurm-bridge worker` process of this stack runs with."""
    return settings_env(stack.settings, stack.temporal.service_client.config.target_host, **extra)


def leader_worker_env(stack: Stack, health_port: int, **extra: str) -> dict[str, str]:
    """A worker process of this stack that takes part in leader election (the stack's Lease and
    timings) and runs no orphan sweep (it lists every job; no test of replicas is about it)."""
    s = stack.settings
    return worker_env(
        stack,
        HEALTH_PORT=str(health_port),
        LEADER_ELECTION="true",
        LEASE_NAMESPACE=s.lease_namespace,
        LEASE_NAME=s.lease_name,
        LEASE_DURATION=str(s.lease_duration),
        RENEW_DEADLINE=str(s.renew_deadline),
        RETRY_PERIOD=str(s.retry_period),
        SWEEP_INTERVAL="0",
        **extra,
    )


@contextlib.asynccontextmanager
async def running_process(*command: str, **options: Any) -> AsyncIterator[asyncio.subprocess.Process]:
    """A process for the test's duration, stopped with SIGINT, then SIGKILL after 20 s.

    Its stderr (the worker's log) is dropped unless `stderr` says where it goes.
    """
    options.setdefault("stderr", asyncio.subprocess.DEVNULL)
    process = await asyncio.create_subprocess_exec(*command, **options)
    try:
        yield process
    finally:
        await stop_process(process)
