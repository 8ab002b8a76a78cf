"""A bridge for node sync tests: real Temporal, real Slurm, the fake Kubernetes API.

Every test gets its own Schedule (so runs of one test never act for another),
a name prefix `ns-<hex>` for every node it makes, and a clean-up that removes
every Slurm node and partition the test (or the bridge under test) created.
The Slurm instance is shared with other test sessions: nothing outside the
prefix and the test's own partitions is touched.
"""

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from temporalio.client import (
    Client,
    ScheduleActionExecution,
    ScheduleActionExecutionStartWorkflow,
)
from temporalio.service import RPCError

from bridge import keys
from bridge.node_actions import NodeSyncResult
from clients.kube_client import KubeClient, load_configuration
from clients.slurm_client import SlurmClient
from testbed.kube_backend import KubeBackend, fake_of
from testbed.kube_fake import FakeKubeServer
from testbed.kube_real.cluster import NOT_READY_TAINT
from testbed.slurm_bed import SlurmBedError, SlurmTestBed, TestPartition
from testbed.waiting import until
from tests.e2e.harness import run_scheduled
from worker.main import Bridge
from worker.schedules import ensure_node_sync_schedule
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)
Json = dict[str, Any]


class Unpluggable(httpx.AsyncBaseTransport):
    """The bridge's way to slurmrestd, with a cable a test can pull."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.unplugged = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.unplugged:
            raise httpx.ConnectError("unplugged by the test", request=request)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class NodeStack:
    kube: KubeBackend
    temporal: Client
    slurm: SlurmClient  # the test's own view of Slurm; the bridge has its own client
    bed: SlurmTestBed
    settings: WorkerSettings
    kubeconfig: Path
    prefix: str = field(default_factory=lambda: f"ns-{secrets.token_hex(3)}")
    slurm_cable: Unpluggable = field(default_factory=Unpluggable)
    bridge: Bridge | None = None
    partitions: list[TestPartition] = field(default_factory=list)
    job_partitions: list[str] = field(default_factory=list)
    jobs: list[int] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    @property
    def fake(self) -> FakeKubeServer:
        """The fake API server, for what only it can do (faults, holds, its clock)."""
        return fake_of(self.kube)

    @property
    def schedule_id(self) -> str:
        return f"{self.prefix}-node-sync"

    def name(self, suffix: str) -> str:
        return f"{self.prefix}-{suffix}"

    # -- the bridge ------------------------------------------------------------

    async def start(self) -> None:
        await ensure_node_sync_schedule(self.temporal, self.settings, schedule_id=self.schedule_id)
        kube = KubeClient(await load_configuration(str(self.kubeconfig)))
        slurm = SlurmClient(
            self.bed.rest_url,
            user_name=self.bed.user_name,
            token_file=self.bed.jwt_file,
            transport=self.slurm_cable,
            api_version=self.settings.slurm_api_version,
        )
        self.bridge = Bridge(
            self.temporal,
            kube,
            slurm,
            self.settings,
            node_sync_schedule_id=self.schedule_id,
            sandbox_every_workflow=True,
        )
        self._task = asyncio.create_task(self.bridge.run())
        await asyncio.wait_for(self.bridge.node_watcher.synced.wait(), 10)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.bridge is not None:
            await self.bridge.kube.close()
            await self.bridge.slurm.close()
        with contextlib.suppress(RPCError):
            await self.temporal.get_schedule_handle(self.schedule_id).delete()
        self._task = self.bridge = None

    async def sync(self, timeout: float = 60) -> NodeSyncResult:
        """Trigger the schedule and return the result of a run that started after this call."""
        return await run_scheduled(self.temporal, self.schedule_id, NodeSyncResult, timeout)

    # -- Kubernetes ------------------------------------------------------------

    def add_node(
        self,
        suffix: str,
        *,
        name: str | None = None,
        cpu: str = "4",
        memory: str = "8000Mi",
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        extra: dict[str, str] | None = None,
        address: str = "127.0.0.1",
    ) -> str:
        """A Ready Kubernetes node; `extra` adds allocatable resources (GPUs)."""
        node_name = name or self.name(suffix)
        self.kube.create_node(node_name, cpu=cpu, memory=memory, labels=labels)

        def finish(node: Json) -> None:
            node["metadata"]["annotations"] = annotations or {}
            for kind in ("capacity", "allocatable"):
                node["status"][kind].update(extra or {})
            for entry in node["status"]["addresses"]:
                if entry["type"] == "InternalIP":
                    entry["address"] = address

        self.kube.update_object("nodes", node_name, finish)
        return node_name

    def add_external_node(self, suffix: str, partitions: str, **kwargs: Any) -> str:
        labels = {keys.LABEL_EXTERNAL_NODE: "true", **(kwargs.pop("labels", None) or {})}
        annotations = {
            keys.ANNOTATION_EXTERNAL_NODE_PARTITIONS: partitions,
            **(kwargs.pop("annotations", {})),
        }
        return self.add_node(suffix, labels=labels, annotations=annotations, **kwargs)

    def edit_node(self, name: str, edit: Callable[[Json], None]) -> None:
        self.kube.update_object("nodes", name, edit)

    def unlabel(self, name: str, label: str) -> None:
        def edit(node: Json) -> None:
            node["metadata"]["labels"].pop(label)

        self.edit_node(name, edit)

    def cordon(self, name: str, cordoned: bool = True) -> None:
        self.edit_node(name, lambda node: node["spec"].update(unschedulable=cordoned))

    def set_ready(self, name: str, ready: bool) -> None:
        """The kubelet's Ready condition, and what the node lifecycle controller does about it
        (no such controller runs in either test bed): the not-ready NoSchedule taint comes and goes."""

        def edit(node: Json) -> None:
            for condition in node["status"]["conditions"]:
                if condition["type"] == "Ready":
                    condition["status"] = "True" if ready else "False"
                    condition["reason"] = "KubeletReady" if ready else "KubeletNotReady"
            taints = [t for t in node["spec"].get("taints") or [] if t.get("key") != NOT_READY_TAINT]
            if not ready:
                taints.append({"key": NOT_READY_TAINT, "effect": "NoSchedule"})
            node["spec"]["taints"] = taints

        self.edit_node(name, edit)

    def kube_node(self, name: str) -> Json:
        node = self.kube.get_object("nodes", name)
        assert node is not None, f"no Kubernetes node {name}"
        return node

    def tainted(self, name: str) -> bool:
        taints = self.kube_node(name)["spec"].get("taints") or []
        wanted = {
            "key": keys.TAINT_MANAGED_NODE,
            "value": self.settings.scheduler_name,
            "effect": "NoExecute",
        }
        return any(all(t.get(k) == v for k, v in wanted.items()) for t in taints)

    def events(self, name: str) -> list[Json]:
        return [
            e
            for e in self.kube.objects("events", "default")
            if e["involvedObject"].get("kind") == "Node" and e["involvedObject"].get("name") == name
        ]

    async def wait_kube(self, check: Callable[[], object], timeout: float = 30) -> None:
        await self.kube.wait_for_async(check, timeout)

    # -- Slurm -----------------------------------------------------------------

    async def slurm_node(self, name: str) -> Json | None:
        # The full list, not GET /node/NAME: that one reports cached allocation (a node
        # looks busy for a while after its job ended) until someone lists all nodes.
        nodes = [n for n in await self.slurm.list_nodes() if n.name == name]
        return nodes[0].model_dump(mode="json", exclude_none=True) if nodes else None

    async def wait_slurm(
        self, name: str, check: Callable[[Json | None], object], timeout: float = 30
    ) -> Json | None:
        """Poll Slurm (it has no watch) until check(node) holds; node is None once gone."""
        seen: list[Json | None] = [None]

        async def reached() -> tuple[Json | None] | None:  # a tuple: truthy even once the node is gone
            seen[0] = node = await self.slurm_node(name)
            return (node,) if check(node) else None

        [node] = await until(
            reached, lambda: f"Slurm node {name} to get there (last: {seen[0]})", timeout, 0.1
        )
        return node

    def make_partition(self) -> TestPartition:
        """A test partition (with its own node), used as an existing partition name to point at."""
        partition = self.bed.make_partition(nodes=1, cpus=2, memory_mb=1000)
        self.partitions.append(partition)
        return partition

    def job_partition(self, node: str) -> str:
        """A partition of exactly this node, for jobs that must run there and nowhere else."""
        name = self.name(f"jobs-{secrets.token_hex(2)}")
        self.bed.scontrol("create", f"PartitionName={name}", f"Nodes={node}", "MaxTime=INFINITE", "State=UP")
        self.job_partitions.append(name)
        return name

    def scontrol_update_node(self, name: str, *settings: str) -> None:
        self.bed.scontrol("update", f"NodeName={name}", *settings)

    async def cleanup(self) -> None:
        await self.stop()
        await self.slurm.close()
        for job_id in self.jobs:
            with contextlib.suppress(SlurmBedError):
                self.bed.cancel_job(job_id)
        for name in self.job_partitions:
            # Jobs the bridge submitted there for pods too (a test that failed midway left them).
            for job in self.bed.jobs_in_partition(name):
                if not job.ended:
                    self.bed.cancel_job(job.job_id)
            self.bed.wait_for_ended_jobs(name)
            self.bed.scontrol_quiet("delete", f"PartitionName={name}")
        leftovers = [n["name"] for n in _bed_nodes(self.bed) if n["name"].startswith(self.prefix)]
        self.bed.delete_nodes(leftovers)
        for partition in self.partitions:
            partition.cleanup()
        self.kube.stop()
        remaining = [n["name"] for n in _bed_nodes(self.bed) if n["name"].startswith(self.prefix)]
        assert not remaining, f"Slurm nodes left behind: {remaining}"


def workflow_id(action: ScheduleActionExecution) -> str:
    assert isinstance(action, ScheduleActionExecutionStartWorkflow)
    return action.workflow_id


def _bed_nodes(bed: SlurmTestBed) -> list[Json]:
    import json

    data = json.loads(bed.scontrol("--json", "show", "node"))
    return list(data.get("nodes") or [])
