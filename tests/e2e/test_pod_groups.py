"""PodGroups end to end: coscheduling (scheduler-plugins) and built-in (`scheduling.k8s.io`).

- A pod naming a PodGroup that does not exist yet is not placed alone: it waits with
  `PodScheduled=False` (reason `PodGroupNotFound`) and an Event, and is placed with its
  group once the PodGroup is created.
- A built-in PodGroup's pods become one Slurm job, and the PodGroup's scheduled condition
  says whether the group is scheduled, as kube-scheduler's does: `PodGroupScheduled` on
  Kubernetes 1.36 (`v1alpha2`, the fake's default), `PodGroupInitiallyScheduled` on 1.37
  (`v1beta1`/`v1alpha3`, the fake switched with `serve_scheduling_versions`).
- A coscheduling PodGroup's `minResources` is the whole group's need: each node of its job is
  asked for what the largest pod needs (read back from Slurm), and a group needing more than all
  the bridge's nodes have together is refused before anything is submitted.
"""

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from bridge import grouping, keys
from tests.e2e.conftest import ON_REAL_KUBE, StackFactory
from tests.e2e.harness import Pod, Stack, bound, finished_cleanly, job_id_of, make_pod
from tests.e2e.test_groups import group_pod

pytestmark = pytest.mark.slurm

BUILTIN = "podgroups.scheduling.k8s.io"


def condition(obj: Pod | None, kind: str) -> dict[str, Any] | None:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), None)


def waits_for_its_group(pod: Pod | None) -> bool:
    scheduled = condition(pod, keys.CONDITION_POD_SCHEDULED)
    return bool(scheduled and scheduled["reason"] == "PodGroupNotFound")


def told(stack: Stack, name: str) -> Callable[[Pod | None], bool]:
    return lambda _: any(e["reason"] == "PodGroupNotFound" for e in stack.events(name))


def builtin_member(stack: Stack, name: str, group: str) -> Pod:
    pod = make_pod(stack.namespace, name, cpu="1")
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    return stack.kube.create_object("pods", pod)


def create_builtin_pod_group(stack: Stack, name: str, min_count: int) -> Pod:
    return stack.kube.create_object(
        BUILTIN,
        {
            "apiVersion": "scheduling.k8s.io/v1alpha2",
            "kind": "PodGroup",
            "metadata": {
                "name": name,
                "namespace": stack.namespace,
                "annotations": {keys.SLURMJOB_PREFIX + "timelimit": "20"},
            },
            "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}},
        },
    )


async def pod_group_condition(
    stack: Stack, name: str, status: str, kind: str = "PodGroupScheduled"
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        found = condition(stack.kube.get_object(BUILTIN, name, stack.namespace), kind)
        return found if found and found["status"] == status else None

    found = await stack.kube.wait_for_async(check, 30)
    assert found is not None
    return found


@ON_REAL_KUBE
async def test_pods_wait_for_their_coscheduling_pod_group(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=2)
    names = ["mpi-0", "mpi-1"]
    for name in names:
        group_pod(stack, name, {grouping.LABEL_POD_GROUP: "mpi"})

    for name in names:
        pod = await stack.wait_pod(name, waits_for_its_group)
        await stack.wait_pod(name, told(stack, name))  # the Event follows the condition
        scheduled = condition(pod, keys.CONDITION_POD_SCHEDULED) or {}
        assert scheduled["status"] == "False"
        assert f"PodGroup {stack.namespace}/mpi (scheduling.x-k8s.io/v1alpha1)" in scheduled["message"]
        [event] = [e for e in stack.events(name) if e["reason"] == "PodGroupNotFound"]
        assert event["type"] == "Warning"
        assert "does not exist" in event["message"]
        assert bound(pod) is None
        assert keys.FINALIZER not in (pod["metadata"].get("finalizers") or [])  # no placement took it
    assert await stack.partition_jobs() == []  # not placed alone: nothing submitted

    stack.kube.create_object(
        "podgroups.scheduling.x-k8s.io",
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "mpi", "namespace": stack.namespace},
            "spec": {"minMember": 2},
        },
    )
    placed = [await stack.wait_pod(name, bound) for name in names]
    assert len({job_id_of(p) for p in placed}) == 1  # one job for the group
    assert stack.bridge is not None
    assert stack.bridge.pod_watcher.pod_group_waits.watching == set()  # no pod waits: no watch
    assert sorted(bound(p) or "" for p in placed) == sorted(stack.partition.node_names)
    [job] = await stack.partition_jobs()
    assert job["name"] == "mpi"

    for name in names:
        stack.kube.set_pod_phase(stack.namespace, name, "Succeeded")
    for name in names:
        await stack.wait_pod(name, finished_cleanly)


async def test_a_builtin_pod_group_is_placed_and_its_status_says_so(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=2)
    # The pods come first (a controller may create them before the PodGroup): they wait.
    names = ["train-0", "train-1"]
    for name in names:
        builtin_member(stack, name, "train")
    for name in names:
        pod = await stack.wait_pod(name, waits_for_its_group)
        assert "(scheduling.k8s.io/v1alpha2) named by spec.schedulingGroup" in str(pod["status"])

    create_builtin_pod_group(stack, "train", 2)
    placed = [await stack.wait_pod(name, bound) for name in names]
    job_ids = {job_id_of(p) for p in placed}
    assert len(job_ids) == 1
    job = (await stack.slurm.get_job(job_ids.pop() or 0)).model_dump(mode="json")
    assert job["name"] == "train"
    assert job["time_limit"]["number"] == 20  # the PodGroup's annotation
    assert job["node_count"]["number"] == 2
    scheduled = await pod_group_condition(stack, "train", "True")
    assert scheduled["reason"] == "Scheduled"
    assert f"Slurm job {job['job_id']} allocated" in scheduled["message"]
    # Written through the status subresource, as the scheduler does.
    writes = [r for r in stack.fake.requests if r.method == "PATCH" and "/podgroups/train" in r.path]
    assert writes
    assert all(r.path.endswith("/status") for r in writes)

    for name in names:
        stack.kube.set_pod_phase(stack.namespace, name, "Succeeded")
    for name in names:
        await stack.wait_pod(name, finished_cleanly)


async def test_a_kubernetes_1_37_pod_group_is_placed_and_its_status_says_so(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=2, bridge=False)
    # Kubernetes 1.37 with both its versions enabled; 1.36's v1alpha2 is not served any more.
    stack.fake.serve_scheduling_versions("v1beta1", "v1alpha3")
    bridge = await stack.start_bridge()
    names = ["gang-0", "gang-1"]
    for name in names:
        builtin_member(stack, name, "gang")
    for name in names:
        pod = await stack.wait_pod(name, waits_for_its_group)
        assert "(scheduling.k8s.io/v1beta1) named by spec.schedulingGroup" in str(pod["status"])
    assert bridge.pod_watcher.pod_group_waits.watching == {grouping.SCHEDULING_V1BETA1.pod_group}

    template = {"name": "workers", "schedulingPolicy": {"gang": {"minCount": 2}}}
    stack.kube.create_object(
        "workloads.scheduling.k8s.io",
        {
            "apiVersion": "scheduling.k8s.io/v1beta1",
            "kind": "Workload",
            "metadata": {
                "name": "training",
                "namespace": stack.namespace,
                "annotations": {keys.SLURMJOB_PREFIX + "timelimit": "25"},
            },
            "spec": {"podGroupTemplates": [template]},
        },
    )
    stack.kube.create_object(
        BUILTIN,
        {
            "apiVersion": "scheduling.k8s.io/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": "gang", "namespace": stack.namespace},
            "spec": {
                "workloadRef": {"workloadName": "training", "templateName": "workers"},
                "schedulingPolicy": {"gang": {"minCount": 2}},
            },
        },
    )
    placed = [await stack.wait_pod(name, bound) for name in names]
    job_ids = {job_id_of(p) for p in placed}
    assert len(job_ids) == 1
    job = (await stack.slurm.get_job(job_ids.pop() or 0)).model_dump(mode="json")
    assert (job["name"], job["node_count"]["number"]) == ("gang", 2)
    assert job["time_limit"]["number"] == 25  # the Workload's annotation, found through spec.workloadRef
    scheduled = await pod_group_condition(stack, "gang", "True", "PodGroupInitiallyScheduled")
    assert scheduled["reason"] == "Scheduled"
    assert f"Slurm job {job['job_id']} allocated" in scheduled["message"]
    pod_group = stack.kube.get_object(BUILTIN, "gang", stack.namespace) or {}
    assert [c["type"] for c in pod_group["status"]["conditions"]] == ["PodGroupInitiallyScheduled"]
    # Read, watched and written at 1.37's newest version only.
    paths = [r.path for r in stack.fake.requests if "/apis/scheduling.k8s.io/" in r.path]
    assert {p.split("/")[3] for p in paths} == {"v1beta1"}
    assert f"/apis/scheduling.k8s.io/v1beta1/namespaces/{stack.namespace}/podgroups/gang/status" in paths

    for name in names:
        stack.kube.set_pod_phase(stack.namespace, name, "Succeeded")
    for name in names:
        await stack.wait_pod(name, finished_cleanly)


async def test_an_unschedulable_builtin_pod_group_says_so(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=1)
    create_builtin_pod_group(stack, "pinned", 1)
    pod = make_pod(stack.namespace, "pinned-0", cpu="1")
    pod["spec"]["schedulingGroup"] = {"podGroupName": "pinned"}
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "no-such-node"}
    stack.kube.create_object("pods", pod)

    unschedulable = await pod_group_condition(stack, "pinned", "False")
    assert unschedulable["reason"] == "Unschedulable"
    assert "node(s) didn't match Pod's node affinity/selector" in unschedulable["message"]
    assert await stack.partition_jobs() == []

    stack.kube.delete_object("pods", "pinned-0", stack.namespace)
    await stack.wait_pod("pinned-0", finished_cleanly)


@ON_REAL_KUBE
async def test_a_waiting_pod_that_ends_stops_the_wait(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=1)
    group_pod(stack, "stray", {grouping.LABEL_POD_GROUP: "ghost"})
    await stack.wait_pod("stray", waits_for_its_group)
    assert stack.bridge is not None
    waits = stack.bridge.pod_watcher.pod_group_waits
    assert waits.watching == {grouping.COSCHEDULING_PODGROUP}

    stack.kube.set_pod_phase(stack.namespace, "stray", "Failed")  # it ended before its group existed
    await asyncio.wait_for(waits.idle.wait(), 10)
    assert waits.watching == set()
    assert await stack.partition_jobs() == []


# -- a coscheduling PodGroup's spec, as scheduler-plugins defines it ---------------------------


def coscheduling_pod_group(stack: Stack, name: str, spec: dict[str, Any]) -> Pod:
    return stack.kube.create_object(
        "podgroups.scheduling.x-k8s.io",
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": name, "namespace": stack.namespace},
            "spec": spec,
        },
    )


def member(stack: Stack, name: str, group: str, cpu: str) -> Pod:
    pod = make_pod(stack.namespace, name, cpu=cpu)
    pod["metadata"]["labels"] = {grouping.LABEL_POD_GROUP: group}
    return stack.kube.create_object("pods", pod)


@ON_REAL_KUBE
async def test_a_pod_groups_min_resources_never_size_its_nodes(make_stack: StackFactory) -> None:
    # Two 4-CPU nodes; a 1-CPU and a 3-CPU pod whose PodGroup needs 6 CPUs in all (8 exist).
    stack = await make_stack(nodes=2, cpus=4)
    coscheduling_pod_group(stack, "train", {"minMember": 2, "minResources": {"cpu": "6"}})
    names = ["train-0", "train-1"]
    member(stack, names[0], "train", cpu="1")
    member(stack, names[1], "train", cpu="3")

    placed = [await stack.wait_pod(name, bound) for name in names]
    [job_id] = {job_id_of(p) for p in placed}
    components = [c.model_dump(mode="json") for c in await stack.slurm.get_job_components(job_id or 0)]
    # Each node is asked for what its pod needs (one heterogeneous component per pod shape), as
    # Slurm recorded it: 1 and 3 CPUs, not the group's 6 spread over its nodes.
    assert [(c["node_count"]["number"], c["cpus_per_task"]["number"]) for c in components] == [(1, 1), (1, 3)]
    await stack.finish(*names)


@ON_REAL_KUBE
async def test_a_pod_group_needing_more_than_all_the_bridge_nodes_have_is_refused(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(nodes=2, cpus=4)
    coscheduling_pod_group(stack, "huge", {"minMember": 2, "minResources": {"cpu": "9"}})
    names = ["huge-0", "huge-1"]
    for name in names:
        member(stack, name, "huge", cpu="1")

    for name in names:
        pod = await stack.wait_pod(
            name, lambda p: (condition(p, keys.CONDITION_POD_SCHEDULED) or {}).get("reason") == "InvalidPod"
        )
        message = (condition(pod, keys.CONDITION_POD_SCHEDULED) or {})["message"]
        assert "spec.minResources asks for cpu 9 for the whole group" in message
        assert "all 2 of the bridge's nodes have together (8 in their status.allocatable)" in message
    assert await stack.partition_jobs() == []  # nothing was submitted
    for name in names:
        stack.kube.delete_object("pods", name, stack.namespace)
        await stack.wait_pod(name, finished_cleanly)
