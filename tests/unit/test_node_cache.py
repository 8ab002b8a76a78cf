"""The watched cache of the bridge's nodes, against the fake API server over real HTTP.

It answers what listing the bridge's nodes would (nodes registered by node
sync under either label spelling, nodes mapped by the slurm-nodename label,
namesakes of Slurm nodes that node sync marked with the managed-node taint of
this scheduler, nothing else), follows labels, taints and deletions through its
watch, costs no request per read once synced, and lists while it is not synced.
"""

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

import pytest

from activities.node_source import ListedNodes, PerSnapshot, kubernetes_node_names
from bridge import keys
from bridge.resources import total_allocatable
from clients.kube_client import Json, KubeClient, api_path
from testbed.kube_fake import FakeKubeServer
from worker.node_cache import NodeCache, trimmed

NODES = api_path("nodes")
EXTERNAL, ALIAS = keys.LABELS_EXTERNAL_NODE
SCHEDULER = keys.DEFAULT_SCHEDULER_NAME


def managed_taint(scheduler: str = SCHEDULER) -> Json:
    """Node sync's mark of a Kubernetes node whose name Slurm knows."""
    return {"key": keys.TAINT_MANAGED_NODE, "value": scheduler, "effect": "NoExecute"}


@pytest.fixture
async def cache(client: KubeClient) -> AsyncIterator[NodeCache]:
    cache = NodeCache(client, SCHEDULER)
    task = asyncio.create_task(cache.run())
    yield cache
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def names(nodes: Sequence[Json]) -> set[str]:
    return {node["metadata"]["name"] for node in nodes}


def node_lists(kube: FakeKubeServer) -> int:
    return sum(1 for r in kube.requests if r.method == "GET" and r.path == NODES and "watch" not in r.query)


def requests_but_watches(kube: FakeKubeServer) -> list[object]:
    """What was asked apart from the cache's own watches, which open right after
    the listing that synced it, so may land after `synced` is seen."""
    return [r for r in kube.requests if "watch" not in r.query]


async def until(cache: NodeCache, done: Callable[[NodeCache], bool]) -> None:
    """Watch events arrive asynchronously: wait for the cache to reflect one (bounded)."""
    async with asyncio.timeout(5):
        await cache.wait_until(done)


def bridge_node_set(kube: FakeKubeServer) -> None:
    kube.create_node("registered", labels={EXTERNAL: "true"})
    kube.create_node("alias", labels={ALIAS: "true"})
    kube.create_node("slurmd", labels={keys.LABEL_SLURM_NODE_NAME: "sn-1"})
    kube.create_node("web")  # not the bridge's
    for name, scheduler in (("namesake", SCHEDULER), ("other-bridge", "another-scheduler")):
        kube.create_node(name)
        kube.update_object("nodes", name, tainted([managed_taint(scheduler)]))


def tainted(taints: list[Json]) -> Callable[[Json], None]:
    def apply(node: Json) -> None:
        node["spec"]["taints"] = taints

    return apply


BRIDGE_NODES = {"registered", "alias", "slurmd", "namesake"}


async def test_answers_what_listing_the_bridge_nodes_answers(
    kube: FakeKubeServer, client: KubeClient, cache: NodeCache
) -> None:
    bridge_node_set(kube)
    listed = await ListedNodes(client, SCHEDULER).bridge_nodes()
    await until(cache, lambda c: c.synced)
    assert names(await cache.bridge_nodes()) == names(listed) == BRIDGE_NODES


async def test_reads_cost_no_request_once_synced(
    kube: FakeKubeServer, client: KubeClient, cache: NodeCache
) -> None:
    bridge_node_set(kube)
    await until(cache, lambda c: c.synced)
    kube.clear_requests()
    for _ in range(20):
        await cache.bridge_nodes()
    assert requests_but_watches(kube) == []
    # Mapping Slurm names to Kubernetes ones reads the cache too.
    assert await kubernetes_node_names(client, cache, ["sn-1", "registered"]) == ["slurmd", "registered"]
    assert requests_but_watches(kube) == []
    assert (cache.reads, cache.listings) == (21, 0)


async def test_lists_until_synced(kube: FakeKubeServer, client: KubeClient) -> None:
    bridge_node_set(kube)
    cache = NodeCache(client, SCHEDULER)  # not running
    assert names(await cache.bridge_nodes()) == BRIDGE_NODES
    assert cache.listings == 1
    assert node_lists(kube) == 1


async def test_follows_labels_taints_and_deletions(
    kube: FakeKubeServer, client: KubeClient, cache: NodeCache
) -> None:
    bridge_node_set(kube)
    await until(cache, lambda c: c.synced)

    def cached(cache: NodeCache) -> dict[str, Json]:
        return {node["metadata"]["name"]: node for node in cache.nodes_now()}

    kube.update_object("nodes", "web", lambda node: node["metadata"]["labels"].update({EXTERNAL: "true"}))
    await until(cache, lambda c: "web" in cached(c))
    taint = {"key": "gpu", "value": "yes", "effect": "NoSchedule"}
    kube.update_object("nodes", "web", lambda node: node["spec"].update({"taints": [taint]}))
    await until(cache, lambda c: cached(c)["web"]["spec"].get("taints") == [taint])

    def unlabel(node: Json) -> None:
        del node["metadata"]["labels"][EXTERNAL]

    kube.update_object("nodes", "registered", unlabel)
    await until(cache, lambda c: "registered" not in cached(c))
    kube.delete_object("nodes", "alias")
    await until(cache, lambda c: "alias" not in cached(c))
    # Node sync lifts its mark when Slurm no longer has the namesake, and the node leaves the cache.
    kube.update_object("nodes", "namesake", tainted([]))
    await until(cache, lambda c: "namesake" not in cached(c))
    kube.update_object("nodes", "other-bridge", tainted([managed_taint()]))
    await until(cache, lambda c: "other-bridge" in cached(c))
    assert set(cached(cache)) == {"slurmd", "web", "other-bridge"}


def test_keeps_only_what_node_rules_read() -> None:
    node: Json = {
        "metadata": {"name": "n", "labels": {"a": "b"}, "managedFields": [{"manager": "kubelet"}]},
        "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
        "status": {"images": [{"names": ["big"]}], "allocatable": {"cpu": "4"}, "conditions": []},
    }
    kept = trimmed(node)
    assert kept == {
        "metadata": {"name": "n", "labels": {"a": "b"}},
        "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"cpu": "4"}, "conditions": []},
    }
    assert "managedFields" in node["metadata"]  # the event's object is not changed


async def test_hands_out_one_snapshot_until_a_node_changes(
    kube: FakeKubeServer, client: KubeClient, cache: NodeCache
) -> None:
    """What placements work out from the nodes (the cluster's capacity) is then worked out once per
    change, not once per submission: at 1,000 nodes summing them took a tenth of the event loop."""
    bridge_node_set(kube)
    await until(cache, lambda c: c.synced)
    first = await cache.bridge_nodes()
    assert await cache.bridge_nodes() is first
    kube.update_object("nodes", "registered", lambda node: node["status"]["allocatable"].update({"cpu": "9"}))
    await until(cache, lambda c: c.nodes_now() is not first)
    changed = await cache.bridge_nodes()
    assert {n["metadata"]["name"]: n["status"]["allocatable"]["cpu"] for n in changed}["registered"] == "9"
    assert await cache.bridge_nodes() is changed


async def test_the_capacity_of_one_snapshot_is_summed_once(
    kube: FakeKubeServer, client: KubeClient, cache: NodeCache
) -> None:
    bridge_node_set(kube)
    await until(cache, lambda c: c.synced)
    capacity = PerSnapshot(total_allocatable)
    first = capacity.of(await cache.bridge_nodes())
    assert first.nodes == len(BRIDGE_NODES)
    assert capacity.of(await cache.bridge_nodes()) is first
    before = cache.nodes_now()
    kube.update_object("nodes", "registered", lambda node: node["status"]["allocatable"].update({"cpu": "9"}))
    await until(cache, lambda c: c.nodes_now() is not before)
    assert capacity.of(await cache.bridge_nodes()).allocatable["cpu"] == first.allocatable["cpu"] + 5
    # A listing is new each time: summed each time.
    listed = ListedNodes(client, SCHEDULER)
    assert capacity.of(await listed.bridge_nodes()) is not capacity.of(await listed.bridge_nodes())
