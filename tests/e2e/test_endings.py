"""How a placement ends when things are not tidy, on real Slurm.

- A PodDisruptionBudget blocks the eviction of a pod whose job ended: honoured for
  EVICTION_PATIENCE, then the pod is deleted with an Event saying so.
- A bound pod being deleted whose kubelet never confirms (its node is gone): after
  its grace period plus DELETION_SLACK the Slurm job is released, with an Event.
- A node set DOWN under a running job: Slurm ends it NODE_FAIL; the pod is evicted with
  reason SlurmNodeFailure.
- A node Slurm hands on while the old job's pods still stop: the new pods wait
  (WaitingForNode), for at most the old pods' grace period plus DELETION_SLACK, then
  are bound anyway with a Warning Event.
"""

import asyncio
import time
from typing import Any

import pytest

from bridge import keys
from tests.e2e.conftest import ON_REAL_KUBE, StackFactory
from tests.e2e.harness import Pod, Stack, bound, finished_cleanly, job_id_of, make_pod

pytestmark = pytest.mark.slurm


def create_pod(
    stack: Stack, name: str, *, grace: int | None = None, labels: dict[str, str] | None = None
) -> Pod:
    """A pod for the bridge, with a terminationGracePeriodSeconds and labels of its own if given."""
    pod = make_pod(stack.namespace, name, scheduler=stack.settings.scheduler_name)
    if grace is not None:
        pod["spec"]["terminationGracePeriodSeconds"] = grace
    if labels:
        pod["metadata"]["labels"] = dict(labels)
    return stack.kube.create_object("pods", pod)


def in_order(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events as they were written (the fake's resourceVersions grow)."""
    return sorted(events, key=lambda e: int(e["metadata"]["resourceVersion"]))


def scheduled_condition(pod: Pod | None) -> dict[str, Any] | None:
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "PodScheduled"), None)


async def test_a_disruption_budget_is_honoured_for_a_while_then_overridden(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=1, eviction_patience=2)
    created = stack.create_pod("guarded")
    job_id = job_id_of(await stack.wait_pod("guarded", bound))
    assert job_id is not None
    stack.fake.block_evictions()  # every eviction answers 429, as a PodDisruptionBudget at its limit does

    await stack.slurm.cancel_job(job_id)
    await stack.wait_pod("guarded", lambda p: p is None or p["metadata"].get("deletionTimestamp"), timeout=60)
    evictions = [
        r for r in stack.fake.requests if r.method == "POST" and r.path.endswith("/guarded/eviction")
    ]
    assert evictions, "the bridge evicts; it deletes only once the budget held it back too long"
    reasons = [e["reason"] for e in stack.events("guarded")]
    assert "SlurmJobCancelled" in reasons
    assert "DisruptionBudgetOverridden" in reasons
    assert (await stack.handle(created).result()).end_reason == "SlurmJobCancelled"


async def test_a_real_disruption_budget_is_honoured_for_a_while_then_overridden(
    make_stack: StackFactory,
) -> None:
    """The same, against a policy/v1 PodDisruptionBudget the fake's disruption controller keeps.

    The fake's kubelet runs the pod (Running and Ready): a Pending pod is evicted regardless of
    budgets, as the real eviction subresource does."""
    stack = await make_stack(nodes=1, eviction_patience=2, kubelet=True)
    created = create_pod(stack, "guarded", labels={"app": "guarded"})
    job_id = job_id_of(await stack.wait_pod("guarded", bound))
    assert job_id is not None
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "keep-one", "namespace": stack.namespace},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    stack.kube.create_object("poddisruptionbudgets.policy", budget)

    def synced() -> dict[str, Any] | None:
        pdb = stack.kube.get_object("poddisruptionbudgets.policy", "keep-one", stack.namespace) or {}
        status = pdb.get("status") or {}
        observed = status.get("observedGeneration") == pdb["metadata"].get("generation", 1)
        return status if observed and status.get("currentHealthy") == 1 else None

    # The pod runs and is Ready; the budget needs it: no disruption allowed.
    status = await stack.kube.wait_for_async(synced, 10)
    assert status is not None
    assert (status["expectedPods"], status["desiredHealthy"], status["disruptionsAllowed"]) == (1, 1, 0)

    await stack.slurm.cancel_job(job_id)
    await stack.wait_pod("guarded", lambda p: p is None or p["metadata"].get("deletionTimestamp"), timeout=60)
    requests = [
        r for r in stack.fake.requests if r.path.endswith("/guarded") or r.path.endswith("/guarded/eviction")
    ]
    evictions = [i for i, r in enumerate(requests) if r.method == "POST" and r.path.endswith("/eviction")]
    deletions = [i for i, r in enumerate(requests) if r.method == "DELETE"]
    assert evictions, "the bridge evicts; it deletes only once the budget held it back too long"
    assert deletions, [(r.method, r.path) for r in requests]
    assert deletions[0] > evictions[-1], "deleted only after the eviction was refused"
    # The budget refused every eviction: it never counted one (an eviction it allows is noted).
    pdb = stack.kube.get_object("poddisruptionbudgets.policy", "keep-one", stack.namespace) or {}
    assert not (pdb.get("status") or {}).get("disruptedPods"), pdb.get("status")
    reasons = [e["reason"] for e in in_order(stack.events("guarded"))]
    assert "SlurmJobCancelled" in reasons
    assert "DisruptionBudgetOverridden" in reasons
    assert reasons.index("SlurmJobCancelled") < reasons.index("DisruptionBudgetOverridden"), reasons
    assert (await stack.handle(created).result()).end_reason == "SlurmJobCancelled"


@ON_REAL_KUBE
async def test_a_pod_stuck_terminating_releases_its_job(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=1, deletion_slack=1)
    created = stack.create_pod("stranded")
    pod = await stack.wait_pod("stranded", bound)
    job_id = job_id_of(pod)
    assert job_id is not None

    # Deleted with a short grace period; no kubelet ever confirms.
    stack.kube.delete_object("pods", "stranded", stack.namespace, grace_period_seconds=1)
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


@ON_REAL_KUBE
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


@ON_REAL_KUBE
async def test_no_overlap_is_bounded_old_pods_that_never_stop_are_overridden(
    make_stack: StackFactory,
) -> None:
    """The old pod never stops (no kubelet confirms): the new pod is bound after grace + slack, warned."""
    grace, slack = 1, 2
    stack = await make_stack(nodes=1, deletion_slack=slack)
    create_pod(stack, "old", grace=grace)
    old_job = job_id_of(await stack.wait_pod("old", bound))
    assert old_job is not None
    stack.create_pod("new")
    await stack.wait_pod("new", job_id_of)  # pending behind the old job

    await stack.slurm.cancel_job(old_job)  # Slurm starts the new job on the same node at once
    await stack.wait_pod(
        "new", lambda p: (scheduled_condition(p) or {}).get("reason") == "WaitingForNode", timeout=60
    )
    waiting_since = time.monotonic()
    assert bound(stack.pod("new")) is None
    # The Event follows the condition (same step).
    waiting = await stack.kube.wait_for_async(
        lambda: [e for e in stack.events("new") if e["reason"] == "WaitingForNode"], 10
    )
    assert len(waiting) == 1, [(e["reason"], e["message"]) for e in stack.events("new")]
    assert waiting[0]["type"] == "Normal"
    assert f"{stack.namespace}/old" in waiting[0]["message"]
    assert f"(at most {grace + slack} s)" in waiting[0]["message"]

    # Nobody plays the kubelet: the old pod is evicted but never stops.
    new = await stack.wait_pod("new", bound, timeout=60)
    waited = time.monotonic() - waiting_since
    assert bound(new) == stack.partition.node_names[0]
    old = await stack.wait_pod("old", lambda p: bool(p and p["metadata"].get("deletionTimestamp")))
    assert bound(old) == bound(new)
    assert (old.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    # Not before the bound: the placement re-checks every LEAVING_POLL until grace + slack passed.
    assert waited >= grace + slack - 1, waited

    # The Event follows the binding (same step): waited for, not raced.
    await stack.kube.wait_for_async(lambda: any(e["reason"] == "Bound" for e in stack.events("new")), 10)
    events = in_order(stack.events("new"))
    reasons = [e["reason"] for e in events]
    assert reasons.index("WaitingForNode") < reasons.index("Bound"), reasons
    overridden = events[reasons.index("Bound")]
    assert overridden["type"] == "Warning"
    assert overridden["message"].startswith(f"Slurm job {job_id_of(new)} allocated ")
    assert overridden["message"].endswith(f"although {stack.namespace}/old had not stopped in time")
    assert (scheduled_condition(stack.pod("new")) or {}).get("status") == "True"

    stack.kube.set_pod_phase(stack.namespace, "new", "Succeeded")
    await stack.wait_pod("new", finished_cleanly)
    await stack.wait_pod("old", finished_cleanly)


@ON_REAL_KUBE
async def test_a_node_failure_evicts_the_pod_with_the_reason(make_stack: StackFactory) -> None:
    """An allocated node set DOWN: Slurm ends the job NODE_FAIL (external jobs are not requeued)."""
    stack = await make_stack(nodes=1)
    created = stack.create_pod("lost")
    job_id = job_id_of(await stack.wait_pod("lost", bound))
    assert job_id is not None
    node = stack.partition.node_names[0]  # this test's own node: the partition's cleanup deletes it

    stack.slurm_bed.scontrol("update", f"NodeName={node}", "State=DOWN", "Reason=node-failure-test")

    await stack.wait_pod("lost", lambda p: p is None or p["metadata"].get("deletionTimestamp"), timeout=60)
    job = (await stack.slurm.get_job(job_id)).model_dump(mode="json")
    assert "NODE_FAIL" in job["job_state"], job["job_state"]
    # Terminating (no kubelet confirms here): the bridge's reason is kept in a condition of its own.
    conditions = {c["type"]: c for c in (stack.pod("lost") or {}).get("status", {}).get("conditions", [])}
    ended = conditions[keys.CONDITION_SLURM_JOB_ENDED]
    assert (ended["status"], ended["reason"]) == ("True", "SlurmNodeFailure")
    assert ended["message"].startswith(f"Slurm job {job_id} lost its node in Slurm (NODE_FAIL")
    assert conditions["DisruptionTarget"]["reason"] == "EvictionByEvictionAPI"
    events = [e for e in stack.events("lost") if e["reason"] == "SlurmNodeFailure"]
    assert [e["type"] for e in events] == ["Warning"]
    assert events[0]["message"] == ended["message"]
    result = await stack.handle(created).result()
    assert (result.phase, result.end_reason) == ("Done", "SlurmNodeFailure")
