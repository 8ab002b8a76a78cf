"""How a placement ends when things are not tidy, on real Slurm.

- A PodDisruptionBudget blocks the eviction of a pod whose job ended: honoured for
  EVICTION_PATIENCE, then the pod is deleted with an Event saying so.
- A bound pod being deleted whose kubelet never confirms (its node is gone): after
  its grace period plus DELETION_SLACK the Slurm job is released, with an Event.
"""

import asyncio
from typing import Any

import pytest

from tests.e2e.conftest import StackFactory
from tests.e2e.harness import Pod, bound, finished_cleanly, job_id_of

pytestmark = pytest.mark.slurm


def scheduled_condition(pod: Pod | None) -> dict[str, Any] | None:
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "PodScheduled"), None)


async def test_a_disruption_budget_is_honoured_for_a_while_then_overridden(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=1, eviction_patience=2)
    created = stack.create_pod("guarded")
    job_id = job_id_of(await stack.wait_pod("guarded", bound))
    assert job_id is not None
    stack.kube.block_evictions()  # every eviction answers 429, as a PodDisruptionBudget at its limit does

    await stack.slurm.cancel_job(job_id)
    await stack.wait_pod("guarded", lambda p: p is None or p["metadata"].get("deletionTimestamp"), timeout=60)
    evictions = [
        r for r in stack.kube.requests if r.method == "POST" and r.path.endswith("/guarded/eviction")
    ]
    assert evictions, "the bridge evicts; it deletes only once the budget held it back too long"
    reasons = [e["reason"] for e in stack.events("guarded")]
    assert "SlurmJobCancelled" in reasons
    assert "DisruptionBudgetOverridden" in reasons
    assert (await stack.handle(created).result()).end_reason == "SlurmJobCancelled"


async def test_a_pod_stuck_terminating_releases_its_job(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=1, deletion_slack=1)
    created = stack.create_pod("stranded")
    pod = await stack.wait_pod("stranded", bound)
    job_id = job_id_of(pod)
    assert job_id is not None

    # Deleted with a short grace period; no kubelet ever confirms (the fake runs none here).
    stack.kube.update_object(
        "pods",
        "stranded",
        lambda p: p["spec"].update(terminationGracePeriodSeconds=1),
        stack.namespace,
    )
    stack.kube.delete_object("pods", "stranded", stack.namespace)
    async with asyncio.timeout(60):  # grace 1 s + slack 1 s, and Slurm's cancel
        result = await stack.handle(created).result()
    assert result.phase == "Done"
    job = (await stack.slurm.get_job(job_id)).model_dump(mode="json")
    assert "CANCELLED" in job["job_state"]
    released = [e for e in stack.events("stranded") if e["reason"] == "SlurmJobReleased"]
    assert released, "the user is told the allocation was released under a pod that may still run"
    assert "a process may still run" in released[0]["message"]
    # The finalizer is gone; the object stays Terminating until its node's kubelet (or the node's
    # removal) confirms, as on a real cluster. The bridge holds nothing for it any more.
    await stack.wait_pod("stranded", finished_cleanly)


async def test_no_overlap_a_node_handed_on_waits_for_the_old_pods_to_stop(make_stack: StackFactory) -> None:
    """Slurm gives the node to the next job the moment a job ends; the old pod may still be stopping."""
    stack = await make_stack(nodes=1)
    stack.create_pod("old")
    old_job = job_id_of(await stack.wait_pod("old", bound))
    assert old_job is not None
    stack.create_pod("new")
    await stack.wait_pod("new", job_id_of)  # pending behind the old job

    await stack.slurm.cancel_job(old_job)  # Slurm starts the new job on the same node at once
    waiting = await stack.wait_pod(
        "new", lambda p: (scheduled_condition(p) or {}).get("reason") == "WaitingForNode", timeout=60
    )
    assert bound(waiting) is None
    assert "old" in (scheduled_condition(waiting) or {})["message"]
    # The old pod is evicted (its placement hears of the job's end within a probe of a running
    # job) and stays Terminating until its kubelet confirms; the new pod is still not bound.
    old = await stack.wait_pod("old", lambda p: bool(p and p["metadata"].get("deletionTimestamp")))
    assert bound(old) is not None
    assert bound(stack.pod("new")) is None

    stack.kube.set_pod_phase(stack.namespace, "old", "Failed")  # the kubelet stops it
    new = await stack.wait_pod("new", bound)
    assert bound(new) == stack.partition.node_names[0]
    stack.kube.set_pod_phase(stack.namespace, "new", "Succeeded")
    await stack.wait_pod("new", finished_cleanly)
    await stack.wait_pod("old", finished_cleanly)  # its release may have met the kubelet's write: retried
