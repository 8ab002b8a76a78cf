"""Groups whose pods differ, placed by real Slurm as ONE heterogeneous job on the real
kube-apiserver (issue #25: each pod is given what it asks for, not its group's largest request).

A group whose pods differ in shape is one Slurm het job, one component per shape (leader
`L`, components `L+0`, `L+1`, ...). Read back from Slurm, each test checks what was
reserved, where each pod went and how the job ended:

- A coscheduling PodGroup of GPU and CPU-only pods: the GPU component asks gres/gpu and
  holds exactly the GPUs its pods asked for, on the GPU nodes; the CPU component asks none.
- On a cluster where sizing every node by the largest pod cannot fit but each pod's own size
  can (a holder keeps 3 of one node's 4 CPUs), the per-pod group starts at once, holding
  exactly the CPUs its pods asked for; the same group with `slurm-bridge/sizing: largest-pod`
  waits for Resources, its pods told so and left unbound, until the holder goes.
- Endings: cancelling a non-leader component in Slurm (which ends that component alone)
  evicts every pod of the group with the reason and releases the whole job; pods finishing
  cancel every component.
- A placement reset to its first step adopts its het job instead of submitting a second one:
  Slurm has exactly one het job with the placement's comment.

Where the jobs share nodes (`exclusive: "false"`) Slurm allocates a node exactly what its
component asks; with the default (whole nodes) it allocates every CPU of the node, so there
the reservation is read as the memory and GPUs allocated and the CPUs each component asked.
"""

import json
import re
from typing import Any

import pytest

from activities.placement import SIZED_BY_LARGEST_POD
from bridge import hostlist, keys
from bridge.models import ENDED_JOB_STATES
from tests.e2e.conftest import ON_REAL_KUBE, StackFactory
from tests.e2e.harness import Pod, Stack, bound, job_id_of, make_pod, unique
from tests.e2e.test_recovery import bound_again, reset_to_first_task
from tests.e2e.test_sweep import sweep
from workflows.placement import PlacementWorkflow

pytestmark = [pytest.mark.slurm, ON_REAL_KUBE]
Json = dict[str, Any]
P = keys.SLURMJOB_PREFIX
PODGROUPS = "podgroups.scheduling.x-k8s.io"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
SHARED = {P + "exclusive": "false"}  # nodes shared: Slurm allocates each node what is asked, no more
LARGEST_POD = {keys.ANNOTATION_SIZING: "largest-pod"}
GPU = "nvidia.com/gpu"


# -- the workload ----------------------------------------------------------------------------


def pod_group(stack: Stack, name: str, min_member: int, annotations: dict[str, str] | None = None) -> Json:
    """A coscheduling PodGroup; its annotations are its job's (bridge/grouping.py)."""
    return stack.kube.create_object(
        PODGROUPS,
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": name, "namespace": stack.namespace, "annotations": annotations or {}},
            "spec": {"minMember": min_member},
        },
    )


def member(stack: Stack, group: str, name: str, cpu: str, memory: str = "256Mi", gpus: int = 0) -> str:
    pod = make_pod(
        stack.namespace,
        name,
        cpu=cpu,
        memory=memory,
        devices={GPU: str(gpus)} if gpus else None,
        scheduler=stack.settings.scheduler_name,
    )
    pod["metadata"]["labels"] = {POD_GROUP_LABEL: group}
    return str(stack.kube.create_object("pods", pod)["metadata"]["name"])


def workflow_id(stack: Stack, group: Json) -> str:
    meta = group["metadata"]
    key = f"{meta['namespace']}/podgroup/{meta['name']}/{meta['uid']}"
    return f"placement/{stack.settings.installation_id}/{key}"


def placement(stack: Stack, group: Json) -> Any:
    return stack.temporal.get_workflow_handle_for(PlacementWorkflow.run, workflow_id(stack, group))


def pending_for(reason: str) -> Any:
    def check(pod: Pod | None) -> bool:
        conditions = (pod or {}).get("status", {}).get("conditions") or []
        return any(c["type"] == "PodScheduled" and c.get("reason") == reason for c in conditions)

    return check


def told(stack: Stack, name: str, reason: str) -> list[Json]:
    return [e for e in stack.events(name) if e["reason"] == reason]


def pending_and_told(stack: Stack, name: str) -> Any:
    """Pending for Slurm's Resources reason: the PodScheduled condition and the Event saying so."""
    return lambda pod: pending_for("Resources")(pod) and bool(told(stack, name, "SlurmJobPending"))


# -- what Slurm holds ----------------------------------------------------------------------


async def components_of(stack: Stack, job_id: int | None) -> list[Json]:
    """Every component of the job, read back from Slurm, in offset order (one: an ordinary job)."""
    assert job_id is not None
    return [c.model_dump(mode="json") for c in await stack.slurm.get_job_components(job_id)]


def number(value: Json | None) -> int | None:
    """Slurm's {set, infinite, number}."""
    return int(value["number"]) if value and value.get("set") else None


def asked(component: Json) -> tuple[int | None, int | None, int | None, str]:
    """What one component asks for: (nodes, CPUs per node, MiB per node, GRES per node)."""
    return (
        number(component["node_count"]),
        number(component["cpus_per_task"]),
        number(component["memory_per_node"]),
        component.get("tres_per_node") or "",
    )


def allocation(component: Json) -> dict[str, tuple[int, int]]:
    """Node -> (CPUs, MiB) Slurm allocated this component there."""
    nodes = ((component.get("job_resources") or {}).get("nodes") or {}).get("allocation") or []
    return {n["name"]: (n["cpus"]["count"], n["memory"]["allocated"]) for n in nodes}


def gpus_held(component: Json) -> int:
    """GPUs allocated to the component: its gres_detail, "gpu:2(IDX:0-1)" per node."""
    found = (re.match(r"gpu:(\d+)", detail) for detail in component.get("gres_detail") or [])
    return sum(int(m.group(1)) for m in found if m)


def reserved(components: list[Json]) -> tuple[int, int]:
    """CPUs and MiB the whole het job holds: every component's allocation, summed."""
    held = [each for c in components for each in allocation(c).values()]
    return sum(cpus for cpus, _ in held), sum(memory for _, memory in held)


def pods_of(component: Json) -> list[str]:
    """The pod names a component's admin_comment lists (each component lists its own)."""
    return [key.split("/", 1)[1] for key in json.loads(component["admin_comment"])["pods"]]


def offset_of(pod: Pod | None) -> str | None:
    return ((pod or {}).get("metadata", {}).get("labels") or {}).get(keys.LABEL_HET_JOB_OFFSET)


def each_on_its_component(stack: Stack, components: list[Json]) -> list[str]:
    """Check every pod is bound to a node its own component holds and says which one it is
    in; the pods, in component order."""
    leader = components[0]["job_id"]
    names = []
    for offset, component in enumerate(components):
        assert number(component["het_job_id"]) == leader
        assert number(component["het_job_offset"]) == offset
        for name in pods_of(component):
            pod = stack.pod(name)
            assert job_id_of(pod) == leader, name
            assert offset_of(pod) == str(offset), name
            assert bound(pod) in allocation(component), f"{name} on {bound(pod)}, not its component's"
            names.append(name)
    return names


def ended(component: Json) -> bool:
    return bool(ENDED_JOB_STATES.intersection(component["job_state"]))


# -- the tests ---------------------------------------------------------------------------------


async def test_a_mixed_gpu_and_cpu_pod_group_holds_exactly_the_gpus_its_gpu_pods_ask(
    make_stack: StackFactory,
) -> None:
    # Two nodes with two GPUs, two without. Largest-pod sizing would ask 2 GPUs on all four.
    stack = await make_stack(nodes=4, gres=["gpu:2", "gpu:2", "", ""])
    gpu_nodes, cpu_nodes = stack.partition.node_names[:2], stack.partition.node_names[2:]
    group = pod_group(stack, "mixed", 4)
    # The GPU component is component 0 whatever the pods' order (the next test has the other one).
    names = [
        member(stack, "mixed", "gpu-0", "1", "1Gi", gpus=2),
        member(stack, "mixed", "gpu-1", "1", "1Gi", gpus=2),
        member(stack, "mixed", "io-0", "2", "512Mi"),
        member(stack, "mixed", "io-1", "2", "512Mi"),
    ]

    placed = {name: await stack.wait_pod(name, bound) for name in names}
    [job_id] = {job_id_of(p) for p in placed.values()}
    gpu_part, cpu_part = await components_of(stack, job_id)  # one component per shape
    assert asked(gpu_part) == (2, 1, 1024, "gres/gpu=2")
    assert asked(cpu_part) == (2, 2, 512, "")  # no GPU asked for the CPU-only pods
    assert each_on_its_component(stack, [gpu_part, cpu_part]) == names
    # What `slurm-bridge status` shows: the job's components, leader first.
    state = await placement(stack, group).query(PlacementWorkflow.current_state)
    assert (state.job_id, state.job_components) == (job_id, [job_id, cpu_part["job_id"]])
    assert sorted(bound(placed[n]) or "" for n in ("gpu-0", "gpu-1")) == gpu_nodes
    assert sorted(bound(placed[n]) or "" for n in ("io-0", "io-1")) == cpu_nodes
    # Reserved = asked: 4 GPUs for the two 2-GPU pods, none for the others; memory as each asks.
    assert (gpus_held(gpu_part), gpus_held(cpu_part)) == (4, 0)
    assert gpu_part["gres_detail"] == ["gpu:2(IDX:0-1)", "gpu:2(IDX:0-1)"]
    assert reserved([gpu_part, cpu_part])[1] == 2 * 1024 + 2 * 512
    assert [c["comment"] for c in (gpu_part, cpu_part)] == [gpu_part["comment"]] * 2
    message = f"Slurm job {job_id} submitted in partition {stack.partition.name}, as a heterogeneous job"
    for name in names:
        [event] = told(stack, name, "SlurmJobSubmitted")
        assert event["message"] == f"{message} of 2 components: 2 + 2 pods"
        assert not told(stack, name, SIZED_BY_LARGEST_POD)
    await stack.finish(*names)
    assert (await placement(stack, group).result()).phase == "Done"


async def test_a_mixed_group_whose_cpu_only_pods_sort_first_starts_too(make_stack: StackFactory) -> None:
    # Slurm picks nodes component by component: were the CPU-only pods (first in the group)
    # component 0, their whole-node component would take the GPU nodes and the job would wait
    # for Resources on an idle partition that holds it exactly (seen before the fix). The GPU
    # component goes first whatever the pods' order.
    stack = await make_stack(nodes=4, gres=["gpu:2", "gpu:2", "", ""])
    gpu_nodes, cpu_nodes = stack.partition.node_names[:2], stack.partition.node_names[2:]
    group = pod_group(stack, "mixed", 4)
    names = [
        member(stack, "mixed", "a-io-0", "2", "512Mi"),
        member(stack, "mixed", "a-io-1", "2", "512Mi"),
        member(stack, "mixed", "b-gpu-0", "1", "1Gi", gpus=2),
        member(stack, "mixed", "b-gpu-1", "1", "1Gi", gpus=2),
    ]
    placed = {name: await stack.wait_pod(name, bound) for name in names}
    [job_id] = {job_id_of(p) for p in placed.values()}
    gpu_part, cpu_part = await components_of(stack, job_id)
    assert (asked(gpu_part), asked(cpu_part)) == ((2, 1, 1024, "gres/gpu=2"), (2, 2, 512, ""))
    assert each_on_its_component(stack, [gpu_part, cpu_part]) == ["b-gpu-0", "b-gpu-1", "a-io-0", "a-io-1"]
    assert sorted(bound(placed[n]) or "" for n in ("b-gpu-0", "b-gpu-1")) == gpu_nodes
    assert sorted(bound(placed[n]) or "" for n in ("a-io-0", "a-io-1")) == cpu_nodes
    await stack.finish(*names)
    assert (await placement(stack, group).result()).phase == "Done"


async def test_a_group_that_fits_only_sized_per_pod_starts_and_sized_by_its_largest_pod_waits(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(nodes=3, cpus=4)
    # A holder keeps 3 of one node's 4 CPUs: free are 4, 4 and 1 CPUs.
    stack.create_pod("holder", cpu="3", annotations=SHARED)
    held = bound(await stack.wait_pod("holder", bound))
    free = sorted(set(stack.partition.node_names) - {held or ""})

    # One 4-CPU pod and two 1-CPU pods: each its own size fits (4 | 1 + 1), every node
    # asked for 4 CPUs does not (the held node has 1 free).
    exact = pod_group(stack, "exact", 3, SHARED)
    names = [
        member(stack, "exact", "exact-0", "4"),
        member(stack, "exact", "exact-1", "1"),
        member(stack, "exact", "exact-2", "1"),
    ]
    placed = {name: await stack.wait_pod(name, bound) for name in names}
    [job_id] = {job_id_of(p) for p in placed.values()}
    big, small = await components_of(stack, job_id)
    assert (asked(big), asked(small)) == ((1, 4, 256, ""), (2, 1, 256, ""))
    assert each_on_its_component(stack, [big, small]) == names
    assert list(allocation(big).values()) == [(4, 256)]
    assert list(allocation(small).values()) == [(1, 256), (1, 256)]
    assert held in allocation(small)  # the 1 free CPU there went to a 1-CPU pod
    assert sorted(bound(p) or "" for p in placed.values()) == sorted([held or "", *free])
    assert reserved([big, small]) == (4 + 1 + 1, 3 * 256)  # what the pods asked, no more
    for name in names:
        assert not told(stack, name, SIZED_BY_LARGEST_POD)
    await stack.finish(*names)
    assert (await placement(stack, exact).result()).phase == "Done"
    assert all(ended(c) for c in await components_of(stack, job_id))

    # The same group, sized by its largest pod: one job asking 4 CPUs on each of 3 nodes waits.
    largest = pod_group(stack, "largest", 3, {**SHARED, **LARGEST_POD})
    waiting = [
        member(stack, "largest", "largest-0", "4"),
        member(stack, "largest", "largest-1", "1"),
        member(stack, "largest", "largest-2", "1"),
    ]
    # Told in a condition, then an Event: once the Event is there, both are.
    pending = [await stack.wait_pod(name, pending_and_told(stack, name)) for name in waiting]
    assert not any(bound(p) for p in pending)
    [waiting_id] = {job_id_of(p) for p in pending}
    [job] = await components_of(stack, waiting_id)  # one ordinary job
    assert number(job["het_job_id"]) == 0
    assert asked(job) == (3, 4, 256, "")
    assert job["job_state"] == ["PENDING"]
    assert job["state_reason"] == "Resources"
    for name, pod in zip(waiting, pending, strict=True):
        assert offset_of(pod) is None
        [event] = told(stack, name, SIZED_BY_LARGEST_POD)
        assert event["message"].startswith(f"every node of Slurm job {waiting_id} is asked for 4 CPUs: ")
        [event] = told(stack, name, "SlurmJobPending")
        assert event["message"] == f"Slurm job {waiting_id} is pending: Resources"

    # It waited for resources, nothing else: the holder goes and it starts on all three nodes.
    await stack.finish("holder")
    started = [await stack.wait_pod(name, bound) for name in waiting]
    assert sorted(bound(p) or "" for p in started) == sorted(stack.partition.node_names)
    assert {job_id_of(p) for p in started} == {waiting_id}
    await stack.finish(*waiting)
    assert (await placement(stack, largest).result()).phase == "Done"


async def group_of_two_shapes(stack: Stack, name: str) -> tuple[Json, list[str], list[Json]]:
    """A PodGroup of a 2-CPU pod and two 1-CPU pods, placed: (group, pods, components)."""
    group = pod_group(stack, name, 3)
    names = [member(stack, name, f"{name}-0", "2"), member(stack, name, f"{name}-1", "1")]
    names.append(member(stack, name, f"{name}-2", "1"))
    placed = [await stack.wait_pod(n, bound) for n in names]
    [job_id] = {job_id_of(p) for p in placed}
    components = await components_of(stack, job_id)
    assert [asked(c)[:2] for c in components] == [(1, 2), (2, 1)]
    assert each_on_its_component(stack, components) == names
    return group, names, components


async def test_a_cancelled_non_leader_component_evicts_the_whole_group_and_releases_the_job(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(nodes=3, cpus=4)
    group, names, (leader, workers) = await group_of_two_shapes(stack, "cut")
    job_id = leader["job_id"]

    # Cancelling component 1 in Slurm ends it alone: the leader's component still runs.
    await stack.slurm.cancel_job(workers["job_id"])

    for name in names:
        pod = await stack.wait_pod(name, lambda p: p is None or bool(p["metadata"].get("deletionTimestamp")))
        conditions = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}
        assert conditions[keys.CONDITION_SLURM_JOB_ENDED]["reason"] == "SlurmJobCancelled", name
        [event] = told(stack, name, "SlurmJobCancelled")
        assert (event["type"], event["message"][: len(f"Slurm job {job_id} ")]) == (
            "Warning",
            f"Slurm job {job_id} ",
        )
    result = await placement(stack, group).result()
    assert (result.phase, result.end_reason) == ("Done", "SlurmJobCancelled")
    # Released: no component still holds nodes once the placement is done.
    states = [c["job_state"] for c in await components_of(stack, job_id)]
    await stack.slurm.cancel_job(job_id)  # (the test's own clean-up, whatever the bridge did)
    assert states == [["CANCELLED"], ["CANCELLED"]]


async def test_pods_finishing_cancel_every_component(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=3, cpus=4)
    group, names, (leader, _) = await group_of_two_shapes(stack, "done")

    await stack.finish(*names)
    result = await placement(stack, group).result()
    assert (result.phase, result.end_reason) == ("Done", "")
    components = await components_of(stack, leader["job_id"])
    assert [c["job_state"] for c in components] == [["CANCELLED"], ["CANCELLED"]]


async def reset_and_bound_again(stack: Stack, name: str) -> tuple[list[str], int, str, Any]:
    """A group of two shapes placed, then its placement reset to its first step (an operator's
    `temporal workflow reset`: prepare_and_submit runs again, looking for its job first) and
    observed until it is Bound again: (pods, job id, the job's comment, the new run's handle)."""
    group, names, components = await group_of_two_shapes(stack, name)
    job_id, comment = components[0]["job_id"], components[0]["comment"]
    again = await reset_to_first_task(stack, placement(stack, group), "test: reset a het job's placement")
    await bound_again(again, job_id)
    return names, job_id, comment, again


async def test_a_reset_placement_adopts_its_het_job(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=3, cpus=4)
    names, job_id, comment, again = await reset_and_bound_again(stack, "again")

    # Exactly one het job carries the placement's comment: its two components, nothing else.
    mine = [j for j in await stack.partition_jobs() if j["comment"] == comment]
    assert sorted(j["job_id"] for j in mine) == [job_id, job_id + 1]
    assert {number(j["het_job_id"]) for j in mine} == {job_id}
    assert len(await stack.partition_jobs()) == 2
    assert {job_id_of(stack.pod(name)) for name in names} == {job_id}

    await stack.finish(*names)
    assert (await again.result()).phase == "Done"
    assert [c["job_state"] for c in await components_of(stack, job_id)] == [["CANCELLED"], ["CANCELLED"]]


async def test_a_reset_placement_tells_the_pods_the_het_job_as_it_is(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=3, cpus=4)
    names, job_id, _, again = await reset_and_bound_again(stack, "told")
    # Read before the pods finish, checked after: a failure leaves nothing held.
    offsets = [offset_of(stack.pod(name)) for name in names]
    messages = {name: sorted(e["message"] for e in told(stack, name, "SlurmJobSubmitted")) for name in names}
    await stack.finish(*names)
    assert (await again.result()).phase == "Done"

    # The pods are told of the job as it is: the same two components, each pod in its own.
    assert offsets == ["0", "1", "1"]
    submitted = f"Slurm job {job_id} %s in partition {stack.partition.name}, as a heterogeneous job"
    for name in names:
        assert messages[name] == [
            f"{submitted % 'adopted (it already existed)'} of 2 components: 1 + 2 pods",
            f"{submitted % 'submitted'} of 2 components: 1 + 2 pods",
        ]


# -- the sweep and a pending job's update ---------------------------------------------------------


async def test_the_sweep_adopts_a_terminated_placements_het_job_once_and_follows_it(
    make_stack: StackFactory,
) -> None:
    # An operator terminated the placement of a bound group: its het job and pods remain. The
    # sweep sees the job's two components as one job of three pods and adopts it once.
    stack = await make_stack(nodes=3, cpus=4, installation_id=unique("sweep"))
    group, names, components = await group_of_two_shapes(stack, "orphan")
    job_id = components[0]["job_id"]
    await placement(stack, group).terminate("test: the placement is lost")

    result = await sweep(stack)
    assert (result.adopted, result.cancelled, result.finalizers_dropped, result.skipped) == (1, 0, 0, 0), (
        result
    )

    def rebound() -> bool:
        """The adopted run has bound every pod again, accepting each one's binding."""
        return all([e["reason"] for e in stack.events(name)].count("Bound") >= 2 for name in names)

    await stack.kube.wait_for_async(rebound, 20)
    assert each_on_its_component(stack, await components_of(stack, job_id)) == names
    assert sorted(j["job_id"] for j in await stack.partition_jobs()) == [c["job_id"] for c in components]

    await stack.finish(*names)
    assert (await placement(stack, group).result()).phase == "Done"
    assert [c["job_state"] for c in await components_of(stack, job_id)] == [["CANCELLED"], ["CANCELLED"]]
    again = await sweep(stack)
    assert (again.adopted, again.cancelled, again.finalizers_dropped) == (0, 0, 0)


async def test_a_pending_het_job_is_updated_component_by_component(make_stack: StackFactory) -> None:
    # The job waits (two holders keep two of the three nodes whole); then the free node is
    # cordoned: the node rules exclude it for every pod, and each component, a job of its own
    # id in Slurm, is updated.
    stack = await make_stack(nodes=3, cpus=4)
    held = set()
    for holder in ("holder-a", "holder-b"):
        stack.create_pod(holder, cpu="4", annotations=SHARED)
        held.add(bound(await stack.wait_pod(holder, bound)))
    [free] = set(stack.partition.node_names) - held
    group = pod_group(stack, "wait", 3, SHARED)
    names = [member(stack, "wait", "wait-0", "4"), member(stack, "wait", "wait-1", "1")]
    names.append(member(stack, "wait", "wait-2", "1"))
    pending = [await stack.wait_pod(name, pending_and_told(stack, name)) for name in names]
    [job_id] = {job_id_of(p) for p in pending}
    assert job_id is not None
    stack.kube.update_object("nodes", free, lambda node: node["spec"].update(unschedulable=True))
    await stack.kube.wait_for_async(
        lambda: all("SlurmJobUpdated" in [e["reason"] for e in stack.events(n)] for n in names), 30
    )
    big, small = await components_of(stack, job_id)
    # Both components exclude the cordoned node; their sizes did not change.
    assert free in hostlist.expand(big["excluded_nodes"] or "")
    assert free in hostlist.expand(small["excluded_nodes"] or "")
    assert (asked(big)[:2], asked(small)[:2]) == ((1, 4), (2, 1))
    for name in names:
        stack.kube.delete_object("pods", name, stack.namespace)
    for name in names:
        await stack.wait_pod(name, lambda p: p is None)
    assert (await placement(stack, group).result()).phase == "Done"
    await stack.finish("holder-a", "holder-b")
