"""The workloads people bring, each as its controller creates it, placed by real Slurm on the real
kube-apiserver (testbed/kube_real).

No controller runs here: each test plays the controllers of its workload (JobSet, Job,
LeaderWorkerSet, ReplicaSet), creating their objects and pods as they would (ownership,
names, labels, annotations, completion indexes: tests/e2e/controllers.py), and checks what
Slurm was asked for and where every pod was bound.

- A JobSet of two replicated jobs of different sizes, gang-scheduled through a PodGroup, and a
  LeaderWorkerSet whose leader asks for more than its workers: each group is one Slurm
  heterogeneous job, one component per pod shape, each sized as its pods ask. Read back from
  Slurm, every component asks for its own nodes, CPUs and memory, Slurm holds exactly what the
  pods asked for in all (the workloads share nodes, `exclusive: "false"`, so a node is
  allocated what is asked and no more), each pod is bound to a node of its own component and
  labelled with its offset, and no pod is told `SizedByLargestPod`.
- The same JobSet whose PodGroup says `slurm-bridge/sizing: largest-pod` (a coscheduled
  group's job annotations are its PodGroup's): one Slurm job whose every node is sized by the
  group's largest pod. The pods are told so once, in a `SizedByLargestPod` Event, and
  `slurm-bridge explain` says the same (`sizing_note`).
- An Indexed Job with parallelism below completions, and a Deployment whose ReplicaSet
  re-creates a pod that went: a Slurm job per pod, sized as the pod asks, a new one for each
  pod the controller creates.
- A PodGroup whose pods come far apart: each pod that comes before the group is complete is
  told it waits for the rest, nothing is submitted, and the last one completes the group.
"""

import asyncio
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from activities.placement import SIZED_BY_LARGEST_POD
from bridge import keys
from tests.e2e import controllers
from tests.e2e.conftest import ON_REAL_KUBE, StackFactory
from tests.e2e.harness import Pod, Stack, bound, job_id_of, kubelet_stops
from tests.e2e.test_groups import members_seen
from tests.e2e.test_het_groups import (
    LARGEST_POD,
    SHARED,
    allocation,
    asked,
    components_of,
    each_on_its_component,
    reserved,
)
from worker.pod_watcher import WAITING_FOR_GROUP_MEMBERS

pytestmark = [pytest.mark.slurm, ON_REAL_KUBE]
P = keys.SLURMJOB_PREFIX


async def slurm_job(stack: Stack, job_id: int | None) -> dict[str, Any]:
    assert job_id is not None
    return (await stack.slurm.get_job(job_id)).model_dump(mode="json")


def named(pods: list[Pod]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


def sizing_events(stack: Stack, name: str) -> list[dict[str, Any]]:
    return [e for e in stack.events(name) if e["reason"] == SIZED_BY_LARGEST_POD]


REPO = Path(__file__).resolve().parents[2]


async def explain(stack: Stack, name: str) -> dict[str, Any]:
    """`slurm-bridge explain namespace/pod`, the command a user runs, with this checkout's code
    (the virtualenv's editable install may point at another copy of the repository)."""
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("slurm-bridge")),
        "explain",
        f"{stack.namespace}/{name}",
        "--kubeconfig",
        str(stack.kubeconfig),
        "--partition",
        stack.settings.partition,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    [explained] = json.loads(out)
    return dict(explained)


def waiting_told(stack: Stack, name: str) -> list[dict[str, Any]]:
    return [e for e in stack.events(name) if e["reason"] == WAITING_FOR_GROUP_MEMBERS]


def told_to_wait(stack: Stack, name: str) -> Callable[[Pod | None], bool]:
    return lambda _: bool(waiting_told(stack, name))


def scheduled(pod: Pod | None) -> dict[str, Any]:
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "PodScheduled"), {})


def two_unequal_replicated_jobs(stack: Stack, annotations: dict[str, str]) -> list[str]:
    """A JobSet `train` gang-scheduled through the PodGroup `train` (whose annotations are the
    job's): a 1-CPU, 256Mi driver and two 3-CPU, 1Gi workers. Its pods, in the group's order."""
    kube, ns, scheduler = stack.kube, stack.namespace, stack.settings.scheduler_name
    kube.create_object(
        "podgroups.scheduling.x-k8s.io",
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "train", "namespace": ns, "annotations": annotations},
            "spec": {"minMember": 3},
        },
    )

    def replicated(name: str, replicas: int, resources: dict[str, str]) -> dict[str, Any]:
        template = {
            "metadata": {"labels": {controllers.POD_GROUP_LABEL: "train"}},
            "spec": controllers.pod_spec(scheduler, resources),
        }
        spec = {"parallelism": 1, "completions": 1, "completionMode": "Indexed", "template": template}
        return {"name": name, "replicas": replicas, "template": {"spec": spec}}

    jobset = controllers.job_set(
        kube,
        ns,
        "train",
        [
            replicated("driver", 1, {"cpu": "1", "memory": "256Mi"}),
            replicated("workers", 2, {"cpu": "3", "memory": "1Gi"}),
        ],
    )
    jobs = controllers.job_set_jobs(kube, jobset)
    assert named(jobs) == ["train-driver-0", "train-workers-0", "train-workers-1"]
    return named([controllers.job_pod(kube, job, 0) for job in jobs])


async def test_a_job_set_of_two_unequal_replicated_jobs_is_one_component_per_replicated_job(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(nodes=3, cpus=4)
    names = two_unequal_replicated_jobs(stack, SHARED)

    placed = [await stack.wait_pod(name, bound) for name in names]
    [job_id] = {job_id_of(p) for p in placed}  # one Slurm job: its leader's id
    driver, workers = await components_of(stack, job_id)  # one component per shape
    assert [c["name"] for c in (driver, workers)] == ["train", "train"]
    assert asked(driver) == (1, 1, 256, "")
    assert asked(workers) == (2, 3, 1024, "")
    assert each_on_its_component(stack, [driver, workers]) == names
    assert list(allocation(driver).values()) == [(1, 256)]
    assert list(allocation(workers).values()) == [(3, 1024), (3, 1024)]
    # Reserved = asked: 1 + 3 + 3 CPUs, 256Mi + 1Gi + 1Gi (largest-pod sizing: 9 CPUs, 3Gi).
    assert reserved([driver, workers]) == (7, 2304)

    submitted = (
        f"Slurm job {job_id} submitted in partition {stack.partition.name}, "
        "as a heterogeneous job of 2 components: 1 + 2 pods"
    )
    for name in names:
        assert [e["message"] for e in stack.events(name) if e["reason"] == "SlurmJobSubmitted"] == [submitted]
        assert not sizing_events(stack, name)
    explained = await explain(stack, names[0])
    assert explained["sizing_note"] is None  # each pod is given what it asks for
    assert "jobs" in explained["job_desc_msg"]  # as submitted: `{"jobs": [...]}`, one per component
    await stack.finish(*names)
    assert [c["job_state"] for c in await components_of(stack, job_id)] == [["CANCELLED"], ["CANCELLED"]]


async def test_a_job_set_sized_by_its_largest_pod_is_one_job_sized_by_its_largest_pod(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(nodes=3, cpus=4)
    # On the PodGroup: a gang-scheduled JobSet's job annotations are its PodGroup's (bridge/grouping.py).
    names = two_unequal_replicated_jobs(stack, LARGEST_POD)

    placed = [await stack.wait_pod(name, bound) for name in names]
    [job_id] = {job_id_of(p) for p in placed}
    assert sorted(bound(p) or "" for p in placed) == sorted(stack.partition.node_names)
    assert all(keys.LABEL_HET_JOB_OFFSET not in p["metadata"]["labels"] for p in placed)
    [job] = await components_of(stack, job_id)  # one ordinary job
    assert job["het_job_id"]["number"] == 0
    # Every node of the job is asked for 3 CPUs, 1Gi.
    assert (job["name"], job["node_count"]["number"]) == ("train", 3)
    assert (job["cpus_per_task"]["number"], job["memory_per_node"]["number"]) == (3, 1024)

    told = (
        f"every node of Slurm job {job_id} is asked for 3 CPUs, 1Gi memory: the group's largest pod; "
        "pods asking less are given more (the job holds 9 CPUs, 3Gi memory on its 3 nodes, "
        "for pods that ask for 7 CPUs, 2304Mi memory in all)"
    )
    for name in names:
        [event] = sizing_events(stack, name)  # once per placement
        assert event["type"] == "Normal"
        assert event["message"].startswith(told)
    explained = await explain(stack, names[0])
    assert explained["sizing_note"] == event["message"].replace(f"Slurm job {job_id}", "the job")
    await stack.finish(*names)


async def test_a_leader_worker_set_whose_leader_asks_more_is_a_component_beside_its_workers(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(nodes=3, cpus=4)
    scheduler = stack.settings.scheduler_name
    lws = controllers.leader_worker_set(
        stack.kube,
        stack.namespace,
        "llm",
        3,
        leader=controllers.pod_spec(scheduler, {"cpu": "4", "memory": "512Mi"}, restart="Always"),
        worker=controllers.pod_spec(scheduler, {"cpu": "1", "memory": "512Mi"}, restart="Always"),
        annotations={P + "timelimit": "20", **SHARED},
    )
    members = controllers.leader_worker_group(stack.kube, lws, 0)
    names = named(members)
    assert names == ["llm-0", "llm-0-1", "llm-0-2"]
    # As the LeaderWorkerSet controller owns them: the workers through their leader pod.
    assert [m["metadata"]["ownerReferences"][0]["kind"] for m in members] == ["StatefulSet"] * 3

    placed = [await stack.wait_pod(name, bound) for name in names]
    [job_id] = {job_id_of(p) for p in placed}  # the workers joined their leader's group
    leader, workers = await components_of(stack, job_id)
    assert [c["name"] for c in (leader, workers)] == ["llm-0", "llm-0"]
    assert asked(leader) == (1, 4, 512, "")
    assert asked(workers) == (2, 1, 512, "")
    # The LeaderWorkerSet's annotation, on every component.
    assert [c["time_limit"]["number"] for c in (leader, workers)] == [20, 20]
    # Each component lists its own pods: the leader, then its workers.
    assert each_on_its_component(stack, [leader, workers]) == names
    assert sorted(bound(p) or "" for p in placed) == sorted(stack.partition.node_names)
    # Reserved = asked: 4 + 1 + 1 CPUs, 3 x 512Mi (largest-pod sizing: 12 CPUs).
    assert reserved([leader, workers]) == (6, 1536)
    for name in names:
        assert not sizing_events(stack, name)
    await stack.finish(*names)


async def test_an_indexed_job_with_parallelism_below_completions_gets_a_slurm_job_per_pod(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(nodes=2, cpus=4)
    job = controllers.batch_job(
        stack.kube,
        stack.namespace,
        "sweep",
        {
            "parallelism": 2,
            "completions": 3,
            "completionMode": "Indexed",
            "activeDeadlineSeconds": 600,
            "template": {"spec": controllers.pod_spec(stack.settings.scheduler_name, {"cpu": "3"})},
        },
    )
    # The Job controller runs `parallelism` pods at a time: indexes 0 and 1 first.
    first = named([controllers.job_pod(stack.kube, job, index) for index in (0, 1)])
    placed = [await stack.wait_pod(name, bound) for name in first]
    ids = [job_id_of(p) for p in placed]
    assert len(set(ids)) == 2  # one Slurm job per pod
    assert sorted(bound(p) or "" for p in placed) == sorted(stack.partition.node_names)
    for job_id in ids:
        sent = await slurm_job(stack, job_id)
        assert (sent["node_count"]["number"], sent["cpus_per_task"]["number"]) == (1, 3)
        assert sent["time_limit"]["number"] == 10  # activeDeadlineSeconds, in whole minutes

    # Index 0 completes; the Job controller creates index 2, which takes the node it freed.
    await stack.finish(first[0])
    third = named([controllers.job_pod(stack.kube, job, 2)])
    last = await stack.wait_pod(third[0], bound)
    assert bound(last) == bound(placed[0])
    assert job_id_of(last) not in ids
    assert last["metadata"]["labels"][controllers.COMPLETION_INDEX] == "2"
    assert not sizing_events(stack, third[0])
    await stack.finish(first[1], third[0])


async def test_a_deployment_pod_re_created_by_its_replica_set_is_placed_again(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(nodes=2, cpus=4)
    deploy = controllers.deployment(
        stack.kube,
        stack.namespace,
        "web",
        2,
        controllers.pod_spec(
            stack.settings.scheduler_name, {"cpu": "1", "memory": "256Mi"}, restart="Always"
        ),
        annotations={P + "timelimit": "15"},
    )
    rs = controllers.replica_set(stack.kube, deploy)
    names = named([controllers.replica_set_pod(stack.kube, rs) for _ in range(2)])
    placed = {name: await stack.wait_pod(name, bound) for name in names}
    assert len({job_id_of(p) for p in placed.values()}) == 2
    for pod in placed.values():
        job = await slurm_job(stack, job_id_of(pod))
        # The Deployment's annotation, reached through its ReplicaSet.
        assert (job["time_limit"]["number"], job["cpus_per_task"]["number"]) == (15, 1)

    # A pod goes (deleted, its kubelet stops it); its job is given back and the ReplicaSet
    # creates another in its place, which is placed anew.
    gone, kept = names
    old_job_id = job_id_of(placed[gone])
    stack.kube.delete_object("pods", gone, stack.namespace)
    await stack.wait_pod(gone, lambda p: p is None or bool(p["metadata"].get("deletionTimestamp")))
    kubelet_stops(stack.kube, stack.namespace, gone)
    await stack.wait_pod(gone, lambda p: p is None)
    replacement = controllers.replica_set_pod(stack.kube, rs)["metadata"]["name"]
    again = await stack.wait_pod(replacement, bound)
    assert bound(again) == bound(placed[gone])
    assert job_id_of(again) not in {job_id_of(p) for p in placed.values()}
    assert "RUNNING" not in (await slurm_job(stack, old_job_id))["job_state"]
    await stack.finish(kept, replacement)


async def test_a_pod_group_whose_pods_come_far_apart_waits_with_the_reason(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=3)
    kube, ns = stack.kube, stack.namespace
    pod_group = kube.create_object(
        "podgroups.scheduling.x-k8s.io",
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "mpi", "namespace": ns},
            "spec": {"minMember": 3},
        },
    )

    def member(name: str) -> str:
        pod = controllers.pod_spec(stack.settings.scheduler_name, {"cpu": "1"})
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {controllers.POD_GROUP_LABEL: "mpi"}},
            "spec": pod,
        }
        return str(kube.create_object("pods", body)["metadata"]["name"])

    # However long the others take (minutes, hours), each pod that came is told it waits for
    # them, and its placement waits without a timer: time alone changes nothing.
    early = []
    for count, name in enumerate(("mpi-0", "mpi-1"), 1):
        early.append(member(name))
        # The Event is written after the condition: once it is there, both are (the pod is read
        # again: the one the wait read may predate its condition).
        await stack.wait_pod(name, told_to_wait(stack, name))
        pod = stack.pod(name) or {}
        assert scheduled(pod)["reason"] == WAITING_FOR_GROUP_MEMBERS
        assert scheduled(pod)["status"] == "False"
        assert f"once 3 of its pods exist; {count} did when this pod came" in scheduled(pod)["message"]
        [event] = waiting_told(stack, name)
        assert event["type"] == "Normal"
        assert f"PodGroup {ns}/mpi" in event["message"]
        assert bound(pod) is None
        assert keys.FINALIZER not in (pod["metadata"].get("finalizers") or [])
    wid = f"placement/{stack.settings.installation_id}/{ns}/podgroup/mpi/{pod_group['metadata']['uid']}"
    state = await members_seen(stack, wid, 2)
    assert state.job_id is None
    history = await stack.temporal.get_workflow_handle(wid).fetch_history()
    assert not [e for e in history.events if e.HasField("timer_started_event_attributes")]
    assert await stack.partition_jobs() == []  # nothing submitted for an incomplete group

    last = member("mpi-2")
    placed = [await stack.wait_pod(name, bound) for name in [*early, last]]
    assert len({job_id_of(p) for p in placed}) == 1
    assert not waiting_told(stack, last)  # it completed the group
    await stack.finish(*early, last)
