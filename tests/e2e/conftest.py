"""The `stack` and `nodes` factories: a complete bridge on real Temporal and real Slurm per test.

Kubernetes is the in-repo fake API server unless a test is marked `ON_REAL_KUBE`
(or `ON_BOTH_KUBES`): then it is the real kube-apiserver of testbed/kube_real, one
per session, in a namespace of the test's own, and the test skips where that
server's binaries are absent. The real server is the reference: a test runs on the
fake only for what the real one cannot do here (fault injection, held requests,
the fake's taint manager and disruption controller, APIs newer than 1.28).
"""

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from bridge import keys
from bridge.node_facts import gpu_count
from clients.slurm_client import SlurmClient
from testbed.kube_backend import KubeBackend
from testbed.kube_fake import FakeKubeServer
from testbed.kube_real.apiserver import ApiServer
from testbed.kube_real.cluster import RealCluster
from testbed.slurm_bed import SlurmTestBed
from tests.deploy.chart import NAMESPACE as CHART_NAMESPACE
from tests.e2e.harness import Stack, bed_client, bed_settings
from tests.e2e.node_fixtures import NodeStack

StackFactory = Callable[..., Awaitable[Stack]]
MakeNodes = Callable[..., Awaitable[NodeStack]]
KubeFactory = Callable[[str, bool], KubeBackend]
# A test or module marked so runs on the real API server, or once on each backend.
ON_REAL_KUBE = pytest.mark.parametrize("kube_backend", ["real"], indirect=True)
ON_BOTH_KUBES = pytest.mark.parametrize("kube_backend", ["fake", "real"], indirect=True)


@pytest.fixture
def kube_backend(request: pytest.FixtureRequest) -> str:
    return str(getattr(request, "param", "fake"))


@pytest.fixture
def make_kube(request: pytest.FixtureRequest, kube_backend: str) -> Iterator[KubeFactory]:
    """A Kubernetes for one stack: `make_kube(namespace, kubelet)`. On the real server the bridge
    runs as the chart's worker, and the test fails if the API server refused it anything."""
    watched: list[tuple[ApiServer, str, int]] = []

    def make(namespace: str, kubelet: bool) -> KubeBackend:
        if kube_backend == "fake":
            return FakeKubeServer(kubelet=kubelet).start()
        # (The test's end checks the chart's worker was never refused: `never_refused`.)
        server: ApiServer = request.getfixturevalue("real_apiserver")
        # The bridge runs as the chart's worker ServiceAccount (its RBAC applied, a TokenRequest
        # token): a request the chart does not grant fails the test with a 403.
        identity = request.getfixturevalue("chart_identity")  # a tests.deploy.real_chart.ChartIdentity
        cluster = RealCluster(server, namespace, bridge_token=identity.worker.token)
        watched.append((server, identity.worker.username, server.audit_offset()))
        if kubelet:
            cluster.start_kubelet()
        return cluster

    yield make
    for server, username, since in watched:
        refused = server.refused(username, since)
        assert not refused, f"the API server refused the chart's worker: {refused}"


@pytest.fixture
async def make_stack(
    temporal_client: Client,
    slurm_bed: SlurmTestBed,
    tmp_path: Path,
    task_queue: str,
    make_kube: KubeFactory,
    kube_backend: str,
) -> AsyncIterator[StackFactory]:
    stacks: list[Stack] = []

    async def make(
        nodes: int = 1,
        cpus: int = 4,
        memory_mb: int = 8000,
        *,
        gres: str | Sequence[str] | None = None,
        bridge: bool = True,
        kubelet: bool = False,
        **overrides: Any,
    ) -> Stack:
        """`gres`: each node's Slurm Gres ("gpu:2"), or one per node; Kubernetes sees nvidia.com/gpu.
        `kubelet`: a kubelet runs bound pods (and ends them after their run-seconds annotation):
        the fake's own, or testbed/kube_real's stand-in on the real API server."""
        partition = slurm_bed.make_partition(nodes=nodes, cpus=cpus, memory_mb=memory_mb, gres=gres)
        per_node = [gres or ""] * nodes if gres is None or isinstance(gres, str) else list(gres)
        kube = make_kube(partition.name, kubelet)
        for name, node_gres in zip(partition.node_names, per_node, strict=True):
            # Labelled as node sync's nodes are: the bridge's node filters consider them.
            kube.create_node(
                name, cpu=str(cpus), memory=f"{memory_mb}Mi", labels={keys.LABEL_EXTERNAL_NODE: "true"}
            )
            gpus = gpu_count(node_gres)
            if gpus:
                # What node sync would have registered the Slurm node from.
                def add_gpus(node: dict[str, Any], gpus: int = gpus) -> None:
                    for kind in ("capacity", "allocatable"):
                        node["status"][kind]["nvidia.com/gpu"] = str(gpus)

                kube.update_object("nodes", name, add_gpus)
        kubeconfig = kube.kubeconfig(tmp_path / f"kubeconfig-{len(stacks)}")
        if kube_backend == "real":
            # The chart's worker may hold a Lease in the release namespace only.
            overrides.setdefault("lease_namespace", CHART_NAMESPACE)
        settings = bed_settings(slurm_bed, kubeconfig, task_queue, partition=partition.name, **overrides)
        # The bridge's client: the token file and API version its settings name (the bed's unless
        # a test overrides them).
        slurm = SlurmClient(
            settings.slurm_rest_url,
            user_name=settings.slurm_user_name,
            token_file=settings.slurm_jwt_file,
            api_version=settings.slurm_api_version,
        )
        stack = Stack(kube, temporal_client, slurm, slurm_bed, partition, settings, kubeconfig)
        stacks.append(stack)
        if bridge:
            await stack.start_bridge()
        return stack

    yield make

    for stack in stacks:
        await stack.stop_bridge()
        await stack.slurm.close()
        # Nothing left behind: no pod still carries our finalizer, no job still holds nodes.
        stuck = [
            p["metadata"]["name"]
            for p in stack.kube.objects("pods")
            if keys.FINALIZER in (p["metadata"].get("finalizers") or [])
        ]
        stack.kube.stop()
        live = [job for job in stack.slurm_bed.jobs_in_partition(stack.partition.name) if not job.ended]
        stack.partition.cleanup()
        assert not stuck, f"pods left with the bridge finalizer: {stuck}"
        assert not live, f"Slurm jobs left running or pending: {live}"


@pytest.fixture
async def make_nodes(
    temporal_client: Client, slurm_bed: SlurmTestBed, tmp_path: Path, task_queue: str, make_kube: KubeFactory
) -> AsyncIterator[MakeNodes]:
    """Bridges whose node sync a test drives: `kubelet=True` runs bound pods (and ends deleted ones)."""
    stacks: list[NodeStack] = []

    async def make(*, kubelet: bool = False, **overrides: Any) -> NodeStack:
        kube = make_kube(f"nodes-{uuid.uuid4().hex[:8]}", kubelet)
        kubeconfig = kube.kubeconfig(tmp_path / f"kubeconfig-{len(stacks)}")
        settings = bed_settings(
            slurm_bed,
            kubeconfig,
            task_queue,
            # Runs come from the node watcher and the tests' own triggers, unless a test says otherwise.
            node_sync_interval=overrides.pop("node_sync_interval", 3600),
            # An installation of its own: node sync deletes the external Slurm nodes its installation
            # registered that its Kubernetes lacks, and tests running at the same time (another
            # test process, another session) register theirs on the same Slurm.
            installation_id=overrides.pop("installation_id", f"nodes-{uuid.uuid4().hex[:8]}"),
            **overrides,
        )
        slurm = bed_client(slurm_bed, settings.slurm_api_version)
        stack = NodeStack(kube, temporal_client, slurm, slurm_bed, settings, kubeconfig)
        stacks.append(stack)
        await stack.start()
        return stack

    yield make
    for stack in stacks:
        await stack.cleanup()  # deletes every Slurm node and partition named with the stack's prefix
