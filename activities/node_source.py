"""Where the placement activities read the bridge's Kubernetes nodes from.

The bridge's nodes are those `bridge.feasibility.is_bridge_node` names: labelled
for registration, mapped by the slurm-nodename label, or marked by node sync as
the namesakes of Slurm nodes (the managed-node taint). A taint cannot be selected
on the server, so a listing reads every node and keeps the bridge's: `ListedNodes`
does so on every call. The worker passes a watched cache instead
(worker/node_cache.py), so a placement costs no node request at all.
"""

from collections.abc import Callable, Iterable, Sequence
from typing import Generic, Protocol, TypeVar

from temporalio.exceptions import ApplicationError

from bridge import keys
from bridge.feasibility import is_bridge_node, slurm_node_name
from clients.kube_client import Json, KubeClient, KubeNotFound, api_path
from clients.slurm_client import SlurmClient

T = TypeVar("T")
NODE_NOT_FOUND = "NodeNotFound"  # the failure type of a placement whose node Kubernetes lacks


class NodeSource(Protocol):
    async def bridge_nodes(self) -> Sequence[Json]:
        """The bridge's nodes, whole objects as the API server serves them (not to be changed:
        a cache hands the same ones to every caller)."""
        ...


async def list_bridge_nodes(kube: KubeClient, scheduler_name: str) -> list[Json]:
    """The bridge's nodes, from one listing of the cluster's nodes."""
    listed = await kube.request("GET", api_path("nodes"))
    return [node for node in listed.get("items", []) if is_bridge_node(node, scheduler_name)]


class ListedNodes:
    """Lists the nodes on every call: for tools and tests that run no cache."""

    def __init__(self, kube: KubeClient, scheduler_name: str) -> None:
        self.kube = kube
        self.scheduler_name = scheduler_name

    async def bridge_nodes(self) -> list[Json]:
        return await list_bridge_nodes(self.kube, self.scheduler_name)


class PerSnapshot(Generic[T]):
    """What `derive` makes of the nodes last asked about, made again only for other nodes.

    The node cache hands out one snapshot per state of its store (worker/node_cache.py), so the
    placements submitted between two node changes derive what they need from the nodes (their
    capacity, which nodes each set of node rules keeps pods off) once, not once each: work that
    grows with the cluster, on the worker's one event loop. A listing is a new object each time,
    and is derived from each time.
    """

    def __init__(self, derive: Callable[[Sequence[Json]], T]) -> None:
        self._derive = derive
        self._last: tuple[Sequence[Json], T] | None = None

    def of(self, nodes: Sequence[Json]) -> T:
        if self._last is None or self._last[0] is not nodes:
            self._last = (nodes, self._derive(nodes))
        return self._last[1]


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


class SlurmNodeNames:
    """The names of Slurm's nodes, listed on first use and kept for the rest of one pass."""

    def __init__(self, slurm: SlurmClient) -> None:
        self._slurm = slurm
        self._names: set[str] | None = None

    async def names(self) -> set[str]:
        if self._names is None:
            self._names = {node.name for node in await self._slurm.list_nodes() if node.name}
        return self._names


async def with_departed_nodes(
    in_slurm: SlurmNodeNames, wanted: list[str] | None, current: Iterable[str], nodes: Sequence[Json]
) -> list[str] | None:
    """A pending job's exclusions: `wanted` (the nodes its pods' rules rule out), plus the nodes it
    excludes now that Kubernetes no longer lists but Slurm still has.

    A node deleted from Kubernetes stays in Slurm until node sync drains and removes it. Lifting
    its exclusion in between would let Slurm start the job there, on a node no pod can be bound
    to; node sync lifts it itself once the node is drained, before deleting it.

    Slurm is asked (one listing of its nodes) only when such a node exists: `GET /node/NAME`
    keeps answering for a node deleted moments ago (slurmrestd's cached view).
    """
    known = {slurm_node_name(node) for node in nodes}
    departed = set(current) - set(wanted or []) - known
    if not departed:
        return wanted
    kept = departed & await in_slurm.names()
    return sorted({*(wanted or []), *kept}) or None


async def unsubmitted_scheduler_pods(kube: KubeClient, scheduler_name: str) -> list[Json]:
    """The scheduler's pods not bound and without a Slurm job id: those of placements that have
    submitted nothing (no node fitted, or not yet tried). One listing, by field and label selectors."""
    listed = await kube.request(
        "GET",
        api_path("pods"),
        query={
            "fieldSelector": f"spec.schedulerName={scheduler_name},spec.nodeName=",
            "labelSelector": f"!{keys.LABEL_SLURM_JOB_ID}",
        },
    )
    return list(listed.get("items", []))


async def unbound_bridge_pods(kube: KubeClient, scheduler_name: str) -> list[Json]:
    """The scheduler's pods that carry a Slurm job id and are not bound yet: those whose jobs may
    be pending. One listing, by field and label selectors."""
    listed = await kube.request(
        "GET",
        api_path("pods"),
        query={
            "fieldSelector": f"spec.schedulerName={scheduler_name},spec.nodeName=",
            "labelSelector": keys.LABEL_SLURM_JOB_ID,
        },
    )
    return list(listed.get("items", []))
