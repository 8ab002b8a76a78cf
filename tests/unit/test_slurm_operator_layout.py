"""Slinky slurm-operator interop, emulated on the fake API server over real HTTP.

The operator cannot run here; its layout can: the slurmrestd Service, the token
Secret, a NodeSet's slurmd pod on Kubernetes node kn-1, which the operator labels
`slinky.slurm.net/slurm-nodename=sn-1`. The bridge must map Slurm node sn-1 to kn-1
and node sync must leave sn-1 itself alone (only taint kn-1 and mirror drains).
No Slurm is involved: the Slurm side of the snapshot is what slurmrestd reports
for a dynamic slurmd node.
"""

import base64
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import pytest

from activities.node_source import ListedNodes, kubernetes_node_names
from activities.nodes import NodeActivities
from bridge import keys
from bridge.node_actions import SLURMD_NODE, AddTaint, NodeActions, NodeSnapshot, ReportEvent
from bridge.node_facts import kube_node_view
from bridge.node_sync import plan
from clients.kube_client import Json, KubeClient, api_path
from clients.slurm_client import SlurmClient
from testbed.kube_fake import FakeKubeServer
from testbed.kube_fake.resources import ResourceType

NAMESPACE = "slurm"
SCHEDULER = keys.DEFAULT_SCHEDULER_NAME
NODESET = "slurm-worker-slurm-bridge"  # the operator names NodeSets <release>-worker-<nodeset>
TOKEN = "header.payload.signature"


@pytest.fixture
def kube() -> Iterator[FakeKubeServer]:
    with FakeKubeServer() as server:
        server.register_resource(
            ResourceType("", "v1", "services", "Service", True, status_subresource=False)
        )
        server.register_resource(
            ResourceType("slinky.slurm.net", "v1beta1", "nodesets", "NodeSet", True, custom=True)
        )
        operator_layout(server)
        yield server


@pytest.fixture
async def client(kube: FakeKubeServer) -> AsyncIterator[KubeClient]:
    client = KubeClient(kube.aio_configuration())
    try:
        yield client
    finally:
        await client.close()


def operator_layout(server: FakeKubeServer) -> None:
    """What `helm install slurm oci://ghcr.io/slinkyproject/charts/slurm` leaves that the bridge meets."""
    server.create_object("namespaces", {"metadata": {"name": NAMESPACE}})
    server.create_object(
        "services",
        {
            "metadata": {"name": "slurm-restapi", "namespace": NAMESPACE},
            "spec": {
                "selector": {"app.kubernetes.io/name": "slurmrestd", "app.kubernetes.io/instance": "slurm"},
                "ports": [{"name": "slurmrestd", "port": 6820, "targetPort": 6820, "protocol": "TCP"}],
            },
        },
    )
    server.create_object(
        "secrets",
        {
            "metadata": {"name": "slurm-token-slurm", "namespace": NAMESPACE},
            "type": "Opaque",
            "data": {"auth-token": base64.b64encode(TOKEN.encode()).decode()},
        },
    )
    nodeset = server.create_object(
        "nodesets.slinky.slurm.net",
        {
            "apiVersion": "slinky.slurm.net/v1beta1",
            "kind": "NodeSet",
            "metadata": {"name": NODESET, "namespace": NAMESPACE},
            "spec": {"controllerRef": {"name": "slurm", "namespace": NAMESPACE}, "replicas": 1},
        },
    )
    server.create_node("kn-1", labels={keys.LABEL_SLURM_NODE_NAME: "sn-1"})
    server.create_node("web-1")  # Kubernetes only
    server.create_object(
        "pods",
        {
            "metadata": {
                "name": f"{NODESET}-0",
                "namespace": NAMESPACE,
                "labels": {
                    "app.kubernetes.io/name": "slurmd",
                    "app.kubernetes.io/instance": NODESET,
                    "nodeset.slinky.slurm.net/name": NODESET,
                },
                "ownerReferences": [
                    {
                        "apiVersion": "slinky.slurm.net/v1beta1",
                        "kind": "NodeSet",
                        "name": NODESET,
                        "uid": nodeset["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "nodeName": "kn-1",
                "hostname": "sn-1",  # slurmd registers under its pod's hostname
                "containers": [{"name": "slurmd", "image": "ghcr.io/slinkyproject/slurmd:25.11-ubuntu24.04"}],
            },
        },
    )


def dynamic_slurmd(name: str, *extra: str) -> Json:
    """sn-1 as slurmrestd reports a `slurmd -Z` node: DYNAMIC_NORM, never EXTERNAL, no comment of ours."""
    return {"name": name, "state": ["IDLE", "DYNAMIC_NORM", *extra], "cpus": 4, "real_memory": 8000}


async def snapshot(client: KubeClient, slurm_nodes: list[Json]) -> NodeSnapshot:
    listed = await client.request("GET", api_path("nodes"))
    return NodeSnapshot(
        kube_nodes=[kube_node_view(n) for n in listed["items"]],
        slurm_nodes=slurm_nodes,
        partitions=["slurm-bridge"],
    )


def sync_plan(snap: NodeSnapshot) -> list[Any]:
    return list(plan(snap, scheduler_name=SCHEDULER, default_partition=keys.DEFAULT_PARTITION))


async def test_the_operator_layout_is_what_the_docs_point_the_bridge_at(client: KubeClient) -> None:
    service = await client.request("GET", api_path("services", namespace=NAMESPACE, name="slurm-restapi"))
    assert [p["port"] for p in service["spec"]["ports"]] == [
        6820
    ]  # SLURM_REST_URL=http://slurm-restapi.slurm:6820
    secret = await client.request("GET", api_path("secrets", namespace=NAMESPACE, name="slurm-token-slurm"))
    assert base64.b64decode(secret["data"]["auth-token"]).decode() == TOKEN  # slurm.jwtSecret.key: auth-token


async def test_the_bridge_maps_the_slurmd_node_to_its_kubernetes_node(client: KubeClient) -> None:
    """What `bind` does with the allocation: the slurm-nodename label, else the same name."""
    nodes = ListedNodes(client, SCHEDULER)
    assert await kubernetes_node_names(client, nodes, ["sn-1", "web-1"]) == ["kn-1", "web-1"]


async def test_node_sync_taints_kn_1_and_leaves_sn_1_alone(client: KubeClient, kube: FakeKubeServer) -> None:
    # slurmd has not registered yet: nothing is registered in its place, even if asked by label.
    assert sync_plan(await snapshot(client, [])) == []
    kube.update_object(
        "nodes", "kn-1", lambda n: n["metadata"]["labels"].update({keys.LABEL_EXTERNAL_NODE_ALIAS: ""})
    )
    [event] = sync_plan(await snapshot(client, []))
    assert isinstance(event, ReportEvent)
    assert (event.reason, event.kube_node) == (SLURMD_NODE, "kn-1")

    # slurmd registered sn-1: kn-1 gets the taint (through the apply activity, over HTTP), nothing else.
    actions = [
        a for a in sync_plan(await snapshot(client, [dynamic_slurmd("sn-1")])) if a.kind != "report_event"
    ]
    uid = (kube.get_object("nodes", "kn-1") or {})["metadata"]["uid"]
    assert actions == [AddTaint(slurm_node="sn-1", kube_node="kn-1", kube_uid=uid)]
    nodes = NodeActivities(client, cast(SlurmClient, None), scheduler_name=SCHEDULER)  # taints need no Slurm
    report = await nodes.apply_node_actions(NodeActions(actions=actions))
    assert report.failed == []
    assert len(report.applied) == 1
    taints = (kube.get_object("nodes", "kn-1") or {})["spec"]["taints"]
    assert taints == [{"key": keys.TAINT_MANAGED_NODE, "value": SCHEDULER, "effect": "NoExecute"}]
    after = sync_plan(await snapshot(client, [dynamic_slurmd("sn-1")]))
    assert [a.kind for a in after] == ["report_event"]  # the ignored label, said again; nothing to change

    # The operator's node is cordoned: the drain is mirrored; it is never deleted or re-registered.
    kube.update_object("nodes", "kn-1", lambda n: n["spec"].update({"unschedulable": True}))
    cordoned = sync_plan(await snapshot(client, [dynamic_slurmd("sn-1")]))
    assert [a.kind for a in cordoned] == ["report_event", "drain_slurm_node"]
    # A Kubernetes-only node never appears in any plan.
    assert all(a.kube_node == "kn-1" for a in [*actions, *after, *cordoned])
