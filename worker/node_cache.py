"""The bridge's Kubernetes nodes, kept by watching them: placements read nodes for free.

Every placement reads the bridge's nodes (to exclude those its pods may not
run on, and to map the allocated Slurm nodes to Kubernetes ones). Listing them
costs one request per label that makes a node the bridge's (selectors cannot
OR keys) and grows with the number of nodes; this cache costs one watch per
label per replica instead, whatever the number of placements. Every replica
runs one, since activities run on every replica.

Until each watch has listed once, and whenever this cache is not running,
`bridge_nodes()` lists as before: a placement never waits for the cache. The
cache lags the API server by a watch event's delivery (milliseconds); a node
change that a placement's exclusions missed is caught by the exclusion refresh
that follows every node change (worker/node_rules.py, which lists afresh).

Memory follows the bridge's nodes: the parts of a node no rule reads (the
image list, managed fields) are dropped.
"""

import asyncio
import copy
from collections.abc import Callable

from activities.kube_client import Json, KubeClient, api_path
from activities.node_source import SELECTORS, list_bridge_nodes
from worker.informer import EventType, Informer, missing


def trimmed(node: Json) -> Json:
    """The node without the parts that only make it big (pulled images, field managers)."""
    node = copy.copy(node)
    node["metadata"] = {k: v for k, v in (node.get("metadata") or {}).items() if k != "managedFields"}
    node["status"] = {k: v for k, v in (node.get("status") or {}).items() if k != "images"}
    return node


class _Selected:
    """The nodes one label selects, by name."""

    def __init__(self, kube: KubeClient, selector: str, changed: asyncio.Event) -> None:
        self.nodes: dict[str, Json] = {}
        self.changed = changed
        self.informer = Informer(
            kube,
            api_path("nodes"),
            name=f"bridge nodes ({selector})",
            label_selector=selector,
            on_event=self._on_event,
            on_synced=self._on_synced,
        )

    def _on_event(self, kind: EventType, node: Json) -> None:
        name = node["metadata"]["name"]
        if kind == "DELETED":
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = trimmed(node)
        self.changed.set()

    def _on_synced(self, names: frozenset[str]) -> None:
        for name in missing(self.nodes, names):
            del self.nodes[name]
        self.changed.set()


class NodeCache:
    """A `NodeSource` (activities/node_source.py) fed by watches; see the module docstring."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self._changed = asyncio.Event()
        self._selected = [_Selected(kube, selector, self._changed) for selector in SELECTORS]
        self._running = False
        self.reads = 0  # calls answered from the watches
        self.listings = 0  # calls answered by listing, because the cache was not synced

    @property
    def synced(self) -> bool:
        return self._running and all(part.informer.synced.is_set() for part in self._selected)

    async def run(self) -> None:
        """Watch until cancelled."""
        self._running = True
        try:
            await asyncio.gather(*(part.informer.run() for part in self._selected))
        finally:
            self._running = False

    async def bridge_nodes(self) -> list[Json]:
        if not self.synced:
            self.listings += 1
            return await list_bridge_nodes(self.kube)
        self.reads += 1
        return self.nodes_now()

    async def wait_until(self, predicate: Callable[["NodeCache"], bool]) -> None:
        """Return once `predicate(self)` holds, checked after each change the watches bring."""
        while not predicate(self):
            self._changed.clear()
            await self._changed.wait()

    def nodes_now(self) -> list[Json]:
        """What the watches have seen so far (complete only once `synced`)."""
        nodes: dict[str, Json] = {}
        for part in self._selected:
            nodes.update(part.nodes)
        return list(nodes.values())
