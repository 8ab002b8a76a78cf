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

import copy
from collections.abc import Callable, Sequence

from activities.node_source import list_bridge_nodes
from bridge.feasibility import is_bridge_node
from clients.kube_client import Json, KubeClient, api_path
from clients.watched import WatchedObjects


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
        # A node that stops being the bridge's (node sync lifted its taint) leaves the store.
        self._store = WatchedObjects(kube, api_path("nodes"), self._kept, name="bridge nodes")
        self._running = False
        self._snapshot: tuple[int, tuple[Json, ...]] = (-1, ())  # (the store's version, its nodes)
        self.reads = 0  # calls answered from the watch
        self.listings = 0  # calls answered by listing, because the cache was not synced

    @property
    def synced(self) -> bool:
        return self._running and self._store.synced.is_set()

    async def run(self) -> None:
        """Watch until cancelled."""
        self._running = True
        try:
            await self._store.run()
        finally:
            self._running = False

    async def bridge_nodes(self) -> Sequence[Json]:
        if not self.synced:
            self.listings += 1
            return await list_bridge_nodes(self.kube, self.scheduler_name)
        self.reads += 1
        return self.nodes_now()

    async def wait_until(self, predicate: Callable[["NodeCache"], bool]) -> None:
        """Return once `predicate(self)` holds, checked after each change the watch brings."""
        await self._store.wait_until(lambda: predicate(self))

    def nodes_now(self) -> Sequence[Json]:
        """What the watch has seen so far (complete only once `synced`).

        One tuple per state of the store, the same object until a node changes: what placements
        work out from the nodes (activities/node_source.py, `PerSnapshot`) is worked out once.
        """
        version, nodes = self._snapshot
        if version != self._store.version:
            nodes = tuple(self._store.items.values())
            self._snapshot = (self._store.version, nodes)
        return nodes

    def _kept(self, node: Json) -> Json | None:
        return trimmed(node) if is_bridge_node(node, self.scheduler_name) else None
