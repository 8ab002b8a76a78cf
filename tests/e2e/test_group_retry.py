"""`slurm-bridge retry` of one pod of a group places the whole group, on real Slurm.

The CLI resolves the pod's group, lists the pods its failed placement claimed and
retries them together (worker/cli.py `retry`, worker/operations.py
`retry_placement(members=…)`): one job for the group, one binding per pod.
"""

import asyncio
import sys
from pathlib import Path

import pytest
from temporalio.client import WorkflowFailureError

from bridge import grouping, keys
from tests.e2e.conftest import StackFactory
from tests.e2e.harness import Pod, Stack, bound, finished_cleanly, job_id_of
from tests.e2e.test_groups import group_pod

pytestmark = pytest.mark.slurm
PODGROUPS = "podgroups.scheduling.x-k8s.io"
PARTITION = keys.SLURMJOB_PREFIX + "partition"


def rejected(pod: Pod | None) -> bool:
    conditions = (pod or {}).get("status", {}).get("conditions") or []
    return any(c["type"] == "PodScheduled" and c.get("reason") == "SlurmRejected" for c in conditions)


async def cli_retry(stack: Stack, pod: str) -> str:
    """The real `slurm-bridge retry namespace/pod`, as an operator runs it; its output."""
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("slurm-bridge")),
        "retry",
        f"{stack.namespace}/{pod}",
        "--temporal-address",
        stack.temporal.service_client.config.target_host,
        "--temporal-namespace",
        stack.temporal.namespace,
        "--temporal-task-queue",
        stack.settings.temporal_task_queue,
        "--kubeconfig",
        str(stack.kubeconfig),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return out.decode()


async def test_retry_of_one_pod_places_its_whole_pod_group_with_one_job(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=2)
    # A coscheduling PodGroup's job annotations are the PodGroup's: the typo is there.
    pod_group = stack.kube.create_object(
        PODGROUPS,
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {
                "name": "mpi",
                "namespace": stack.namespace,
                "annotations": {PARTITION: "no-such-partition"},
            },
            "spec": {"minMember": 2},
        },
    )
    names = ["mpi-0", "mpi-1"]
    for name in names:
        group_pod(stack, name, {grouping.LABEL_POD_GROUP: "mpi"})

    for name in names:  # Slurm refused the group's job: both pods are told, neither is held
        await stack.wait_pod(name, lambda p: rejected(p) and finished_cleanly(p))
    group_key = f"{stack.namespace}/podgroup/mpi/{pod_group['metadata']['uid']}"
    failed = stack.temporal.get_workflow_handle(f"placement/{stack.settings.installation_id}/{group_key}")
    with pytest.raises(WorkflowFailureError):
        await failed.result()
    assert not any(bound(stack.pod(n)) for n in names)
    assert await stack.partition_jobs() == []

    # The user fixes the PodGroup; the operator retries one of its pods.
    def fix(obj: Pod) -> None:
        obj["metadata"]["annotations"][PARTITION] = stack.partition.name

    stack.kube.update_object(PODGROUPS, "mpi", fix, stack.namespace)
    stack.fake.clear_requests()
    said = await cli_retry(stack, "mpi-0")
    assert f"placement of {stack.namespace}/mpi-0 started again" in said

    pods = [await stack.wait_pod(name, bound) for name in names]
    assert sorted(bound(p) or "" for p in pods) == sorted(stack.partition.node_names)
    [job_id] = {job_id_of(p) for p in pods}  # one job for the group
    [job] = await stack.partition_jobs()
    assert job["job_id"] == job_id
    assert job["admin_comment"] == f'{{"pods":["{stack.namespace}/mpi-0","{stack.namespace}/mpi-1"]}}'
    bindings = sorted(
        r.path for r in stack.fake.requests if r.method == "POST" and r.path.endswith("/binding")
    )
    assert bindings == [f"/api/v1/namespaces/{stack.namespace}/pods/{n}/binding" for n in names]

    for name in names:
        stack.kube.set_pod_phase(stack.namespace, name, "Succeeded")
    for name in names:
        await stack.wait_pod(name, finished_cleanly)
