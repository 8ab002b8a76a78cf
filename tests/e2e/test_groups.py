"""Pod groups placed by one real Slurm job: all or nothing, each pod on its own allocated node."""

from typing import Any

import pytest
from temporalio.client import WorkflowHandle

from bridge import grouping, keys
from bridge.models import PlacementState
from testbed.waiting import until
from tests.e2e.conftest import ON_REAL_KUBE, StackFactory
from tests.e2e.harness import Pod, Stack, bound, finished_cleanly, job_id_of, make_pod, slurm_bridge
from worker.pod_watcher import group_workflow_id
from workflows.placement import PlacementWorkflow

pytestmark = pytest.mark.slurm


async def members_seen(stack: Stack, workflow_id: str, count: int) -> PlacementState:
    """Observe the placement until it has `count` members (a query; Temporal has no event for it)."""
    handle: WorkflowHandle[PlacementWorkflow, PlacementState] = stack.temporal.get_workflow_handle_for(
        PlacementWorkflow.run, workflow_id
    )
    seen = [0]

    async def enough() -> PlacementState | None:
        state = await handle.query(PlacementWorkflow.current_state)
        seen[0] = len(state.pods)
        return state if len(state.pods) >= count else None

    return await until(
        enough,
        lambda: f"{count} members of {workflow_id} (last seen: {seen[0]})",
        20,
        0.1,
        ignoring=Exception,  # the workflow may not have started yet
    )


def group_pod(stack: Stack, name: str, labels: dict[str, str], owner: Pod | None = None) -> Pod:
    pod = make_pod(stack.namespace, name, cpu="1")
    pod["metadata"]["labels"] = labels
    if owner is not None:
        meta = owner["metadata"]
        pod["metadata"]["ownerReferences"] = [
            {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "name": meta["name"],
                "uid": meta["uid"],
                "controller": True,
            }
        ]
    return stack.kube.create_object("pods", pod)


async def test_pod_group_of_four_is_placed_together_on_four_nodes(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=4)
    pod_group = stack.kube.create_object(
        "podgroups.scheduling.x-k8s.io",
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {
                "name": "mpi",
                "namespace": stack.namespace,
                "annotations": {keys.SLURMJOB_PREFIX + "timelimit": "30"},
            },
            "spec": {"minMember": 4},
        },
    )
    group_key = f"{stack.namespace}/podgroup/mpi/{pod_group['metadata']['uid']}"
    names = [f"mpi-{i}" for i in range(4)]
    for name in names[:3]:
        group_pod(stack, name, {grouping.LABEL_POD_GROUP: "mpi"})

    state = await members_seen(stack, f"placement/{stack.settings.installation_id}/{group_key}", 3)
    assert state.job_id is None  # three of four: nothing is submitted yet
    assert not any(bound(stack.pod(n)) for n in names[:3])

    group_pod(stack, names[3], {grouping.LABEL_POD_GROUP: "mpi"})
    pods = [await stack.wait_pod(name, bound) for name in names]

    assert sorted(bound(p) or "" for p in pods) == sorted(stack.partition.node_names)  # each on its own node
    job_ids = {job_id_of(p) for p in pods}
    assert len(job_ids) == 1
    job = (await stack.slurm.get_job(job_ids.pop() or 0)).model_dump(mode="json")
    assert job["name"] == "mpi"
    assert job["time_limit"]["number"] == 30
    assert sorted(n["name"] for n in job["job_resources"]["nodes"]["allocation"]) == sorted(
        bound(p) or "" for p in pods
    )
    bindings = [r for r in stack.fake.requests if r.path.endswith("/binding")]
    assert len(bindings) == 4
    # Any member finds the group's placement (through its claim annotation).
    for name in names:
        status = await slurm_bridge(
            stack, "status", f"{stack.namespace}/{name}", "--kubeconfig", str(stack.kubeconfig), "--json"
        )
        assert (status["group"], status["phase"], len(status["pods"])) == ("mpi", "Bound", 4)

    for name in names:
        stack.kube.set_pod_phase(stack.namespace, name, "Succeeded")
    for name in names:
        await stack.wait_pod(name, finished_cleanly)


@ON_REAL_KUBE
async def test_leader_worker_set_of_two_groups_gets_two_jobs(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=4)
    lws = stack.kube.create_object(
        "leaderworkersets.leaderworkerset.x-k8s.io",
        {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": {"name": "llm", "namespace": stack.namespace},
            "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 2}},
        },
    )
    lws["apiVersion"], lws["kind"] = "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"
    pods: dict[str, dict[str, Any]] = {}
    for index in ("0", "1"):
        for worker in ("0", "1"):
            name = f"llm-{index}" if worker == "0" else f"llm-{index}-{worker}"
            labels = {
                grouping.LABEL_LWS_NAME: "llm",
                grouping.LABEL_LWS_GROUP_INDEX: index,
                grouping.LABEL_LWS_GROUP_KEY: f"key{index}",
                "leaderworkerset.sigs.k8s.io/worker-index": worker,
            }
            pods[name] = group_pod(stack, name, labels, owner=lws)

    placed = {name: await stack.wait_pod(name, bound) for name in pods}
    assert sorted(bound(p) or "" for p in placed.values()) == sorted(stack.partition.node_names)
    jobs = {job_id_of(placed["llm-0"]), job_id_of(placed["llm-1"])}
    assert len(jobs) == 2
    assert job_id_of(placed["llm-0-1"]) == job_id_of(placed["llm-0"])
    assert job_id_of(placed["llm-1-1"]) == job_id_of(placed["llm-1"])
    for job_id in jobs:
        job = (await stack.slurm.get_job(job_id or 0)).model_dump(mode="json")
        assert job["name"] in ("llm-0", "llm-1")
        assert job["node_count"]["number"] == 2
    group = grouping.Group(
        key=f"{stack.namespace}/lws/llm-0/key0", kind="", namespace="", name="", min_pods=2
    )
    handle: WorkflowHandle[PlacementWorkflow, PlacementState] = stack.temporal.get_workflow_handle_for(
        PlacementWorkflow.run, group_workflow_id(group)
    )
    state = await handle.query(PlacementWorkflow.current_state)
    assert state.pods == [f"{stack.namespace}/llm-0", f"{stack.namespace}/llm-0-1"]  # leader first

    # A group's job ends only when all its pods have ended.
    stack.kube.set_pod_phase(stack.namespace, "llm-0", "Succeeded")
    stack.kube.set_pod_phase(stack.namespace, "llm-0-1", "Failed")
    await stack.wait_pod("llm-0", finished_cleanly)
    await stack.wait_pod("llm-0-1", finished_cleanly)
    assert "RUNNING" in (await stack.slurm.get_job(job_id_of(placed["llm-1"]) or 0)).model_dump()["job_state"]

    # Cancelling the other group's job evicts both of its pods (Terminating until their kubelet
    # confirms) and releases the finalizer.
    await stack.slurm.cancel_job(job_id_of(placed["llm-1"]) or 0)
    for name in ("llm-1", "llm-1-1"):
        await stack.wait_pod(name, lambda p: p is None or bool(p["metadata"].get("deletionTimestamp")))
        await stack.wait_pod(name, finished_cleanly)


@ON_REAL_KUBE
async def test_a_pod_whose_owner_is_missing_is_told_so(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=1)
    ghost = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "ghost", "uid": "0000"}}
    group_pod(stack, "orphan", {}, owner=ghost)

    pod = await stack.wait_pod(
        "orphan",
        lambda p: any(
            c.get("reason") == "InvalidPod" for c in (p or {}).get("status", {}).get("conditions", [])
        ),
    )
    [condition] = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert f"Job {stack.namespace}/ghost, which owns the pod, does not exist" in condition["message"]
    assert bound(pod) is None
    await stack.wait_pod("orphan", finished_cleanly)
