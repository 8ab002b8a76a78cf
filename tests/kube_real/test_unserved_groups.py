"""Optional API groups on a real API server that does not serve them (Kubernetes 1.28).

kube-apiserver answers a request under an API group it does not serve with 404 and the
plain-text body `404 page not found`, not a JSON Status (a served group answers a missing
object with a Status). `resource.k8s.io/v1` (DRA, served from 1.34), the coscheduling
plugin's `scheduling.x-k8s.io`, JobSet and LeaderWorkerSet are all absent here: every
place the bridge reads one must take that answer as "none", and node sync must run.

The Slurm side of node sync is a stand-in slurmrestd (httpx.MockTransport) that has no
nodes and the bridge's partition: only the Kubernetes side is under test.
"""

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from activities.dra import DeviceClaims
from activities.kube_reader import KubeReader, SchedulingDiscovery
from activities.nodes import NodeActivities
from bridge import keys
from bridge.dra import RESOURCE_GROUP
from bridge.grouping import LABEL_POD_GROUP, GroupError, PodGroupNotFound, resolve
from bridge.models import PodRef
from bridge.node_actions import CreateSlurmNode
from bridge.node_sync import plan
from clients.kube_client import KubeClient, KubeNotFound, api_path, load_configuration
from clients.slurm_client import SlurmClient
from testbed.kube_real.apiserver import ApiServer
from testbed.kube_real.cluster import RealCluster

SCHEDULER = keys.DEFAULT_SCHEDULER_NAME


@pytest.fixture
async def kube(real_apiserver: ApiServer, tmp_path: Path) -> AsyncIterator[KubeClient]:
    """The bridge's client, configured from a kubeconfig as the worker is."""
    configuration = await load_configuration(str(real_apiserver.kubeconfig(tmp_path / "kubeconfig")))
    client = KubeClient(configuration)
    yield client
    await client.close()


def slurmrestd(request: httpx.Request) -> httpx.Response:
    """A slurmrestd with no nodes yet and the bridge's partition."""
    empty: dict[str, Any] = {"errors": [], "warnings": []}
    if request.url.path.endswith("/nodes/"):
        return httpx.Response(200, json={"nodes": [], **empty})
    if request.url.path.endswith("/partitions/"):
        return httpx.Response(200, json={"partitions": [{"name": keys.DEFAULT_PARTITION}], **empty})
    return httpx.Response(404, json={"errors": [{"error": f"not in this stand-in: {request.url.path}"}]})


@pytest.fixture
async def slurm(tmp_path: Path) -> AsyncIterator[SlurmClient]:
    token = tmp_path / "jwt"
    token.write_text("token")
    async with SlurmClient(
        "http://slurmrestd:6820",
        user_name="slurm",
        token_file=token,
        transport=httpx.MockTransport(slurmrestd),
    ) as client:
        yield client


async def test_an_unserved_group_is_not_found_with_the_servers_text(kube: KubeClient) -> None:
    slices = api_path("resourceslices", group=RESOURCE_GROUP)
    with pytest.raises(KubeNotFound) as caught:
        await kube.request("GET", slices)
    assert caught.value.status == 404
    assert "404 page not found" in str(caught.value)
    assert f"GET {slices}" in str(caught.value)


async def test_node_sync_reads_its_snapshot_without_dra_and_registers_a_labelled_node(
    kube: KubeClient, slurm: SlurmClient, real_cluster: RealCluster
) -> None:
    name = f"{real_cluster.namespace}-gpu"
    real_cluster.create_node(name, labels={keys.LABEL_EXTERNAL_NODE: "true"})
    nodes = NodeActivities(kube, slurm, scheduler_name=SCHEDULER)

    snapshot = await nodes.read_snapshot()

    [view] = [n for n in snapshot.kube_nodes if n["metadata"]["name"] == name]
    assert view["metadata"]["labels"] == {keys.LABEL_EXTERNAL_NODE: "true"}
    assert "draGpus" not in view["status"]  # no ResourceSlices: DRA is not served
    actions = plan(snapshot, scheduler_name=SCHEDULER, default_partition=keys.DEFAULT_PARTITION)
    assert [a.slurm_node for a in actions if isinstance(a, CreateSlurmNode)] == [name]


async def test_no_resource_claims_device_classes_or_slices_without_dra(
    kube: KubeClient, slurm: SlurmClient, real_cluster: RealCluster
) -> None:
    claims = DeviceClaims(kube, slurm)
    ns = real_cluster.namespace
    # What the release step does after every placement: there is no claim to delete.
    assert await claims.delete_for([PodRef(namespace=ns, name="p", uid="u")]) == []
    # What binding a DRA pod reads first.
    assert await claims._device_classes() == []
    assert await claims._slices(f"{ns}-node") == []


async def test_owners_and_groups_of_unserved_kinds_read_as_absent(
    kube: KubeClient, real_cluster: RealCluster
) -> None:
    ns = real_cluster.namespace
    reader = KubeReader(kube)
    in_group = {"metadata": {"name": "g", "namespace": ns, "labels": {LABEL_POD_GROUP: "pg"}}, "spec": {}}
    with pytest.raises(PodGroupNotFound):  # waits for its PodGroup, as with the plugin installed
        await resolve(reader, in_group)
    for api_version, kind in (
        ("jobset.x-k8s.io/v1alpha2", "JobSet"),
        ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"),
    ):
        owned = {
            "metadata": {
                "name": "w",
                "namespace": ns,
                "ownerReferences": [
                    {"apiVersion": api_version, "kind": kind, "name": "x", "uid": "u", "controller": True}
                ],
            },
            "spec": {},
        }
        with pytest.raises(GroupError, match=f"{kind} {ns}/x, which owns the pod, does not exist"):
            await resolve(reader, owned)
    # 1.28 serves scheduling.k8s.io/v1 only (PriorityClass): no built-in PodGroups.
    assert await SchedulingDiscovery(kube).served() is None
