"""Every node layout a site uses, on the real API server with real Slurm and real node sync.

How a Kubernetes node and a Slurm node are paired decides what the bridge manages
and where it may place. Each scenario builds one layout, lets node sync run, and
then checks the node rules and binding through placements:

- `slurm-operator`: slurm-operator's default (DaemonSet NodeSets): the Slurm node
  is named like its Kubernetes node and nothing labels it;
- `external-label`: Kubernetes nodes labelled `scheduler.slinky.slurm.net/external-node`,
  registered by node sync as external Slurm nodes;
- `nodename-label`: Kubernetes nodes mapped to differently named Slurm nodes by the
  `slinky.slurm.net/slurm-nodename` label;
- `mixed`: one of each, plus a labelled node that is not Ready (not registered yet)
  and a node Slurm does not know (never used, never tainted).

Slurm takes the first free node of a partition, so each rule steers a pod away
from it: a pod placed there anyway shows the rule was not given to Slurm.
No kubelet runs: the test writes the pods' end (as a kubelet would), and a node
made Ready has its not-ready taint lifted by the harness (the node lifecycle
controller's part).
"""

import asyncio
import functools
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from bridge import hostlist, keys
from testbed.slurm_bed import SlurmTestBed
from tests.e2e.conftest import ON_REAL_KUBE, MakeNodes
from tests.e2e.harness import Pod, bound, finished_cleanly, job_id_of, make_pod
from tests.e2e.node_fixtures import Json, NodeStack
from worker.node_cache import NodeCache

pytestmark = [pytest.mark.slurm, ON_REAL_KUBE]

LAYOUTS = ["slurm-operator", "external-label", "nodename-label", "mixed"]


@dataclass(frozen=True)
class Pair:
    kube: str
    slurm: str


@dataclass
class Layout:
    nodes: list[Pair]  # the nodes the bridge places on, in Slurm's order of preference
    unknown: list[str]  # Kubernetes nodes Slurm does not know


def build(stack: NodeStack, bed: SlurmTestBed, layout: str) -> Layout:
    """The Kubernetes (and, where node sync does not register them, Slurm) nodes of a layout."""
    made = bed.make_partition(nodes=2 if layout in ("slurm-operator", "nodename-label") else 1)
    stack.partitions.append(made)
    pairs: list[Pair] = []
    unknown: list[str] = []
    if layout in ("slurm-operator", "mixed"):
        name = made.node_names[0]
        stack.add_node("", name=name)
        pairs.append(Pair(name, name))
    if layout == "slurm-operator":
        name = made.node_names[1]
        stack.add_node("", name=name)
        pairs.append(Pair(name, name))
    if layout in ("nodename-label", "mixed"):
        slurm_names = made.node_names if layout == "nodename-label" else [made.node_names[0]]
        for index, slurm_name in enumerate(slurm_names):
            if layout == "mixed":
                # The label must point at a Slurm node of its own: make one more.
                extra = bed.make_partition(nodes=1)
                stack.partitions.append(extra)
                slurm_name = extra.node_names[0]
            kube_name = stack.add_node(f"k8s-{index}", labels={keys.LABEL_SLURM_NODE_NAME: slurm_name})
            pairs.append(Pair(kube_name, slurm_name))
    if layout in ("external-label", "mixed"):
        count = 2 if layout == "external-label" else 1
        for index in range(count):
            name = stack.add_external_node(f"ext-{index}", made.name)
            pairs.append(Pair(name, name))
    if layout == "mixed":
        # Labelled but not Ready: node sync defers its registration; it must not hide the others.
        waiting = stack.add_external_node("ext-waiting", made.name)
        stack.set_ready(waiting, False)
        unknown.append(stack.add_node("web"))
    return Layout(pairs, unknown)


def placement_partition(stack: NodeStack, bed: SlurmTestBed, name: str, layout: Layout) -> None:
    """The partition the bridge submits to: exactly the layout's Slurm nodes."""
    nodes = ",".join(pair.slurm for pair in layout.nodes)
    bed.scontrol("create", f"PartitionName={name}", f"Nodes={nodes}", "MaxTime=INFINITE", "State=UP")
    stack.job_partitions.append(name)


def pod_namespace(stack: NodeStack) -> str:
    namespace = getattr(stack.kube, "namespace", None)
    assert isinstance(namespace, str)
    return namespace


async def place(stack: NodeStack, name: str, **spec: Any) -> tuple[Pod, dict[str, Any]]:
    """A pod placed by the bridge: the bound pod and its Slurm job."""
    namespace = pod_namespace(stack)
    pod = make_pod(namespace, name)
    pod["spec"].update(spec)
    stack.kube.create_object("pods", pod)

    def placed() -> Pod:
        current = stack.kube.get_object("pods", name, namespace)
        return current if current is not None and bound(current) else {}

    pod = await stack.kube.wait_for_async(placed, timeout=60)
    job_id = job_id_of(pod)
    assert job_id is not None
    return pod, (await stack.slurm.get_job(job_id)).model_dump(mode="json")


async def finish(stack: NodeStack, name: str) -> None:
    namespace = pod_namespace(stack)
    stack.kube.set_pod_phase(namespace, name, "Succeeded")
    await stack.kube.wait_for_async(
        lambda: finished_cleanly(stack.kube.get_object("pods", name, namespace)), 30
    )


async def seen_by_bridge(stack: NodeStack, name: str, check: Callable[[Json], bool]) -> None:
    """Until the bridge's node cache, which placements read, shows the change (a watch event
    later than the write: a pod created in between may be placed by the node as it was)."""
    assert stack.bridge is not None

    def shown(cache: NodeCache) -> bool:
        return any(node["metadata"]["name"] == name and check(node) for node in cache.nodes_now())

    async with asyncio.timeout(30):
        await stack.bridge.node_cache.wait_until(shown)


def excluded(job: dict[str, Any]) -> set[str]:
    return set(hostlist.expand(job.get("excluded_nodes") or ""))


@pytest.mark.parametrize("layout", LAYOUTS)
async def test_node_sync_rules_and_binding_hold_on_every_layout(
    make_nodes: MakeNodes, slurm_bed: SlurmTestBed, layout: str
) -> None:
    partition = f"lay-{secrets.token_hex(3)}"
    stack = await make_nodes(partition=partition)
    nodes = build(stack, slurm_bed, layout)
    await stack.sync()

    # Node sync: every node the bridge places on is managed (tainted), the others never are.
    for pair in nodes.nodes:
        await stack.wait_kube(functools.partial(stack.tainted, pair.kube))
        assert await stack.slurm_node(pair.slurm) is not None
    for name in nodes.unknown:
        assert not stack.tainted(name)
    placement_partition(stack, slurm_bed, partition, nodes)
    first, *others = nodes.nodes
    last = others[-1]
    everyone_but_last = {pair.slurm for pair in nodes.nodes} - {last.slurm}

    # A nodeSelector naming the last node: Slurm is told to keep off every other node.
    pod, job = await place(stack, "pinned", nodeSelector={"kubernetes.io/hostname": last.kube})
    assert bound(pod) == last.kube
    assert everyone_but_last <= excluded(job)
    assert last.slurm not in excluded(job)
    await finish(stack, "pinned")

    # An untolerated taint on the first node keeps the pod off it.
    taint = {"key": "maintenance", "value": "disk", "effect": "NoSchedule"}
    stack.edit_node(first.kube, lambda node: node["spec"]["taints"].append(taint))
    await seen_by_bridge(stack, first.kube, lambda node: taint in (node["spec"].get("taints") or []))
    pod, job = await place(stack, "plain")
    assert bound(pod) != first.kube
    assert first.slurm in excluded(job)
    await finish(stack, "plain")

    # Cordoned: drained in Slurm (node sync) and excluded by the rules (the placement).
    stack.edit_node(first.kube, lambda node: node["spec"]["taints"].remove(taint))
    stack.cordon(first.kube)
    await stack.wait_slurm(first.slurm, lambda node: "DRAIN" in (node or {}).get("state", []))
    pod, job = await place(stack, "after-cordon")
    assert bound(pod) != first.kube
    assert first.slurm in excluded(job)
    await finish(stack, "after-cordon")
