"""Node sync end to end: real Temporal Schedule, real Slurm 26.05, Kubernetes API over HTTP.

Each test runs a whole Bridge (worker + pod, job and node watchers) with its own
Schedule. Waits are on conditions: the fake API server's change notifications,
a triggered run's result, or (where Slurm decides) Slurm's state polled with a
deadline.
"""

import asyncio
import contextlib
import secrets
from pathlib import Path

import pytest
from temporalio.client import Client, ScheduleIntervalSpec, ScheduleOverlapPolicy, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.worker import Replayer

from bridge import hostlist, keys
from bridge.node_actions import PARTITION_NOT_FOUND, REGISTERED, NodeSyncRequest, NodeSyncResult, owned_by
from bridge.node_facts import is_busy
from bridge.slurm_api import API_VERSIONS, JobDescMsg
from clients.kube_client import KubeClient, load_configuration
from testbed.kube_fake import FakeKubeServer
from testbed.waiting import until
from tests.e2e.conftest import ON_REAL_KUBE, MakeNodes
from tests.e2e.harness import make_pod, wait_job_state
from tests.e2e.node_fixtures import Json, NodeStack, workflow_id
from worker.node_watcher import NodeWatcher
from worker.schedules import ensure_node_sync_schedule
from worker.settings import load_settings
from workflows.node_sync import NodeSyncWorkflow

pytestmark = pytest.mark.slurm

OUR_PREFIX = keys.DRAIN_REASON_PREFIX


def drained(node: Json | None) -> bool:
    state = (node or {}).get("state") or []
    return "DRAIN" in state


def reasons(stack: NodeStack, name: str) -> list[str]:
    return [event["reason"] for event in stack.events(name)]


async def submit_job(stack: NodeStack, partition: str) -> int:
    """A placeholder external job that takes one node of `partition` (a test job, not a pod's)."""
    job = JobDescMsg.model_validate(
        {
            "name": f"{stack.prefix}-job",
            "flags": [keys.EXTERNAL_JOB_FLAG],
            "partition": partition,
            "nodes": "1",
            "minimum_nodes": 1,
            "maximum_nodes": 1,
            "tasks": 1,
            "cpus_per_task": 1,
            "current_working_directory": "/tmp",
            "time_limit": {"set": True, "infinite": False, "number": 30},
        }
    )
    job_id = await stack.slurm.submit_job(job)
    stack.jobs.append(job_id)
    return job_id


async def wait_job_running(stack: NodeStack, job_id: int, timeout: float = 30) -> list[str]:
    job = await wait_job_state(stack.slurm, job_id, lambda states: "RUNNING" in states, timeout)
    return [n["name"] for n in job["job_resources"]["nodes"]["allocation"]]


# -- registration -------------------------------------------------------------------


@ON_REAL_KUBE
@pytest.mark.parametrize("api_version", API_VERSIONS)  # SLURM_API_VERSION: both, on the same slurmrestd
async def test_a_labelled_node_is_registered_with_its_resources_and_kept_in_step(
    make_nodes: MakeNodes, api_version: str
) -> None:
    stack = await make_nodes(slurm_api_version=api_version)
    assert stack.bridge is not None
    assert stack.bridge.slurm.api_version == stack.slurm.api_version == api_version
    first, second = stack.make_partition(), stack.make_partition()
    node = stack.add_external_node(
        "ext",
        f"{first.name}, {second.name}",
        cpu="3500m",
        memory="6Gi",
        extra={"nvidia.com/gpu": "2"},
        annotations={keys.ANNOTATION_TOPOLOGY_SPEC: "default:sw1"},
        address="127.0.0.3",
    )

    result = await stack.sync()

    assert result.failed == []
    assert any(line.startswith(f"register Slurm node {node} ") for line in result.applied)
    registered = await stack.slurm_node(node)
    assert registered is not None
    assert "EXTERNAL" in registered["state"]
    assert registered["cpus"] == 3  # whole allocatable CPUs
    assert registered["real_memory"] == 6144
    assert registered["gres"] == "gpu:2"
    assert sorted(registered["features"]) == sorted([first.name, second.name])
    assert registered["address"] == "127.0.0.3"  # the InternalIP, not the (unresolvable) node name
    assert registered["topology"] == "default:sw1"
    assert owned_by(registered["comment"], stack.settings.scheduler_name, stack.settings.installation_id)
    assert stack.tainted(node)
    assert REGISTERED in reasons(stack, node)
    # In step: the next run has nothing to do.
    assert (await stack.sync()).planned == []

    # Annotation changed: updated in place, triggered by the node watcher alone.
    stack.edit_node(
        node, lambda n: n["metadata"]["annotations"].update({keys.ANNOTATION_TOPOLOGY_SPEC: "default:sw2"})
    )
    await stack.wait_slurm(node, lambda n: (n or {}).get("topology") == "default:sw2")

    # Allocatable changed: an idle node is registered again with the new shape.
    def grow(n: Json) -> None:
        n["status"]["allocatable"].update({"cpu": "8", "memory": "16Gi", "nvidia.com/gpu": "4"})

    stack.edit_node(node, grow)
    again = await stack.wait_slurm(node, lambda n: (n or {}).get("cpus") == 8)
    assert again is not None
    assert again["real_memory"] == 16384
    assert again["gres"] == "gpu:4"
    assert again["topology"] == "default:sw2"
    assert not drained(again)
    assert (await stack.sync()).planned == []

    # A run must replay with the code that made it.
    recent = (await stack.temporal.get_schedule_handle(stack.schedule_id).describe()).info.recent_actions
    history = await stack.temporal.get_workflow_handle(workflow_id(recent[-1].action)).fetch_history()
    replayer = Replayer(workflows=[NodeSyncWorkflow], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)


async def test_a_changed_gpu_count_re_registers_the_node_once_no_job_runs_there(
    make_nodes: MakeNodes,
) -> None:
    # With gres.conf (a GPU per device file, as real GPU nodes have) Slurm refuses to change a
    # node's GPU count in place (422, error 2072): only a new registration applies it.
    stack = await make_nodes()
    partition = stack.make_partition()
    node = stack.add_external_node("gpus", partition.name, extra={"nvidia.com/gpu": "2"})
    await stack.sync()
    registered = await stack.slurm_node(node)
    assert registered is not None
    assert registered["gres"] == "gpu:2"

    # Idle: registered again at once with the new count.
    stack.edit_node(node, lambda n: n["status"]["allocatable"].update({"nvidia.com/gpu": "4"}))
    again = await stack.wait_slurm(node, lambda n: (n or {}).get("gres") == "gpu:4")
    assert again is not None
    assert not drained(again)
    result = await stack.sync()
    assert result.failed == []
    assert result.planned == []

    # Busy: drained (no new job takes the GPUs that are going away), re-registered after the job.
    job_id = await submit_job(stack, stack.job_partition(node))
    assert await wait_job_running(stack, job_id) == [node]
    stack.edit_node(node, lambda n: n["status"]["allocatable"].update({"nvidia.com/gpu": "1"}))
    draining = await stack.wait_slurm(node, drained, timeout=15)
    assert draining is not None
    assert draining["reason"] == f"{OUR_PREFIX}re-registering external node {node}: GPUs 4 → 1"
    assert draining["gres"] == "gpu:4"
    result = await stack.sync()
    assert result.failed == []
    assert "RUNNING" in (await stack.slurm.get_job(job_id)).model_dump(mode="json")["job_state"]

    await stack.slurm.cancel_job(job_id)
    await stack.wait_slurm(node, lambda n: not is_busy(n or {}))
    await stack.sync()
    last = await stack.slurm_node(node)
    assert last is not None
    assert last["gres"] == "gpu:1"
    assert not drained(last)


async def test_gpus_only_a_dra_driver_publishes_are_registered(make_nodes: MakeNodes) -> None:
    # No device plugin (no nvidia.com/gpu allocatable): the GPUs are the DRA driver's ResourceSlice.
    stack = await make_nodes()
    partition = stack.make_partition()
    node = stack.add_external_node("dra", partition.name)
    devices = [{"name": f"gpu-{i}", "attributes": {"index": {"int": i}}} for i in range(3)]
    stack.kube.create_object(
        "resourceslices.resource.k8s.io",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-gpus"},
            "spec": {
                "driver": "gpu.example.com",
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        },
    )

    result = await stack.sync()

    assert result.failed == []
    registered = await stack.slurm_node(node)
    assert registered is not None
    assert registered["gres"] == "gpu:3"
    assert (await stack.sync()).planned == []


async def test_a_missing_partition_is_reported_and_the_node_registered_once_fixed(
    make_nodes: MakeNodes,
) -> None:
    stack = await make_nodes()
    partition = stack.make_partition()
    missing = stack.name("no-such-partition")
    node = stack.add_external_node("ext", f"{partition.name},{missing}")

    result = await stack.sync()

    assert await stack.slurm_node(node) is None
    [event] = [e for e in stack.events(node) if e["reason"] == PARTITION_NOT_FOUND]
    assert event["type"] == "Warning"
    assert missing in event["message"]
    assert not stack.tainted(node)
    assert result.failed == []
    # Reported again on the next run: the same Event, counted, not a new one each time.
    await stack.sync()
    [event] = [e for e in stack.events(node) if e["reason"] == PARTITION_NOT_FOUND]
    assert event["count"] >= 2

    stack.edit_node(
        node,
        lambda n: n["metadata"]["annotations"].update(
            {keys.ANNOTATION_EXTERNAL_NODE_PARTITIONS: partition.name}
        ),
    )
    registered = await stack.wait_slurm(node, lambda n: n is not None)
    assert registered is not None
    assert registered["features"] == [partition.name]
    await stack.wait_kube(lambda: stack.tainted(node))


# -- drain mirroring ------------------------------------------------------------------


@ON_REAL_KUBE
@pytest.mark.parametrize("api_version", API_VERSIONS)
async def test_cordon_and_not_ready_drain_and_their_end_undrains(
    make_nodes: MakeNodes, api_version: str
) -> None:
    stack = await make_nodes(slurm_api_version=api_version)
    partition = stack.make_partition()
    [name] = partition.node_names  # a Slurm node made by hand, same name in Kubernetes
    stack.add_node("", name=name)
    await stack.sync()
    assert stack.tainted(name)

    # Every step below is noticed by the node watcher alone: no manual trigger.
    stack.cordon(name)
    node = await stack.wait_slurm(name, drained, timeout=15)
    assert node is not None
    assert node["reason"] == f"{OUR_PREFIX}Kubernetes node {name} is cordoned"

    stack.cordon(name, False)
    await stack.wait_slurm(name, lambda n: not drained(n), timeout=15)

    stack.set_ready(name, False)
    node = await stack.wait_slurm(name, drained, timeout=15)
    assert node is not None
    assert node["reason"] == f"{OUR_PREFIX}Kubernetes node {name} is not Ready (KubeletNotReady)"

    stack.set_ready(name, True)
    await stack.wait_slurm(name, lambda n: not drained(n), timeout=15)
    assert {"SlurmNodeDrained", "SlurmNodeUndrained"} <= set(reasons(stack, name))


@ON_REAL_KUBE
async def test_an_administrators_drain_is_never_lifted(make_nodes: MakeNodes) -> None:
    stack = await make_nodes()
    partition = stack.make_partition()
    [name] = partition.node_names
    stack.add_node("", name=name)
    stack.scontrol_update_node(name, "State=DRAIN", "Reason=disk replacement, ticket 42")

    stack.cordon(name)
    await stack.sync()
    stack.cordon(name, False)
    result = await stack.sync()

    assert not any("drain" in line for line in result.planned)
    node = await stack.slurm_node(name)
    assert drained(node)
    assert (node or {})["reason"] == "disk replacement, ticket 42"
    assert stack.tainted(name)


# -- removal -----------------------------------------------------------------------------


@ON_REAL_KUBE
async def test_label_removal_drains_and_deletes_only_after_the_running_job_ends(
    make_nodes: MakeNodes,
) -> None:
    stack = await make_nodes()
    partition = stack.make_partition()
    node = stack.add_external_node("ext", partition.name)
    await stack.sync()
    job_id = await submit_job(stack, stack.job_partition(node))
    assert await wait_job_running(stack, job_id) == [node]

    stack.unlabel(node, keys.LABEL_EXTERNAL_NODE)
    draining = await stack.wait_slurm(node, drained, timeout=15)
    assert draining is not None
    assert draining["reason"].startswith(f"{OUR_PREFIX}removing external node {node}")
    assert is_busy(draining)
    # Runs while the job runs change nothing: the node stays, the job keeps running, the taint too.
    result = await stack.sync()
    assert not any(line.startswith("delete") for line in result.applied)
    assert "RUNNING" in (await stack.slurm.get_job(job_id)).model_dump(mode="json")["job_state"]
    assert await stack.slurm_node(node) is not None
    assert stack.tainted(node)

    await stack.slurm.cancel_job(job_id)
    await stack.wait_slurm(node, lambda n: not is_busy(n or {}))
    result = await stack.sync()

    assert (
        f"delete Slurm node {node} (label {keys.LABEL_EXTERNAL_NODE} removed from Kubernetes node {node})"
        in (result.applied)
    )
    assert await stack.slurm_node(node) is None
    assert not stack.tainted(node)


@ON_REAL_KUBE
async def test_a_node_made_by_hand_is_never_deleted(make_nodes: MakeNodes) -> None:
    stack = await make_nodes()
    partition = stack.make_partition()
    [name] = partition.node_names  # external, but not registered by the bridge
    stack.add_node("", name=name)
    stack.scontrol_update_node(name, "State=DRAIN", "Reason=slurm-bridge: looks like ours")
    stack.kube.delete_object("nodes", name)

    result = await stack.sync()

    assert result.planned == []
    assert await stack.slurm_node(name) is not None


# -- taints -------------------------------------------------------------------------------


@ON_REAL_KUBE
async def test_managed_nodes_get_the_taint_and_lose_it_when_no_longer_managed(make_nodes: MakeNodes) -> None:
    # A short interval: Slurm-side changes are seen by the schedule, there is no watch on Slurm.
    stack = await make_nodes(node_sync_interval=1)
    partition = stack.make_partition()
    [slurm_name] = partition.node_names
    k8s_only = stack.add_node("web")
    mapped = stack.add_node("k8s", labels={keys.LABEL_SLURM_NODE_NAME: slurm_name})

    await stack.wait_kube(lambda: stack.tainted(mapped))
    [taint] = [t for t in stack.kube_node(mapped)["spec"]["taints"] if t["key"] == keys.TAINT_MANAGED_NODE]
    assert (taint["value"], taint["effect"]) == (stack.settings.scheduler_name, "NoExecute")

    # A Slurm node appears for the Kubernetes-only node: the next scheduled run taints it.
    stack.bed.scontrol(
        "create",
        f"NodeName={k8s_only}",
        "State=EXTERNAL",
        "CPUs=1",
        "RealMemory=100",
        f"Features={partition.name}",
        "NodeAddr=127.0.0.1",
    )
    await stack.wait_kube(lambda: stack.tainted(k8s_only), timeout=15)
    stack.bed.delete_nodes([k8s_only])
    await stack.wait_kube(lambda: not stack.tainted(k8s_only), timeout=15)

    # Point the label elsewhere: no longer managed, the taint goes.
    stack.edit_node(mapped, lambda n: n["metadata"]["labels"].update({keys.LABEL_SLURM_NODE_NAME: "nowhere"}))
    await stack.wait_kube(lambda: not stack.tainted(mapped), timeout=15)
    # Kubernetes-only nodes cost no Slurm errors and no Events.
    assert all(e["type"] == "Normal" for e in stack.events(k8s_only))
    assert stack.events(mapped) == []
    assert (await stack.sync()).failed == []


# -- safety ----------------------------------------------------------------------------------


async def test_unreachable_slurm_or_kubernetes_fails_the_run_and_changes_nothing(
    make_nodes: MakeNodes,
) -> None:
    stack = await make_nodes()
    partition = stack.make_partition()
    node = stack.add_external_node("ext", partition.name)
    await stack.sync()
    assert stack.tainted(node)

    # Slurm unreachable: without its node list the taint would look unwarranted. It stays.
    stack.slurm_cable.unplugged = True
    with pytest.raises(WorkflowFailureError):
        await stack.sync()
    assert stack.tainted(node)
    stack.slurm_cable.unplugged = False

    # Kubernetes unreachable: without the node list our node would look orphaned. It stays.
    stack.fake.fail_next("GET", r"^/api/v1/nodes$", 503, count=1000)
    with pytest.raises(WorkflowFailureError):
        await stack.sync()
    registered = await stack.slurm_node(node)
    assert registered is not None
    assert not drained(registered)


# Plain nodes enough that both sides in full are well above Temporal's 2 MB payload limit
# (a node's view is about 0.4 KiB); on the fake API server, since the real one's test bed is
# shared and every other test's node watcher would see them.
MANY_NODES = 8000


async def test_a_site_of_thousands_of_nodes_is_synced_in_bounded_payloads(make_nodes: MakeNodes) -> None:
    stack = await make_nodes()
    for index in range(MANY_NODES):
        stack.kube.create_node(stack.name(f"plain-{index:05}"))
    partition = stack.make_partition()
    node = stack.add_external_node("ext", partition.name)

    result = await stack.sync(timeout=120)

    assert result.kube_nodes >= MANY_NODES + 1
    assert result.failed == []
    registered = [line for line in result.applied if line.startswith("register ")]
    assert len(registered) == 1
    assert registered[0].startswith(f"register Slurm node {node} ")
    assert stack.tainted(node)
    recent = (await stack.temporal.get_schedule_handle(stack.schedule_id).describe()).info.recent_actions
    history = await stack.temporal.get_workflow_handle(workflow_id(recent[-1].action)).fetch_history()
    largest = max(event.ByteSize() for event in history.events)
    assert largest < 512 * 1024  # below Temporal's warning, let alone its refusal


async def test_changes_beyond_a_runs_limit_are_left_to_the_next_runs(make_nodes: MakeNodes) -> None:
    stack = await make_nodes()
    # Runs of our own, with a limit of two actions: the schedule must not start any meanwhile.
    await stack.temporal.get_schedule_handle(stack.schedule_id).pause(note="runs started by the test")
    partition = stack.make_partition()
    nodes = [stack.add_external_node(f"ext{index}", partition.name) for index in range(3)]
    settings = stack.settings
    request = NodeSyncRequest(
        scheduler_name=settings.scheduler_name,
        default_partition=settings.partition,
        installation=settings.installation_id,
        max_actions=2,  # one node's registration and taint
    )

    async def run() -> NodeSyncResult:
        return await stack.temporal.execute_workflow(
            NodeSyncWorkflow.run,
            request,
            id=f"{stack.prefix}-limited-{secrets.token_hex(3)}",
            task_queue=settings.temporal_task_queue,
        )

    runs = [await run() for _ in range(4)]

    assert [r.deferred for r in runs] == [4, 2, 0, 0]
    assert [len(r.applied) for r in runs] == [2, 2, 2, 0]
    for node in nodes:
        assert await stack.slurm_node(node) is not None
        assert stack.tainted(node)


@pytest.mark.exclusive  # stops slurmctld, which every other test uses
async def test_restart_after_a_node_deletion_leaves_other_bridge_jobs_running(make_nodes: MakeNodes) -> None:
    # Dynamic partitions and their jobs do not survive a slurmctld restart, so the
    # pod runs in the static default partition `slurm-bridge`, pinned by a feature
    # to a node of this test. A high Weight keeps other sessions' jobs off our nodes.
    stack = await make_nodes()
    keep_tag, gone_tag = stack.make_partition(), stack.make_partition()
    keep = stack.add_external_node("keep", f"{keys.DEFAULT_PARTITION},{keep_tag.name}")
    gone = stack.add_external_node("gone", f"{keys.DEFAULT_PARTITION},{gone_tag.name}")
    await stack.sync()
    for name in (keep, gone):
        stack.scontrol_update_node(name, "Weight=60000")
    namespace = stack.prefix
    pod = make_pod(
        namespace, "runner", annotations={keys.SLURMJOB_PREFIX + "constraints": keep_tag.name}, cpu="1"
    )
    stack.kube.create_object("pods", pod)
    await stack.wait_kube(
        lambda: (stack.kube.get_object("pods", "runner", namespace) or {}).get("spec", {}).get("nodeName")
    )
    placed = stack.kube.get_object("pods", "runner", namespace) or {}
    assert placed["spec"]["nodeName"] == keep
    job_id = int(placed["metadata"]["labels"][keys.LABEL_SLURM_JOB_ID])
    stack.jobs.append(job_id)
    stack.kube.set_pod_phase(namespace, "runner", "Running")

    stack.unlabel(gone, keys.LABEL_EXTERNAL_NODE)
    await stack.wait_slurm(gone, lambda n: n is None, timeout=15)
    await asyncio.to_thread(stack.bed.restart_slurmctld)

    job = (await stack.slurm.get_job(job_id)).model_dump(mode="json")
    assert job["job_state"] == ["RUNNING"], job["job_state"]
    assert await stack.slurm_node(keep) is not None
    still = stack.kube.get_object("pods", "runner", namespace)
    assert still is not None
    assert still["spec"]["nodeName"] == keep
    assert (await stack.sync()).planned == []

    # The pod ends normally: its job with it, and the placement cleans up.
    stack.kube.set_pod_phase(namespace, "runner", "Succeeded")
    await stack.wait_kube(
        lambda: (
            keys.FINALIZER
            not in (
                (stack.kube.get_object("pods", "runner", namespace) or {})
                .get("metadata", {})
                .get("finalizers")
                or []
            )
        )
    )


@pytest.mark.exclusive  # stops slurmctld, which every other test uses
async def test_restart_after_deleting_an_excluded_node_keeps_pending_bridge_jobs(
    make_nodes: MakeNodes,
) -> None:
    """Upstream #43 with pending jobs: their `excluded_nodes` name a node that Kubernetes then
    deletes (node sync deletes its Slurm node); slurmctld restarts. Nothing is killed, no pod
    is deleted, the exclusions name the gone node until node sync removed it from Slurm and no
    longer afterwards, and the jobs run later."""
    # As above: the static partition survives the restart, a feature pins the jobs to this
    # test's nodes, a high Weight keeps other sessions' jobs off them.
    # A scheduler name of its own: node sync only ever removes nodes registered under its
    # name, and other sessions sharing this Slurm register theirs under the default one.
    scheduler = f"{secrets.token_hex(3)}-scheduler"
    stack = await make_nodes(scheduler_name=scheduler)
    shared = stack.make_partition()
    keep = stack.add_external_node("keep", f"{keys.DEFAULT_PARTITION},{shared.name}", labels={"zone": "a"})
    gone = stack.add_external_node("gone", f"{keys.DEFAULT_PARTITION},{shared.name}")
    await stack.sync()
    for name in (keep, gone):
        stack.scontrol_update_node(name, "Weight=60000")
    namespace = stack.prefix

    def pod(name: str, cpu: str) -> Json:
        # zone=a: the pods cannot run on `gone`, so their jobs exclude it.
        annotations = {keys.SLURMJOB_PREFIX + "constraints": shared.name}
        body = make_pod(namespace, name, annotations=annotations, cpu=cpu, scheduler=scheduler)
        body["spec"]["nodeSelector"] = {"zone": "a"}
        return stack.kube.create_object("pods", body)

    def current(name: str) -> Json:
        return stack.kube.get_object("pods", name, namespace) or {}

    def job_of(name: str) -> int | None:
        label = (current(name).get("metadata", {}).get("labels") or {}).get(keys.LABEL_SLURM_JOB_ID)
        return int(label) if label else None

    pod("holder", "4")  # all of keep's CPUs
    await stack.wait_kube(lambda: current("holder").get("spec", {}).get("nodeName"))
    assert current("holder")["spec"]["nodeName"] == keep
    holder_job = job_of("holder")
    assert holder_job is not None
    stack.jobs.append(holder_job)
    stack.kube.set_pod_phase(namespace, "holder", "Running")

    waiting = ["waiting-0", "waiting-1"]
    for name in waiting:
        pod(name, "1")
    await stack.wait_kube(lambda: all(job_of(name) for name in waiting))
    pending_jobs = [job_of(name) or 0 for name in waiting]
    stack.jobs.extend(pending_jobs)

    async def jobs() -> dict[int, Json]:
        return {
            job_id: (await stack.slurm.get_job(job_id)).model_dump(mode="json")
            for job_id in (holder_job, *pending_jobs)
        }

    before = await jobs()
    for job_id in pending_jobs:
        assert before[job_id]["job_state"] == ["PENDING"], before[job_id]["job_state"]
        assert gone in hostlist.expand(before[job_id]["excluded_nodes"] or ""), before[job_id]

    # Node sync held back: Kubernetes has forgotten `gone`, Slurm has not. The refresher runs on
    # the deletion and must keep `gone` excluded, or Slurm may start a pending job there, on a
    # node no pod can be bound to (CI met that order once).
    assert stack.bridge is not None
    refresher = stack.bridge.node_watcher.refresher
    assert refresher is not None
    schedule = stack.temporal.get_schedule_handle(stack.schedule_id)
    await schedule.pause(note="test: Kubernetes forgets the node before Slurm does")

    # A run the node watcher triggered before the pause may still be going (or buffered): it would
    # see the deletion, drain `gone` and lift its exclusions itself. Held back means none runs.
    async def none_running() -> bool:  # Temporal sends no event for it
        return not (await schedule.describe()).info.running_actions

    await until(none_running, "the node sync runs to end", 30, 0.1)
    refreshes, told = refresher.refreshes, refresher.told
    stack.kube.delete_object("nodes", gone)
    await asyncio.wait_for(refresher.wait_for_passes(refreshes + 1), 30)
    assert refresher.told == told  # no placement was told to lift the exclusion
    held = await jobs()
    for job_id in pending_jobs:
        assert held[job_id]["job_state"] == ["PENDING"], held[job_id]["job_state"]
        assert gone in hostlist.expand(held[job_id]["excluded_nodes"] or ""), held[job_id]
    await schedule.unpause()
    await stack.sync()
    await stack.wait_slurm(gone, lambda n: n is None, timeout=30)

    seen: dict[int, Json] = {}

    async def exclusions_updated() -> bool:  # Slurm has no watch: poll its jobs
        seen.update(await jobs())
        return all(gone not in hostlist.expand(seen[j]["excluded_nodes"] or "") for j in pending_jobs)

    def still_excluded() -> str:
        events = [
            (e["involvedObject"]["name"], e["reason"], e["message"]) for e in stack.kube.objects("events")
        ]
        excluded = {j: seen[j]["excluded_nodes"] for j in pending_jobs}
        return f"{gone} no longer excluded (excluded: {excluded}; events: {events})"

    await until(exclusions_updated, still_excluded, 30, 0.2)
    await asyncio.to_thread(stack.bed.restart_slurmctld)

    after = await jobs()
    assert after[holder_job]["job_state"] == ["RUNNING"], after[holder_job]["job_state"]
    for job_id in pending_jobs:
        assert after[job_id]["job_state"] == ["PENDING"], after[job_id]["job_state"]
        assert gone not in hostlist.expand(after[job_id]["excluded_nodes"] or "")
    for name in ("holder", *waiting):
        still = current(name)
        assert still, f"pod {name} was deleted"
        assert keys.FINALIZER in still["metadata"]["finalizers"]
        assert not still["metadata"].get("deletionTimestamp"), name
    assert current("holder")["spec"]["nodeName"] == keep
    assert (await stack.sync()).planned == []

    # The holder ends; the waiting jobs run on keep (one at a time: an external job takes
    # the whole node), their pods are bound there and end normally.
    stack.kube.set_pod_phase(namespace, "holder", "Succeeded")

    def running_unfinished() -> list[str]:
        return [
            name
            for name in waiting
            if current(name).get("spec", {}).get("nodeName")
            and current(name).get("status", {}).get("phase") != "Succeeded"
        ]

    for _ in waiting:
        try:
            await stack.wait_kube(running_unfinished, 60)
        except TimeoutError:
            seen = await jobs()
            states = {
                j: (seen[j]["job_state"], seen[j]["state_reason"], seen[j]["excluded_nodes"]) for j in seen
            }
            raise AssertionError(f"not bound: jobs {states}") from None
        for name in running_unfinished():
            assert current(name)["spec"]["nodeName"] == keep
            stack.kube.set_pod_phase(namespace, name, "Succeeded")
    await stack.wait_kube(
        lambda: all(
            keys.FINALIZER not in (current(n)["metadata"].get("finalizers") or [])
            for n in ("holder", *waiting)
        )
    )


# -- the schedule -------------------------------------------------------------------------------


async def test_the_schedule_is_created_once_updated_on_restart_and_stays_paused(
    temporal_client: Client, tmp_path: Path
) -> None:
    token = tmp_path / "jwt"
    token.write_text("x")
    schedule_id = f"ns-{secrets.token_hex(3)}-schedule"
    settings = load_settings(slurm_jwt_file=token, temporal_task_queue="q1", node_sync_interval=45)
    handle = await ensure_node_sync_schedule(temporal_client, settings, schedule_id=schedule_id)
    try:
        described = await handle.describe()
        spec = described.schedule.spec.intervals[0]
        assert isinstance(spec, ScheduleIntervalSpec)
        assert spec.every.total_seconds() == 45
        assert described.schedule.policy.overlap == ScheduleOverlapPolicy.SKIP

        await handle.pause(note="storage maintenance")
        restarted = load_settings(slurm_jwt_file=token, temporal_task_queue="q2", node_sync_interval=90)
        await ensure_node_sync_schedule(temporal_client, restarted, schedule_id=schedule_id)

        described = await handle.describe()
        assert described.schedule.state.paused
        assert described.schedule.state.note == "storage maintenance"
        assert described.schedule.spec.intervals[0].every.total_seconds() == 90
        action = described.schedule.action
        assert getattr(action, "task_queue", None) == "q2"
        assert getattr(action, "workflow", None) == "NodeSyncWorkflow"
    finally:
        await handle.delete()


async def test_the_node_watcher_coalesces_a_burst_and_leaves_a_paused_schedule_alone(
    temporal_client: Client, tmp_path: Path
) -> None:
    token = tmp_path / "jwt"
    token.write_text("x")
    schedule_id = f"ns-{secrets.token_hex(3)}-schedule"
    settings = load_settings(slurm_jwt_file=token, temporal_task_queue=f"no-worker-{schedule_id}")
    handle = await ensure_node_sync_schedule(temporal_client, settings, schedule_id=schedule_id)
    kube = FakeKubeServer().start()
    client = KubeClient(await load_configuration(str(kube.kubeconfig(tmp_path / "kubeconfig"))))
    watcher = NodeWatcher(client, temporal_client, schedule_id=schedule_id, debounce=0.5)
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(watcher.synced.wait(), 10)
        # The first list triggers a run: whatever changed while no one watched. (The watcher's
        # counters announce nothing: polled.)
        await until(lambda: watcher.triggers == 1, "a trigger for the first list")
        # No worker polls this task queue: end the run, or the next would wait (BUFFER_ONE) behind it.
        await terminate_runs(temporal_client, schedule_id)

        # Ten nodes cordoned at once, plus heartbeats that change nothing the plan reads: one run.
        names = [f"n{i}" for i in range(10)]
        for name in names:
            kube.create_node(name)
        for name in names:
            kube.update_object("nodes", name, lambda n: n["spec"].update(unschedulable=True))
            kube.update_object(
                "nodes", name, lambda n: n["status"]["conditions"][0].update(lastHeartbeatTime="x")
            )
        await until(lambda: watcher.triggers == 2, "one trigger for the burst")
        assert (await handle.describe()).info.num_actions == 2

        # Paused by an operator: changes are not synced behind their back.
        await handle.pause(note="maintenance")
        kube.update_object("nodes", "n0", lambda n: n["spec"].update(unschedulable=False))
        await until(lambda: watcher.paused_skips == 1, "a trigger skipped for the paused schedule")
        assert watcher.triggers == 2
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.close()
        kube.stop()
        await terminate_runs(temporal_client, schedule_id)
        await handle.delete()


async def terminate_runs(temporal: Client, schedule_id: str) -> None:
    for action in (await temporal.get_schedule_handle(schedule_id).describe()).info.recent_actions:
        with contextlib.suppress(RPCError):
            await temporal.get_workflow_handle(workflow_id(action.action)).terminate()
