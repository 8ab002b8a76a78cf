"""Slinky slurm-operator interop on real Slurm: a slurmd node is never registered over or removed.

The operator runs `slurmd -Z` in a pod and labels the pod's Kubernetes node
`slinky.slurm.net/slurm-nodename=<Slurm node>`. No slurmd runs on the test bed, so
its Slurm node is made the nearest way (`SlurmTestBed.create_slurmd_node`):
`scontrol create State=CLOUD`, a dynamic (DYNAMIC_NORM), non-external node, as a
`slurmd -Z` registration leaves, plus CLOUD+POWERED_DOWN. A whole Bridge (Temporal
Schedule, node watcher, placement) runs against it; the Kubernetes side is the fake
API server (tests/unit/test_slurm_operator_layout.py emulates the rest of the
operator's layout there).
"""

import pytest

from bridge import keys
from bridge.node_actions import SLURMD_NODE, ownership_comment
from testbed.slurm_bed import ENDED_STATES, SlurmTestBed
from tests.e2e.conftest import MakeNodes
from tests.e2e.harness import bound, finished_cleanly, job_id_of, make_pod, wait_job_state
from tests.e2e.node_fixtures import Json

pytestmark = pytest.mark.slurm

NAMESPACE = "slurm-jobs"


def slurmd_node(bed: SlurmTestBed, name: str) -> Json:
    """The node as slurmctld has it; it must still be there, dynamic, not external."""
    node = bed.node(name)
    assert node is not None, f"Slurm node {name} was deleted"
    assert "DYNAMIC_NORM" in node["state"], node["state"]
    assert "EXTERNAL" not in node["state"], node["state"]
    return node


def untouched_by_sync(lines: list[str], slurm_name: str) -> bool:
    """No registration, update or deletion of that Slurm node was planned."""
    verbs = ("register", "update", "delete")
    return not any(line.startswith(f"{verb} Slurm node {slurm_name}") for verb in verbs for line in lines)


async def test_a_slurmd_node_is_tainted_and_drain_mirrored_never_registered_over_or_removed(
    make_nodes: MakeNodes,
) -> None:
    stack = await make_nodes(kubelet=True)  # runs bound pods, ends deleted ones
    bed = stack.bed
    scheduler = stack.settings.scheduler_name
    partition = stack.make_partition()  # an existing partition the external-node label could name
    slurm_name = stack.name("slurm-worker-0")  # the slurmd pod's hostname
    # The operator's label, plus the bridge's own external-node label: the first must win.
    kube_name = stack.add_node(
        "kn",
        labels={keys.LABEL_SLURM_NODE_NAME: slurm_name, keys.LABEL_EXTERNAL_NODE: "true"},
        annotations={keys.ANNOTATION_EXTERNAL_NODE_PARTITIONS: partition.name},
    )

    # slurmd has not registered yet: no external node is registered in its place.
    result = await stack.sync()
    assert result.failed == []
    assert untouched_by_sync(result.applied, slurm_name)
    assert bed.node(slurm_name) is None
    assert SLURMD_NODE in [e["reason"] for e in stack.events(kube_name)]
    assert not stack.tainted(kube_name)

    # slurmd registers (emulated): the Kubernetes node is tainted, the Slurm node left as it is.
    bed.create_slurmd_node(slurm_name)
    before = slurmd_node(bed, slurm_name)
    result = await stack.sync()
    assert result.failed == []
    assert f"taint Kubernetes node {kube_name}" in result.applied
    assert untouched_by_sync(result.planned, slurm_name)
    assert stack.tainted(kube_name)
    after = slurmd_node(bed, slurm_name)
    assert (after["state"], after["comment"], after["reason"]) == (before["state"], "", "")
    assert untouched_by_sync((await stack.sync()).planned, slurm_name)  # in step: nothing more

    # Cordoned: the drain is mirrored with the bridge's reason; uncordoned: lifted.
    stack.cordon(kube_name)
    result = await stack.sync()
    assert untouched_by_sync(result.planned, slurm_name)
    drained = slurmd_node(bed, slurm_name)
    assert "DRAIN" in drained["state"]
    assert drained["reason"] == f"{keys.DRAIN_REASON_PREFIX}Kubernetes node {kube_name} is cordoned"
    stack.cordon(kube_name, False)
    await stack.sync()
    assert "DRAIN" not in slurmd_node(bed, slurm_name)["state"]

    # A pod the bridge places on that Slurm node is bound to the labelled Kubernetes node.
    # (No slurmd: the job stays RUNNING+CONFIGURING, waiting for the node to power up, which
    # the bridge takes as running.)
    pod_partition = stack.job_partition(slurm_name)
    annotations = {f"{keys.SLURMJOB_PREFIX}partition": pod_partition}
    stack.kube.create_object("pods", make_pod(NAMESPACE, "p", annotations=annotations, scheduler=scheduler))
    pod = await stack.kube.wait_for_async(lambda: bound(stack.kube.get_object("pods", "p", NAMESPACE)), 30)
    assert pod == kube_name
    placed = stack.kube.get_object("pods", "p", NAMESPACE) or {}
    job_id = job_id_of(placed)
    assert job_id is not None
    stack.jobs.append(job_id)
    assert placed["metadata"]["annotations"][keys.ANNOTATION_SLURM_NODE] == kube_name  # the Kubernetes node
    job = (await stack.slurm.get_job(job_id)).model_dump(mode="json")
    assert job["nodes"] == slurm_name
    # Ended from the Slurm side (what `scancel` does). Deleting the pod instead left the job
    # RUNNING+CONFIGURING and the finalizer on for 30 s here (see docs/slurm-operator.md).
    await stack.slurm.cancel_job(job_id)
    await stack.kube.wait_for_async(
        lambda: finished_cleanly(stack.kube.get_object("pods", "p", NAMESPACE)), 30
    )
    await wait_job_state(stack.slurm, job_id, ENDED_STATES.intersection, timeout=15)

    # Even with a comment saying this bridge registered it, the node is not removed when the
    # Kubernetes node loses its labels or is gone: only EXTERNAL nodes of ours ever are.
    comment = ownership_comment(scheduler, kube_name, stack.settings.installation_id)
    response = bed.rest("POST", f"/node/{slurm_name}", {"comment": comment})
    assert response.status_code == 200, response.text
    stack.edit_node(kube_name, lambda n: n["metadata"]["labels"].clear())
    result = await stack.sync()
    assert untouched_by_sync(result.planned, slurm_name)
    assert not any(line.startswith(f"drain Slurm node {slurm_name}") for line in result.planned)
    stack.kube.delete_object("nodes", kube_name)
    result = await stack.sync()
    assert untouched_by_sync(result.planned, slurm_name)
    kept = slurmd_node(bed, slurm_name)
    assert "DRAIN" not in kept["state"]
    assert kept["comment"] == comment
