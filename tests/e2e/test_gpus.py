"""GPU pods placed by real Slurm: a pod lands only where enough GPUs are free.

The test bed's Slurm has GresTypes=gpu and a gres.conf (docs/slurm-testbed.md),
so GPUs are really counted and allocated; the Kubernetes nodes carry the same
counts as `nvidia.com/gpu`, as node sync would have registered them from.
"""

from typing import Any

import pytest

from bridge import grouping, keys
from tests.e2e.conftest import ON_REAL_KUBE, StackFactory
from tests.e2e.harness import Pod, Stack, bound, finished_cleanly, job_id_of, make_pod

pytestmark = [pytest.mark.slurm, ON_REAL_KUBE]
SHARED = {keys.SLURMJOB_PREFIX + "exclusive": "false"}  # GPUs, not whole nodes, must be what keeps pods apart


def gpus(count: int) -> dict[str, str]:
    return {"nvidia.com/gpu": str(count)}


def pending_for(reason: str) -> Any:
    def check(pod: Pod | None) -> bool:
        conditions = (pod or {}).get("status", {}).get("conditions") or []
        return any(c["type"] == "PodScheduled" and c.get("reason") == reason for c in conditions)

    return check


async def finish(stack: Stack, name: str) -> None:
    stack.kube.set_pod_phase(stack.namespace, name, "Running")
    stack.kube.set_pod_phase(stack.namespace, name, "Succeeded")
    await stack.wait_pod(name, finished_cleanly)


async def gres_detail(stack: Stack, pod: Pod) -> list[str]:
    job_id = job_id_of(pod)
    assert job_id is not None
    job = (await stack.slurm.get_job(job_id)).model_dump(mode="json")
    return list(job["gres_detail"])


async def test_a_two_gpu_pod_goes_to_the_node_with_two_gpus(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=2, gres=["gpu:1", "gpu:2"])
    _one_gpu, two_gpus = stack.partition.node_names

    pod = stack.create_pod("two", cpu="1", devices=gpus(2))

    pod = await stack.wait_pod("two", bound)
    assert bound(pod) == two_gpus, f"bound to {bound(pod)}, which has fewer GPUs than {two_gpus}"
    job_id = job_id_of(pod)
    assert job_id is not None
    job = (await stack.slurm.get_job(job_id)).model_dump(mode="json")
    assert job["tres_per_node"] == "gres/gpu=2"
    assert job["gres_detail"] == ["gpu:2(IDX:0-1)"]
    await finish(stack, "two")


async def test_a_two_gpu_pod_never_lands_where_a_running_pod_holds_one_of_two_gpus(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(nodes=2, gres="gpu:2")

    stack.create_pod("one", cpu="1", devices=gpus(1), annotations=SHARED)
    first = await stack.wait_pod("one", bound)
    half_used = bound(first)
    (other,) = set(stack.partition.node_names) - {half_used}

    # Room for it (CPUs, memory, one GPU, not exclusive) on the half-used node, but not two GPUs.
    stack.create_pod("two", cpu="1", devices=gpus(2), annotations=SHARED)
    second = await stack.wait_pod("two", bound)
    assert bound(second) == other
    assert await gres_detail(stack, second) == ["gpu:2(IDX:0-1)"]

    # One GPU free on each node: the next 2-GPU pod waits for GPUs instead of sharing one.
    stack.create_pod("waits", cpu="1", devices=gpus(2), annotations=SHARED)
    waiting = await stack.wait_pod("waits", pending_for("Resources"))
    assert bound(waiting) is None

    await finish(stack, "one")  # its GPU is given back: now two are free there
    third = await stack.wait_pod("waits", bound)
    assert bound(third) == half_used
    assert await gres_detail(stack, third) == ["gpu:2(IDX:0-1)"]
    await finish(stack, "two")
    await finish(stack, "waits")


async def test_a_mixed_gpu_group_asks_every_node_for_its_largest_pods_gpus(make_stack: StackFactory) -> None:
    """Sized by its largest pod (`slurm-bridge/sizing: largest-pod`), a 2-GPU and a 1-GPU pod are one
    job with gres/gpu:2 per node, so neither lands on the 1-GPU node.

    While a holder keeps one of the two 2-GPU nodes, the group must wait: a job asking one GPU
    per node would be started at once on the 1-GPU node and the free 2-GPU node. (Sized per pod,
    the default, the 1-GPU pod's component may take the 1-GPU node: tests/e2e/test_het_groups.py.)
    """
    stack = await make_stack(nodes=3, gres=["gpu:1", "gpu:2", "gpu:2"])
    one_gpu, *two_gpus = stack.partition.node_names
    stack.create_pod("holder", cpu="1", devices=gpus(2))
    held = bound(await stack.wait_pod("holder", bound))
    assert held in two_gpus

    stack.kube.create_object(
        "podgroups.scheduling.x-k8s.io",
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {
                "name": "mixed",
                "namespace": stack.namespace,
                "annotations": {keys.ANNOTATION_SIZING: "largest-pod"},
            },
            "spec": {"minMember": 2},
        },
    )
    names = ("big", "small")
    for name, count in zip(names, (2, 1), strict=True):
        pod = make_pod(
            stack.namespace, name, cpu="1", devices=gpus(count), scheduler=stack.settings.scheduler_name
        )
        pod["metadata"]["labels"] = {grouping.LABEL_POD_GROUP: "mixed"}
        stack.kube.create_object("pods", pod)
    for name in names:
        waiting = await stack.wait_pod(name, pending_for("Resources"))
        assert bound(waiting) is None, f"placed beside the holder, on {bound(waiting)}"
    job_id = job_id_of(stack.pod("big"))
    assert job_id is not None
    assert job_id_of(stack.pod("small")) == job_id
    job = (await stack.slurm.get_job(job_id)).model_dump(mode="json")
    assert (job["tres_per_node"], job["node_count"]["number"]) == ("gres/gpu=2", 2)

    await finish(stack, "holder")
    pods = [await stack.wait_pod(name, bound) for name in names]
    assert sorted(bound(p) or "" for p in pods) == sorted(two_gpus), f"{one_gpu} has one GPU"
    assert {job_id_of(p) for p in pods} == {job_id}
    job = (await stack.slurm.get_job(job_id)).model_dump(mode="json")
    assert sorted(n["name"] for n in job["job_resources"]["nodes"]["allocation"]) == sorted(two_gpus)
    assert job["gres_detail"] == ["gpu:2(IDX:0-1)", "gpu:2(IDX:0-1)"]
    for name in names:  # a group's job ends, and its pods are let go, once all have ended
        stack.kube.set_pod_phase(stack.namespace, name, "Succeeded")
    for name in names:
        await stack.wait_pod(name, finished_cleanly)
