"""Place only where Kubernetes will run it: node rules become `excluded_nodes`, on real Slurm.

Slurm picks the node, but the kubelet decides whether the pod may run there. With
two free nodes Slurm takes the first, so each test steers the pod to the second
by a Kubernetes rule and checks that Slurm was told (`excluded_nodes`) and obeyed.
"""

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bridge import hostlist, keys
from bridge.slurm_api import JobDescMsg
from testbed.waiting import until
from tests.e2e.conftest import ON_REAL_KUBE, StackFactory
from tests.e2e.harness import Pod, Stack, bound, finished_cleanly, job_id_of, make_pod
from worker.main import Bridge

pytestmark = pytest.mark.slurm


def scheduled_condition(pod: Pod | None) -> dict[str, Any] | None:
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "PodScheduled"), None)


def pod_with(stack: Stack, name: str, **spec: Any) -> Pod:
    pod = make_pod(stack.namespace, name)
    pod["spec"].update(spec)
    return stack.kube.create_object("pods", pod)


async def submitted_job(stack: Stack, pod: Pod) -> dict[str, Any]:
    job_id = job_id_of(pod)
    assert job_id is not None
    return (await stack.slurm.get_job(job_id)).model_dump(mode="json")


def excluded(job: dict[str, Any]) -> str:
    """The job's excluded nodes as Slurm has them, one name after the other (the bridge sends ranges)."""
    return ",".join(hostlist.expand(str(job.get("excluded_nodes") or "")))


async def change_node(stack: Stack, bridge: Bridge, name: str, change: Callable[[Pod], None]) -> None:
    """Change a node and wait until the bridge's node watcher has seen the change."""
    version = int(stack.kube.update_object("nodes", name, change)["metadata"]["resourceVersion"])
    watched = bridge.node_watcher.informer
    await stack.kube.wait_for_async(lambda: int(watched.resource_version or 0) >= version)


@ON_REAL_KUBE
async def test_node_selector_excludes_the_other_nodes(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=2)
    first, second = stack.partition.node_names
    pod_with(stack, "picky", nodeSelector={"kubernetes.io/hostname": second})

    pod = await stack.wait_pod("picky", bound)
    assert bound(pod) == second
    assert excluded(await submitted_job(stack, pod)) == first
    await stack.finish("picky")


@ON_REAL_KUBE
async def test_explain_prints_the_job_the_worker_submitted(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=2, bridge=False)
    submitted: list[JobDescMsg] = []
    submit = stack.slurm.submit_job

    async def recording(job: JobDescMsg) -> int:
        submitted.append(job)
        return await submit(job)

    stack.slurm.submit_job = recording  # type: ignore[method-assign]
    await stack.start_bridge()
    first, second = stack.partition.node_names
    pod_with(stack, "picky", nodeSelector={"kubernetes.io/hostname": second})
    await stack.wait_pod("picky", bound)

    settings = stack.settings
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("slurm-bridge")),
        "explain",
        f"{stack.namespace}/picky",
        "--kubeconfig",
        str(stack.kubeconfig),
        "--partition",
        settings.partition,
        "--mcs-label",
        settings.mcs_label,
        "--installation",
        settings.installation_id,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    [explained] = json.loads(out)
    [job] = submitted
    assert explained["unschedulable"] is None
    assert explained["job_desc_msg"]["excluded_nodes"] == [first]
    # The very job_desc_msg the worker sent to slurmrestd, comment (placement id) included.
    as_sent = JobDescMsg.model_validate(explained["job_desc_msg"]).model_dump(mode="json", exclude_none=True)
    assert as_sent == job.model_dump(mode="json", exclude_none=True)
    await stack.finish("picky")


@ON_REAL_KUBE
async def test_required_node_affinity_on_fields_and_labels(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=2)
    first, second = stack.partition.node_names
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [first]}],
                        "matchExpressions": [{"key": keys.LABEL_EXTERNAL_NODE, "operator": "Exists"}],
                    }
                ]
            }
        }
    }
    pod_with(stack, "affine", affinity=affinity)
    pod = await stack.wait_pod("affine", bound)
    assert bound(pod) == second
    await stack.finish("affine")


@ON_REAL_KUBE
async def test_an_untolerated_taint_keeps_slurm_off_the_node(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=2)
    first, second = stack.partition.node_names
    stack.kube.update_object(
        "nodes",
        first,
        lambda n: n["spec"].update(taints=[{"key": "gpu", "value": "a100", "effect": "NoSchedule"}]),
    )
    stack.create_pod("plain")
    pod = await stack.wait_pod("plain", bound)
    assert bound(pod) == second
    assert excluded(await submitted_job(stack, pod)) == first
    await stack.finish("plain")


@ON_REAL_KUBE
async def test_no_feasible_node_waits_with_the_reason_until_a_node_fits(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=2)
    first, _ = stack.partition.node_names
    pod_with(stack, "gpu-hungry", nodeSelector={"accelerator": "h100"})

    pod = await stack.wait_pod(
        "gpu-hungry", lambda p: (scheduled_condition(p) or {}).get("reason") == "Unschedulable"
    )
    message = (scheduled_condition(pod) or {})["message"]
    assert message.startswith("0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector")
    await stack.kube.wait_for_async(
        lambda: any(e["reason"] == "FailedScheduling" for e in stack.events("gpu-hungry"))
    )
    assert job_id_of(pod) is None
    assert not await stack.partition_jobs(), "nothing is submitted for a pod no node can take"

    # A node gains the label: the node watcher wakes the placement, which submits at once.
    stack.kube.update_object("nodes", first, lambda n: n["metadata"]["labels"].update(accelerator="h100"))
    pod = await stack.wait_pod("gpu-hungry", bound)
    assert bound(pod) == first
    await stack.finish("gpu-hungry")


@ON_REAL_KUBE
async def test_a_burst_of_node_changes_wakes_only_the_placements_it_concerns(
    make_stack: StackFactory,
) -> None:
    """Placements that no node could take are woken by a burst only when their pods' view of the
    nodes changed: a label no pod asks about wakes none (each was woken on every burst before),
    the label one pod asks for wakes that one, which is then placed."""
    stack = await make_stack(nodes=2, bridge=False)
    bridge = await stack.start_bridge()
    watcher, refresher = bridge.node_watcher, bridge.node_watcher.refresher
    assert refresher is not None
    wakes = watcher.unschedulable
    assert wakes is not None
    await asyncio.wait_for(refresher.wait_for_passes(1), 30)  # the first listing's pass, before any pod
    first, _ = stack.partition.node_names
    for name, accelerator in (("wants-h100", "h100"), ("wants-a100", "a100")):
        pod_with(stack, name, nodeSelector={"accelerator": accelerator})
        await stack.wait_pod(name, lambda p: (scheduled_condition(p) or {}).get("reason") == "Unschedulable")

    async def listed() -> bool:
        found = [e async for e in stack.temporal.list_workflows(watcher.unschedulable_query)]
        return len(found) == 2

    await until(listed, "both placements listed as Unschedulable", 30)

    async def burst(change: Callable[[Pod], None]) -> tuple[int, int]:
        """One node change, one pass: (placements woken, placements left alone)."""
        woken, skipped, passes = watcher.wakes, wakes.skipped, refresher.refreshes
        await change_node(stack, bridge, first, change)
        await asyncio.wait_for(refresher.wait_for_passes(passes + 1), 30)
        return watcher.wakes - woken, wakes.skipped - skipped

    # The first burst since they wait has nothing to compare with: both are woken, as before.
    assert await burst(lambda n: n["metadata"]["labels"].update(rack="a")) == (2, 0)
    assert await burst(lambda n: n["metadata"]["labels"].update(rack="b")) == (0, 2)
    assert await burst(lambda n: n["metadata"]["labels"].update(accelerator="h100")) == (1, 1)
    assert bound(await stack.wait_pod("wants-h100", bound)) == first
    assert (scheduled_condition(stack.pod("wants-a100")) or {}).get("reason") == "Unschedulable"
    for name in ("wants-h100", "wants-a100"):
        await stack.finish(name)


async def test_the_managed_node_toleration_is_added_before_binding(make_stack: StackFactory) -> None:
    """Node sync taints bridge nodes NoExecute; without the webhook the worker adds the toleration.

    The fake API server runs Kubernetes' taint manager: a pod bound there without
    the toleration would be deleted at once.
    """
    stack = await make_stack(nodes=1)
    (node,) = stack.partition.node_names
    taint = {"key": keys.TAINT_MANAGED_NODE, "value": keys.DEFAULT_SCHEDULER_NAME, "effect": "NoExecute"}
    stack.kube.update_object("nodes", node, lambda n: n["spec"].update(taints=[taint]))
    stack.create_pod("untolerated")  # no webhook ran: no toleration in the spec

    pod = await stack.wait_pod("untolerated", bound)
    tolerations = pod["spec"].get("tolerations") or []
    assert {
        "key": keys.TAINT_MANAGED_NODE,
        "operator": "Equal",
        "value": keys.DEFAULT_SCHEDULER_NAME,
        "effect": "NoExecute",
    } in tolerations
    stack.fake.settle()  # the taint manager has seen the binding
    after = stack.pod("untolerated")
    assert after is not None, "deleted by the taint manager"
    assert not after["metadata"].get("deletionTimestamp"), "evicted by the taint manager"
    await stack.finish("untolerated")


@ON_REAL_KUBE
async def test_an_excluded_node_unknown_to_slurm_is_dropped_not_fatal(make_stack: StackFactory) -> None:
    """A labelled Kubernetes node that node sync has not registered yet must not fail the job."""
    stack = await make_stack(nodes=1)
    (node,) = stack.partition.node_names
    stack.kube.create_node("not-in-slurm-yet", labels={keys.LABEL_EXTERNAL_NODE: "true"})
    stack.kube.update_object(
        "nodes",
        "not-in-slurm-yet",
        lambda n: n["spec"].update(taints=[{"key": "maintenance", "effect": "NoSchedule"}]),
    )
    stack.create_pod("steady")
    pod = await stack.wait_pod("steady", bound)
    assert bound(pod) == node
    await stack.finish("steady")


@ON_REAL_KUBE
async def test_a_pending_jobs_exclusions_follow_node_changes(make_stack: StackFactory) -> None:
    """A burst of node changes while jobs wait in Slurm updates the excluded_nodes of the job
    whose usable nodes changed, and only that job's. (That a burst is one pass is
    test_node_sync's, on an API server of its own: here other tests' nodes change too, and the
    debounce runs from any node's change, so a burst may fall into two passes.)"""
    stack = await make_stack(nodes=2, bridge=False)
    updated: list[int] = []
    update = stack.slurm.update_job

    async def recording(job_id: int, job: JobDescMsg) -> None:
        updated.append(job_id)
        await update(job_id, job)

    stack.slurm.update_job = recording  # type: ignore[method-assign]
    bridge = await stack.start_bridge()
    watcher = bridge.node_watcher
    refresher = watcher.refresher
    assert refresher is not None
    # Three round trips and watch events take a loaded machine longer than the default second:
    # the burst is what is tested, not how long a burst may last. The pass the node watcher's
    # first listing makes is over before anything is counted.
    watcher.debounce = 5.0
    await asyncio.wait_for(refresher.wait_for_passes(1), 30)
    first, second = stack.partition.node_names
    # The API server is the test session's: other tests' nodes come and go meanwhile, and a burst
    # of theirs is a pass too. Counted here: the passes that answered this test's nodes' changes.
    ours: list[frozenset[str]] = []
    both = frozenset({first, second})
    answered = asyncio.Condition()
    refresh = refresher.refresh

    async def counted() -> int:
        burst = watcher.last_burst & both
        try:
            return await refresh()
        finally:
            if burst:
                async with answered:
                    ours.append(burst)
                    answered.notify_all()

    async def answered_since(since: int, nodes: frozenset[str]) -> None:
        """Until the passes after the first `since` of ours have answered changes on `nodes`."""
        async with answered:
            await asyncio.wait_for(answered.wait_for(lambda: nodes <= frozenset().union(*ours[since:])), 30)

    refresher.refresh = counted  # type: ignore[method-assign]
    for name in ("h1", "h2"):
        stack.create_pod(name)
        await stack.wait_pod(name, bound)
    pending = {}
    maintenance = [{"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}]
    for name, spec in (("waiting", {}), ("tolerant", {"tolerations": maintenance})):
        pod_with(stack, name, **spec)
        pending[name] = await stack.wait_pod(name, lambda p: job_id_of(p) is not None)
        job = await submitted_job(stack, pending[name])
        assert ("PENDING" in job["job_state"], excluded(job)) == (True, "")
    told, before = refresher.told, len(ours)

    # A burst, each change seen by the node watcher before the next (well within its debounce):
    # the taint matters to "waiting" only, the labels to neither job.
    taint = {"key": "maintenance", "effect": "NoSchedule"}
    await change_node(stack, bridge, second, lambda n: n["spec"].update(taints=[taint]))
    await change_node(stack, bridge, second, lambda n: n["metadata"]["labels"].update(rack="a"))
    await change_node(stack, bridge, first, lambda n: n["metadata"]["labels"].update(rack="b"))
    await stack.kube.wait_for_async(
        lambda: any(e["reason"] == "SlurmJobUpdated" for e in stack.events("waiting")), timeout=30
    )
    await answered_since(before, both)
    assert excluded(await submitted_job(stack, pending["waiting"])) == second
    assert refresher.told - told == 1
    burst = len(ours)

    holder = "h1" if bound(stack.pod("h1")) == first else "h2"
    stack.kube.set_pod_phase(stack.namespace, holder, "Succeeded")
    assert bound(await stack.wait_pod("waiting", bound)) == first
    # No pass for them since (nothing changed them), and the tolerant job never touched.
    assert len(ours) == burst
    assert updated == [job_id_of(pending["waiting"])]
    assert not [e for e in stack.events("tolerant") if e["reason"] == "SlurmJobUpdated"]
    assert excluded(await submitted_job(stack, pending["tolerant"])) == ""

    # A node change that concerns no pending job reads none from Slurm: "tolerant" was read in
    # the burst's pass and found in step, and its pod still asks for the same nodes.
    reads = refresher.job_reads
    await change_node(stack, bridge, first, lambda n: n["metadata"]["labels"].update(rack="c"))
    await answered_since(burst, frozenset({first}))
    assert (refresher.job_reads - reads, refresher.told - told) == (0, 1)
    for name in ("h1", "h2", "waiting", "tolerant"):
        stack.kube.set_pod_phase(stack.namespace, name, "Succeeded")
        await stack.wait_pod(name, finished_cleanly)


@ON_REAL_KUBE
async def test_a_pending_jobs_last_exclusion_is_lifted_when_the_node_fits_again(
    make_stack: StackFactory,
) -> None:
    """The set of excluded nodes can become empty: Slurm must be told so (an update that leaves
    the field out keeps the old list, and with it a node that may since have been deleted)."""
    stack = await make_stack(nodes=2)
    _, second = stack.partition.node_names
    for name in ("h1", "h2"):  # both nodes full: the next job waits
        stack.create_pod(name, cpu="4")
        await stack.wait_pod(name, bound)
    taint = {"key": "maintenance", "effect": "NoSchedule"}
    stack.kube.update_object("nodes", second, lambda n: n["spec"].update(taints=[taint]))
    stack.create_pod("waiting")
    pod = await stack.wait_pod(
        "waiting", lambda p: (scheduled_condition(p) or {}).get("reason") == "Resources"
    )
    assert excluded(await submitted_job(stack, pod)) == second

    stack.kube.update_object("nodes", second, lambda n: n["spec"].update(taints=[]))
    await stack.kube.wait_for_async(
        lambda: any(e["reason"] == "SlurmJobUpdated" for e in stack.events("waiting")), timeout=30
    )
    assert excluded(await submitted_job(stack, pod)) == ""
    for name in ("h1", "h2", "waiting"):
        stack.kube.set_pod_phase(stack.namespace, name, "Succeeded")
        await stack.wait_pod(name, finished_cleanly)


@ON_REAL_KUBE
async def test_a_pending_job_that_no_node_fits_any_more_says_why_and_stays_off_every_node(
    make_stack: StackFactory,
) -> None:
    """Every node stops fitting while the job waits: the pods are told as when none fitted at
    submission (PodScheduled=False, FailedScheduling), and Slurm keeps the job pending with every
    node excluded, so it cannot start where the kubelet would refuse its pods, until one fits again."""
    stack = await make_stack(nodes=2)
    first, second = stack.partition.node_names
    for name in ("h1", "h2"):  # both nodes full: the next job waits
        stack.create_pod(name, cpu="4")
        await stack.wait_pod(name, bound)
    stack.create_pod("waiting")
    pod = await stack.wait_pod(
        "waiting", lambda p: (scheduled_condition(p) or {}).get("reason") == "Resources"
    )

    taint = {"key": "maintenance", "effect": "NoSchedule"}
    for node in (first, second):
        stack.kube.update_object("nodes", node, lambda n: n["spec"].update(taints=[taint]))
    pod = await stack.wait_pod(
        "waiting", lambda p: (scheduled_condition(p) or {}).get("reason") == "Unschedulable", timeout=30
    )
    summary = "0/2 nodes are available: 2 node(s) had untolerated taint {maintenance: }."
    assert (scheduled_condition(pod) or {})["message"] == summary
    told = await stack.kube.wait_for_async(
        lambda: [e for e in stack.events("waiting") if e["reason"] == "FailedScheduling"]
    )
    assert [(e["type"], e["message"]) for e in told] == [("Warning", summary)]
    job = await submitted_job(stack, pod)
    assert "PENDING" in job["job_state"]
    assert sorted(hostlist.expand(excluded(job))) == sorted([first, second])
    # Sent as one range (node names end in 1 and 2), and Slurm holds it as sent.
    assert job["excluded_nodes"] == hostlist.compress([first, second])

    # One node fits again: its exclusion is lifted, the stale reason goes, and the job starts
    # there once it is free.
    stack.kube.update_object("nodes", first, lambda n: n["spec"].update(taints=[]))
    pod = await stack.wait_pod(
        "waiting", lambda p: (scheduled_condition(p) or {}).get("reason") == "SlurmJobPending", timeout=30
    )
    assert excluded(await submitted_job(stack, pod)) == second
    holder = "h1" if bound(stack.pod("h1")) == first else "h2"
    stack.kube.set_pod_phase(stack.namespace, holder, "Succeeded")
    assert bound(await stack.wait_pod("waiting", bound)) == first
    for name in ("h1", "h2", "waiting"):
        stack.kube.set_pod_phase(stack.namespace, name, "Succeeded")
        await stack.wait_pod(name, finished_cleanly)
