"""Place only where Kubernetes will run it: node rules become `excluded_nodes`, on real Slurm.

Slurm picks the node, but the kubelet decides whether the pod may run there. With
two free nodes Slurm takes the first, so each test steers the pod to the second
by a Kubernetes rule and checks that Slurm was told (`excluded_nodes`) and obeyed.
"""

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bridge import keys
from bridge.slurm_api import JobDescMsg
from tests.e2e.conftest import StackFactory
from tests.e2e.harness import Pod, Stack, bound, finished_cleanly, job_id_of, make_pod

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
    return str(job.get("excluded_nodes") or "")


async def finish(stack: Stack, name: str) -> None:
    stack.kube.set_pod_phase(stack.namespace, name, "Succeeded")
    await stack.wait_pod(name, finished_cleanly)


async def test_node_selector_excludes_the_other_nodes(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=2)
    first, second = stack.partition.node_names
    pod_with(stack, "picky", nodeSelector={"kubernetes.io/hostname": second})

    pod = await stack.wait_pod("picky", bound)
    assert bound(pod) == second
    assert excluded(await submitted_job(stack, pod)) == first
    await finish(stack, "picky")


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
    await finish(stack, "picky")


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
    await finish(stack, "affine")


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
    await finish(stack, "plain")


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
    await finish(stack, "gpu-hungry")


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
    stack.kube.settle()  # the taint manager has seen the binding
    after = stack.pod("untolerated")
    assert after is not None, "deleted by the taint manager"
    assert not after["metadata"].get("deletionTimestamp"), "evicted by the taint manager"
    await finish(stack, "untolerated")


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
    await finish(stack, "steady")


async def test_a_pending_jobs_exclusions_follow_node_changes(make_stack: StackFactory) -> None:
    """A taint added while a job waits in Slurm updates its excluded_nodes (and only that job's)."""
    stack = await make_stack(nodes=2)
    first, second = stack.partition.node_names
    for name in ("h1", "h2"):
        stack.create_pod(name)
        await stack.wait_pod(name, bound)
    stack.create_pod("waiting")
    pod = await stack.wait_pod(
        "waiting", lambda p: (scheduled_condition(p) or {}).get("reason") == "Resources"
    )
    assert excluded(await submitted_job(stack, pod)) == ""

    taint = {"key": "maintenance", "effect": "NoSchedule"}
    stack.kube.update_object("nodes", second, lambda n: n["spec"].update(taints=[taint]))
    await stack.kube.wait_for_async(
        lambda: any(e["reason"] == "SlurmJobUpdated" for e in stack.events("waiting")), timeout=30
    )
    assert excluded(await submitted_job(stack, pod)) == second

    holder = "h1" if bound(stack.pod("h1")) == first else "h2"
    stack.kube.set_pod_phase(stack.namespace, holder, "Succeeded")
    assert bound(await stack.wait_pod("waiting", bound)) == first
    for name in ("h1", "h2", "waiting"):
        stack.kube.set_pod_phase(stack.namespace, name, "Succeeded")
        await stack.wait_pod(name, finished_cleanly)
