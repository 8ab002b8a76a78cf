"""An unreliable Kubernetes API: every placement still completes, once.

The fake API server answers 10 % of the bridge's requests (reads, writes,
bindings, events, lists and watches alike) with a failure, without applying
them: 500 or 429 for reads (an API server never answers a read with 409), 500,
429 or 409 for writes; and it keeps breaking off every open watch stream. Twenty single pods and
two pod groups go through it: each must be placed by exactly one Slurm job,
run, finish and be released, and every placement must complete.
"""

import asyncio
import collections
import contextlib
import time

import pytest
from temporalio.client import WorkflowExecutionStatus

from bridge import grouping, keys
from bridge.models import workflow_id_of
from testbed.kube_fake import RUN_SECONDS
from tests.e2e.conftest import StackFactory
from tests.e2e.harness import Pod, Stack, make_pod

pytestmark = pytest.mark.slurm

READ_FAULTS = (500, 429)
WRITE_FAULTS = (500, 429, 409)
WRITES = ("POST", "PUT", "PATCH", "DELETE")
FAULT_FRACTION = 0.10
WATCH_DROP_EVERY = 1.5  # seconds between breaks of every open watch stream
SOLO_PODS = 20
GROUPS, GROUP_SIZE = 2, 2


def finished(pod: Pod) -> bool:
    """Ran to the end and let go of: Succeeded, the bridge's finalizer gone."""
    return pod.get("status", {}).get("phase") == "Succeeded" and keys.FINALIZER not in (
        pod["metadata"].get("finalizers") or []
    )


async def unfinished(stack: Stack, names: list[str]) -> list[tuple[str, object, object, object]]:
    """Pods not finished, with their phase, finalizers and placement state: what a failure shows."""
    found = []
    for name in names:
        pod = stack.pod(name)
        if pod is not None and finished(pod):
            continue
        meta = (pod or {}).get("metadata") or {}
        claim = (meta.get("annotations") or {}).get(keys.ANNOTATION_PLACEMENT)
        state: object = None
        if claim:
            try:
                handle = stack.temporal.get_workflow_handle(workflow_id_of(claim))
                state = (await handle.describe()).status, await handle.query("current_state")
            except Exception as error:  # the report must not hide the timeout
                state = error
        found.append((name, (pod or {}).get("status", {}).get("phase"), meta.get("finalizers"), state))
    return found


async def drop_watches_periodically(stack: Stack, drops: list[int]) -> None:
    # The cadence of the fault itself, not a wait for an event.
    while True:
        await asyncio.sleep(WATCH_DROP_EVERY)
        if stack.fake.active_watches:
            drops.append(stack.fake.active_watches)
        stack.fake.drop_watches()


def create_group(stack: Stack, name: str) -> list[str]:
    stack.kube.create_object(
        "podgroups.scheduling.x-k8s.io",
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": name, "namespace": stack.namespace},
            "spec": {"minMember": GROUP_SIZE},
        },
    )
    names = [f"{name}-{i}" for i in range(GROUP_SIZE)]
    for pod_name in names:
        pod = make_pod(stack.namespace, pod_name, annotations={RUN_SECONDS: "1"})
        pod["metadata"]["labels"] = {grouping.LABEL_POD_GROUP: name}
        stack.kube.create_object("pods", pod)
    return names


async def test_every_placement_completes_once_through_api_faults_and_dropped_watches(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(nodes=4, cpus=4, kubelet=True)
    stack.fake.fail_randomly("GET", r"^/api", READ_FAULTS, FAULT_FRACTION, seed=10)
    for seed, method in enumerate(WRITES, 11):
        stack.fake.fail_randomly(method, r"^/api", WRITE_FAULTS, FAULT_FRACTION, seed=seed)
    drops: list[int] = []
    dropper = asyncio.create_task(drop_watches_periodically(stack, drops))
    try:
        names = [name for g in range(GROUPS) for name in create_group(stack, f"gang{g}")]
        for i in range(SOLO_PODS):
            name = f"solo-{i:02d}"
            stack.create_pod(name, annotations={RUN_SECONDS: "1"})
            names.append(name)

        def all_finished() -> bool:
            pods = [stack.pod(name) for name in names]
            return all(pod is not None and finished(pod) for pod in pods)

        started = time.monotonic()
        try:
            await stack.kube.wait_for_async(all_finished, 120)
        except TimeoutError:
            raise AssertionError(f"not finished: {await unfinished(stack, names)}") from None
        print(f"all finished after {time.monotonic() - started:.1f} s")
    finally:
        dropper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await dropper
        injected = stack.fake.stop_random_failures()

    # The faults really happened, of every kind.
    assert set(injected) == set(WRITE_FAULTS), injected
    assert sum(injected.values()) >= 20, injected
    assert len(drops) >= 3, drops
    print(
        f"{len(stack.fake.requests)} requests, injected failures {injected},"
        f" watch drops {len(drops)} ({sum(drops)} streams)"
    )

    pods = [stack.pod(name) for name in names]
    # A claim is "<workflow id>@<generation>", as the comment of the placement's Slurm job.
    claims = {str(pod["metadata"]["annotations"][keys.ANNOTATION_PLACEMENT]) for pod in pods if pod}
    assert len(claims) == SOLO_PODS + GROUPS  # one placement per single pod, one per group

    # Exactly one Slurm job per placement, none still holding nodes (counted by Slurm itself).
    jobs = stack.slurm_bed.jobs_in_partition(stack.partition.name)
    per_placement = collections.Counter(job.comment for job in jobs)
    assert per_placement == dict.fromkeys(claims, 1), (sorted(per_placement.items()), sorted(claims))
    assert [job for job in jobs if not job.ended] == []

    # Every placement completes. Dropping the finalizer is the release activity's last
    # step and the workflow closes only after that activity reports back, so a pod can
    # look finished a moment before its placement is: wait for the close, bounded.
    for claim in claims:
        handle = stack.temporal.get_workflow_handle(workflow_id_of(claim))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(handle.result(), 30)
        description = await handle.describe()
        assert description.status == WorkflowExecutionStatus.COMPLETED, (claim, description.status)
