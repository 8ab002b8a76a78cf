"""The bridge's Kubernetes nodes, kept by watching them: placements read nodes for free.

Every placement reads the bridge's nodes (to exclude those its pods may not
run on, and to map the allocated Slurm nodes to Kubernetes ones). Listing them
costs a request that reads every node of the cluster (what makes a node the
bridge's, `bridge.feasibility.is_bridge_node`, includes node sync's taint,
which no selector can pick); this cache costs one watch of the nodes per
replica instead, whatever the number of placements. Every replica runs one,
since activities run on every replica.

Until the watch has listed once, and whenever this cache is not running,
`bridge_nodes()` lists as before: a placement never waits for the cache. The
cache lags the API server by a watch event's delivery (milliseconds); a node
change that a placement's exclusions missed is caught by the exclusion refresh
that follows every node change (worker/node_rules.py, which lists afresh).

Memory follows the bridge's nodes: other nodes are not kept, and the parts of
a node no rule reads (the image list, managed fields) are dropped.
"""

import asyncio
import copy
from collections.abc import Callable

from activities.node_source import list_bridge_nodes
from bridge.feasibility import is_bridge_node
from clients.informer import EventType, Informer, missing
from clients.kube_client import Json, KubeClient, api_path


def trimmed(node: Json) -> Json:
    """The node without the parts that only make it big (pulled images, field managers)."""
    node = copy.copy(node)
    node["metadata"] = {k: v for k, v in (node.get("metadata") or {}).items() if k != "managedFields"}
    node["status"] = {k: v for k, v in (node.get("status") or {}).items() if k != "images"}
    return node


class NodeCache:
    """A `NodeSource` (activities/node_source.py) fed by a watch; see the module docstring."""

    def __init__(self, kube: KubeClient, scheduler_name: str) -> None:
        self.kube = kube
        self.scheduler_name = scheduler_name
        self._changed = asyncio.Event()
        self._nodes: dict[str, Json] = {}
        self._informer = Informer(
            kube,
            api_path("nodes"),
            name="bridge nodes",
            on_event=self._on_event,
            on_synced=self._on_synced,
        )
        self._running = False
        self.reads = 0  # calls answered from the watch
        self.listings = 0  # calls answered by listing, because the cache was not synced

    @property
    def synced(self) -> bool:
        return self._running and self._informer.synced.is_set()

    async def run(self) -> None:
        """Watch until cancelled."""
        self._running = True
        try:
            await self._informer.run()
        finally:
            self._running = False

    async def bridge_nodes(self) -> list[Json]:
        if not self.synced:
            self.listings += 1
            return await list_bridge_nodes(self.kube, self.scheduler_name)
        self.reads += 1
        return self.nodes_now()

    async def wait_until(self, predicate: Callable[["NodeCache"], bool]) -> None:
        """Return once `predicate(self)` holds, checked after each change the watch brings."""
        while not predicate(self):
            self._changed.clear()
            await self._changed.wait()

    def nodes_now(self) -> list[Json]:
        """What the watch has seen so far (complete only once `synced`)."""
        return list(self._nodes.values())

    def _on_event(self, kind: EventType, node: Json) -> None:
        name = node["metadata"]["name"]
        # A node that stops being the bridge's (node sync lifted its taint) leaves the cache.
        if kind == "DELETED" or not is_bridge_node(node, self.scheduler_name):
            self._nodes.pop(name, None)
        else:
            self._nodes[name] = trimmed(node)
        self._changed.set()

    def _on_synced(self, names: frozenset[str]) -> None:
        for name in missing(self._nodes, names):
            del self._nodes[name]
        self._changed.set()
