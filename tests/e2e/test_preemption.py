"""Preemption end to end on real Slurm: evicted with the reason, and no overlap on the node.

The test's partition (PriorityTier 1, PreemptMode CANCEL from the test bed's
`PreemptType=preempt/partition_prio`, `PreemptMode=CANCEL`) gets a sibling over the
same node with PriorityTier 10 and preemption off (docs/preemption.md). A pod that
asks for the high partition makes Slurm cancel the low job (PREEMPTED) and hand
its node over in the same scheduler pass; the bridge evicts the low pod with
reason PreemptedBySlurm and binds the high pod only once the low pod is gone.
"""

from collections.abc import Iterator
from typing import Any

import pytest

from bridge import keys
from tests.e2e.conftest import ON_REAL_KUBE, StackFactory
from tests.e2e.harness import Pod, Stack, bound, finished_cleanly, job_id_of

pytestmark = [pytest.mark.slurm, ON_REAL_KUBE]


def condition(pod: Pod | None, kind: str) -> dict[str, Any] | None:
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), None)


@pytest.fixture
def high_partition() -> Iterator[list[Stack]]:
    """The high-priority sibling of a stack's partition; removed after the test."""
    stacks: list[Stack] = []
    yield stacks
    for stack in stacks:
        stack.slurm_bed.scontrol_quiet("delete", f"PartitionName={stack.partition.name}-high")


async def test_a_preempted_pod_is_evicted_and_the_new_pod_waits_for_it(
    make_stack: StackFactory, high_partition: list[Stack]
) -> None:
    stack = await make_stack(nodes=1)
    high = f"{stack.partition.name}-high"
    stack.slurm_bed.scontrol(
        "create",
        f"PartitionName={high}",
        f"Nodes={stack.partition.nodes_expression}",
        "MaxTime=INFINITE",
        "State=UP",
        "PriorityTier=10",
        "PreemptMode=OFF",
    )
    high_partition.append(stack)

    stack.create_pod("low")
    low = await stack.wait_pod("low", bound)
    low_job = job_id_of(low)
    stack.create_pod("urgent", annotations={keys.SLURMJOB_PREFIX + "partition": high})

    # Slurm preempts at its next scheduler pass; the bridge evicts the low pod, saying why.
    evicted = await stack.wait_pod(
        "low", lambda p: bool(p and p["metadata"].get("deletionTimestamp")), timeout=60
    )
    assert (condition(evicted, keys.CONDITION_SLURM_JOB_ENDED) or {}).get("reason") == "PreemptedBySlurm"
    assert (condition(evicted, "DisruptionTarget") or {}).get("reason") == "EvictionByEvictionAPI"
    assert any(e["reason"] == "PreemptedBySlurm" for e in stack.events("low"))
    job = (await stack.slurm.get_job(low_job or 0)).model_dump(mode="json")
    assert "PREEMPTED" in job["job_state"]

    # The urgent job runs on the same node already, but its pod waits: no overlap.
    waiting = await stack.wait_pod(
        "urgent", lambda p: (condition(p, "PodScheduled") or {}).get("reason") == "WaitingForNode", timeout=60
    )
    assert bound(waiting) is None
    assert bound(stack.pod("low")) == bound(low)

    stack.kube.set_pod_phase(stack.namespace, "low", "Failed")  # its kubelet stopped it
    urgent = await stack.wait_pod("urgent", bound)
    assert bound(urgent) == bound(low)
    result = await stack.handle(low).result()
    assert (result.phase, result.end_reason) == ("Done", "PreemptedBySlurm")

    stack.kube.set_pod_phase(stack.namespace, "urgent", "Succeeded")
    await stack.wait_pod("urgent", finished_cleanly)
