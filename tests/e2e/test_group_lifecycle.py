"""A group's whole life: restarts, late members (docs/architecture.md, "Placement ids").

- A group whose pods are all deleted and re-created with the same group key (a
  LeaderWorkerSet restart, a PodGroup's pods re-created) is placed again: same
  workflow id, a new generation, so a new job whose comment is `<wid>@<new pod uid>`.
- Pods that join a group after its job was submitted are told so by an Event and
  become the next generation when the current job ends.
"""

from typing import Any

import pytest

from bridge import grouping, keys
from bridge.models import GENERATION_SEPARATOR
from tests.e2e.conftest import ON_REAL_KUBE, StackFactory
from tests.e2e.harness import Pod, Stack, bound, finished_cleanly, job_id_of, kubelet_stops
from tests.e2e.test_groups import group_pod

pytestmark = [pytest.mark.slurm, ON_REAL_KUBE]


def lws_labels(index: str, worker: str, group_key: str) -> dict[str, str]:
    return {
        grouping.LABEL_LWS_NAME: "llm",
        grouping.LABEL_LWS_GROUP_INDEX: index,
        grouping.LABEL_LWS_GROUP_KEY: group_key,
        "leaderworkerset.sigs.k8s.io/worker-index": worker,
    }


def create_lws(stack: Stack) -> Pod:
    lws = stack.kube.create_object(
        "leaderworkersets.leaderworkerset.x-k8s.io",
        {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": {"name": "llm", "namespace": stack.namespace},
            "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2}},
        },
    )
    lws["apiVersion"], lws["kind"] = "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"
    return lws


def create_pod_group(stack: Stack, name: str, min_member: int) -> Pod:
    return stack.kube.create_object(
        "podgroups.scheduling.x-k8s.io",
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": name, "namespace": stack.namespace},
            "spec": {"minMember": min_member},
        },
    )


async def job(stack: Stack, job_id: int | None) -> dict[str, Any]:
    return (await stack.slurm.get_job(job_id or 0)).model_dump(mode="json")


async def restart(stack: Stack, names: list[str]) -> None:
    """What a controller's restart does: delete the pods; their kubelets stop them; they go."""
    for name in names:
        stack.kube.delete_object("pods", name, stack.namespace)
    for name in names:
        await stack.wait_pod(name, lambda p: bool(p and p["metadata"].get("deletionTimestamp")))
        kubelet_stops(stack.kube, stack.namespace, name)
    for name in names:
        await stack.wait_pod(name, lambda p: p is None)


async def placed_again(
    stack: Stack, names: list[str], make: Any, workflow_id: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Place the group, restart it, re-create its pods: the old job and the new one."""
    first = {name: make(name) for name in names}
    placed = {name: await stack.wait_pod(name, bound) for name in names}
    old_job_id = job_id_of(placed[names[0]])
    assert {job_id_of(p) for p in placed.values()} == {old_job_id}
    old = await job(stack, old_job_id)
    assert old["comment"].startswith(workflow_id + GENERATION_SEPARATOR)

    await restart(stack, names)
    again = {name: make(name) for name in names}  # same names and group key, new uids
    assert not {p["metadata"]["uid"] for p in again.values()} & {p["metadata"]["uid"] for p in first.values()}
    replaced = {name: await stack.wait_pod(name, bound) for name in names}
    new_job_id = job_id_of(replaced[names[0]])
    assert {job_id_of(p) for p in replaced.values()} == {new_job_id}
    assert new_job_id != old_job_id
    new = await job(stack, new_job_id)
    # Same workflow id, the new generation: the uid of a pod of the re-created group.
    workflow, _, generation = new["comment"].rpartition(GENERATION_SEPARATOR)
    assert workflow == workflow_id
    assert generation in {p["metadata"]["uid"] for p in again.values()}
    assert "RUNNING" in new["job_state"]
    old = await job(stack, old_job_id)
    assert "CANCELLED" in old["job_state"]  # the first generation's pods finished: its job was cancelled

    for name in names:
        stack.kube.set_pod_phase(stack.namespace, name, "Succeeded")
    for name in names:
        await stack.wait_pod(name, finished_cleanly)
    return old, new


async def test_a_restarted_leader_worker_set_group_is_placed_again(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=2)
    lws = create_lws(stack)
    workers = {"llm-0": "0", "llm-0-1": "1"}

    def make(name: str) -> Pod:
        return group_pod(stack, name, lws_labels("0", workers[name], "key0"), owner=lws)

    workflow_id = f"placement/{stack.settings.installation_id}/{stack.namespace}/lws/llm-0/key0"
    await placed_again(stack, list(workers), make, workflow_id)


async def test_re_created_pods_of_a_pod_group_are_placed_again(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=2)
    pod_group = create_pod_group(stack, "mpi", 2)

    def make(name: str) -> Pod:
        return group_pod(stack, name, {grouping.LABEL_POD_GROUP: "mpi"})

    workflow_id = (
        f"placement/{stack.settings.installation_id}/{stack.namespace}/podgroup/mpi/"
        f"{pod_group['metadata']['uid']}"
    )
    await placed_again(stack, ["mpi-0", "mpi-1"], make, workflow_id)


async def test_pods_that_join_after_submission_are_told_and_placed_next(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=4)
    pod_group = create_pod_group(stack, "mpi", 2)

    def make(name: str) -> Pod:
        return group_pod(stack, name, {grouping.LABEL_POD_GROUP: "mpi"})

    first = [make(name) for name in ("mpi-0", "mpi-1")]
    placed = [await stack.wait_pod(p["metadata"]["name"], bound) for p in first]
    first_job_id = job_id_of(placed[0])

    late = [make(name) for name in ("mpi-2", "mpi-3")]

    def told_to_wait(name: str) -> Any:
        return lambda _: any(e["reason"] == "WaitingForNextGeneration" for e in stack.events(name))

    for pod in late:
        name = pod["metadata"]["name"]
        told = await stack.wait_pod(name, told_to_wait(name))
        assert bound(told) is None
        assert keys.FINALIZER not in (told["metadata"].get("finalizers") or [])
        [event] = [e for e in stack.events(name) if e["reason"] == "WaitingForNextGeneration"]
        assert f"Slurm job {first_job_id} was submitted before this pod joined" in event["message"]
        assert event["type"] == "Normal"
    # The first generation runs on; the late pods wait for it.
    assert "RUNNING" in (await job(stack, first_job_id))["job_state"]

    for pod in placed:
        stack.kube.set_pod_phase(stack.namespace, pod["metadata"]["name"], "Succeeded")
    next_generation = [await stack.wait_pod(p["metadata"]["name"], bound) for p in late]
    second_job_id = job_id_of(next_generation[0])
    assert {job_id_of(p) for p in next_generation} == {second_job_id}
    assert second_job_id != first_job_id
    workflow_id = (
        f"placement/{stack.settings.installation_id}/{stack.namespace}/podgroup/mpi/"
        f"{pod_group['metadata']['uid']}"
    )
    workflow, _, generation = (await job(stack, second_job_id))["comment"].rpartition(GENERATION_SEPARATOR)
    assert workflow == workflow_id
    assert generation in {p["metadata"]["uid"] for p in late}  # the pod that opened the next generation
    assert "CANCELLED" in (await job(stack, first_job_id))["job_state"]

    for pod in late:
        stack.kube.set_pod_phase(stack.namespace, pod["metadata"]["name"], "Succeeded")
    for pod in [*first, *late]:
        await stack.wait_pod(pod["metadata"]["name"], finished_cleanly)
