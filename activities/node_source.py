"""Where the placement activities read the bridge's Kubernetes nodes from.

The bridge's nodes are those registered by node sync (the external-node
label, under either spelling) and those running slurmd (mapped by the
slurm-nodename label). Kubernetes label selectors cannot OR keys, so one
listing is one request per label: `ListedNodes` makes them on every call.
The worker passes a watched cache instead (worker/node_cache.py), so a
placement costs no node request at all.
"""

from typing import Protocol

from temporalio.exceptions import ApplicationError

from activities.kube_client import Json, KubeClient, KubeNotFound, api_path
from bridge import keys
from bridge.feasibility import BRIDGE_NODE_LABELS

NODE_NOT_FOUND = "NodeNotFound"  # the failure type of a placement whose node Kubernetes lacks
# One label selector per way a node becomes the bridge's (`bridge.feasibility.is_bridge_node`).
SELECTORS = BRIDGE_NODE_LABELS


class NodeSource(Protocol):
    async def bridge_nodes(self) -> list[Json]:
        """The bridge's nodes, whole objects as the API server serves them."""
        ...


async def list_bridge_nodes(kube: KubeClient) -> list[Json]:
    """The bridge's nodes, listed by label: the cost follows the bridge's nodes, not the cluster's."""
    nodes: dict[str, Json] = {}
    for selector in SELECTORS:
        listed = await kube.request("GET", api_path("nodes"), query={"labelSelector": selector})
        nodes.update({node["metadata"]["name"]: node for node in listed.get("items", [])})
    return list(nodes.values())


class ListedNodes:
    """Lists the nodes on every call: for tools and tests that run no cache."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube

    async def bridge_nodes(self) -> list[Json]:
        return await list_bridge_nodes(self.kube)


async def kubernetes_node_names(kube: KubeClient, source: NodeSource, slurm_nodes: list[str]) -> list[str]:
    """Kubernetes node names for Slurm node names: the slurm-nodename label, else the same name.

    A name that matches no bridge node is looked up directly (a node Slurm and
    Kubernetes both know by one name, without the bridge's labels); one that
    matches no node at all fails the placement with what to do about it.
    """
    nodes = await source.bridge_nodes()
    by_label = {
        labels[keys.LABEL_SLURM_NODE_NAME]: node["metadata"]["name"]
        for node in nodes
        if keys.LABEL_SLURM_NODE_NAME in (labels := node["metadata"].get("labels") or {})
    }
    known = {node["metadata"]["name"] for node in nodes}
    names = []
    for slurm_name in slurm_nodes:
        name = by_label.get(slurm_name, slurm_name)
        if name not in known:
            try:
                await kube.request("GET", api_path("nodes", name=name))
            except KubeNotFound:
                raise ApplicationError(
                    f"Slurm allocated node {slurm_name!r}, which matches no Kubernetes node: label the "
                    f"Kubernetes node with {keys.LABEL_SLURM_NODE_NAME}={slurm_name} or name it the same",
                    type=NODE_NOT_FOUND,
                    non_retryable=True,
                ) from None
        names.append(name)
    return names
