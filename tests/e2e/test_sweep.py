"""The orphan sweep on real Slurm, real Temporal and a fake API server: heals, and what it never touches.

Every stack here has an installation id of its own: the Slurm test bed is shared
with other sessions, whose placements live in other Temporal servers, so a
sweep of a shared installation id would see their jobs as orphans.
"""

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Collection
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError

from bridge import keys
from bridge.models import PlacementState, admin_comment_for, workflow_id_of
from bridge.slurm_api import JobDescMsg
from bridge.slurm_api.v0044 import V0044JobInfo
from bridge.sweep import SweepRequest, SweepResult
from clients.slurm_client import SlurmClient
from testbed.kube_fake import FakeKubeServer
from testbed.slurm_bed import SlurmTestBed
from tests.e2e.conftest import ON_REAL_KUBE, StackFactory
from tests.e2e.harness import (
    Pod,
    Stack,
    bed_client,
    bed_settings,
    bound,
    finished_cleanly,
    job_id_of,
    make_pod,
    unique,
)
from worker.schedules import ensure_sweep_schedule
from workflows.placement import PlacementWorkflow
from workflows.sweep import SweepWorkflow

pytestmark = [pytest.mark.slurm, ON_REAL_KUBE]


def installation() -> str:
    return unique("sweep")


async def sweep(stack: Stack) -> SweepResult:
    """One sweep run on the stack's worker, as the schedule starts it."""
    s = stack.settings
    request = SweepRequest(
        installation=s.installation_id,
        scheduler_name=s.scheduler_name,
        deletion_slack_seconds=s.deletion_slack,
    )
    return await stack.temporal.execute_workflow(
        SweepWorkflow.run, request, id=unique("sweep-run"), task_queue=s.temporal_task_queue
    )


def claim(pod: Pod) -> str:
    return str(pod["metadata"]["annotations"][keys.ANNOTATION_PLACEMENT])


def placement(stack: Stack, pod: Pod) -> WorkflowHandle[PlacementWorkflow, PlacementState]:
    return stack.temporal.get_workflow_handle_for(PlacementWorkflow.run, workflow_id_of(claim(pod)))


async def placement_running(stack: Stack, pod: Pod) -> bool:
    return (await placement(stack, pod).describe()).status == WorkflowExecutionStatus.RUNNING


async def states(stack: Stack, job_id: int) -> list[str]:
    return list((await stack.slurm.get_job(job_id)).model_dump(mode="json")["job_state"])


def reasons(stack: Stack, name: str) -> list[str]:
    return [e["reason"] for e in stack.events(name)]


async def rebound(stack: Stack, name: str) -> None:
    """Until the adopted run has bound the pod again (accepting its binding): it follows the job from then on.

    Before that, a job that ends fails the new run as "ended before it started" (docs/operations.md,
    "The sweep"), so the tests end jobs only after it.
    """
    await stack.kube.wait_for_async(lambda: reasons(stack, name).count("Bound") >= 2, 20)


async def orphan(stack: Stack, name: str) -> tuple[Pod, int]:
    """A bound pod whose placement an operator terminated: the pod keeps its finalizer and its job."""
    pod = await stack.wait_pod(name, bound)
    job_id = job_id_of(pod)
    assert job_id is not None
    await placement(stack, pod).terminate("test: the placement is lost")
    return pod, job_id


def strip_finalizers(stack: Stack, name: str) -> None:
    def strip(pod: Pod) -> None:
        pod["metadata"]["finalizers"] = []

    if stack.pod(name) is not None:
        stack.kube.update_object("pods", name, strip, stack.namespace)


async def submit_held(
    slurm: SlurmClient, partition: str, comment: str | None, admin_comment: str | None
) -> int:
    """A held external job (it never starts), submitted as the bridge's Slurm user."""
    job: dict[str, Any] = {
        "name": "not-the-bridge",
        "flags": ["EXTERNAL_JOB"],
        "hold": True,
        "nodes": "1",
        "partition": partition,
        "current_working_directory": "/tmp",
    }
    for field, value in (("comment", comment), ("admin_comment", admin_comment)):
        if value is not None:
            job[field] = value
    return await slurm.submit_job(JobDescMsg.model_validate(job))


# -- healing ---------------------------------------------------------------------------------


async def test_a_bound_pod_whose_placement_was_terminated_is_adopted_and_followed_to_its_end(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(nodes=1, installation_id=installation())
    stack.create_pod("kept")
    pod, job_id = await orphan(stack, "kept")
    node = bound(pod)

    result = await sweep(stack)

    assert (result.adopted, result.cancelled, result.finalizers_dropped) == (1, 0, 0), result
    assert await placement_running(stack, pod)
    assert "SweepAdopted" in reasons(stack, "kept")
    kept = stack.pod("kept")
    assert bound(kept) == node
    assert job_id_of(kept) == job_id
    assert claim(kept or {}) == claim(pod)  # same workflow id, same generation
    # The new run took the job over: no second job was submitted, and it binds to the same node again.
    await rebound(stack, "kept")
    assert [j["job_id"] for j in await stack.partition_jobs()] == [job_id]

    # It now follows the pod: the pod finishes, the job is cancelled and the finalizer goes.
    stack.kube.set_pod_phase(stack.namespace, "kept", "Succeeded")
    await stack.wait_pod("kept", finished_cleanly)
    assert "CANCELLED" in await states(stack, job_id)
    state = await placement(stack, pod).result()
    assert state.phase == "Done"
    assert [h.phase for h in state.history] == ["Submitted", "Pending", "Bound", "Cleaning", "Done"]
    # A second sweep finds nothing left to do.
    again = await sweep(stack)
    assert (again.adopted, again.cancelled, again.finalizers_dropped, again.skipped) == (0, 0, 0, 0)


async def test_an_adopted_placement_hears_of_its_job_ending_after_a_worker_restart(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(nodes=1, installation_id=installation())
    stack.create_pod("restarted")
    pod = await stack.wait_pod("restarted", bound)
    job_id = job_id_of(pod)
    assert job_id is not None
    # The bind activity binds, then records its Event: stopping the worker between the two would
    # cancel it before the first "Bound" that `rebound` counts.
    await stack.kube.wait_for_async(lambda: "Bound" in reasons(stack, "restarted"), 20)
    # The outage: no worker while the placement is lost; the new worker's job watcher reads every job.
    await stack.stop_bridge()
    await placement(stack, pod).terminate("test: lost during the outage")
    bridge = await stack.start_bridge()
    await bridge.job_watcher.poll()
    await bridge.job_watcher.wait_idle()
    try:
        assert (await sweep(stack)).adopted == 1
        await rebound(stack, "restarted")
        await stack.slurm.cancel_job(job_id)  # what `scancel` does
        # The adopted run removes the pod, as for any job that ends under running pods.
        await stack.wait_pod("restarted", lambda p: p is None or p["metadata"].get("deletionTimestamp"), 20)
    finally:
        with contextlib.suppress(RPCError):
            await placement(stack, pod).terminate("test: clean-up")
        strip_finalizers(stack, "restarted")
        with contextlib.suppress(Exception):
            await stack.slurm.cancel_job(job_id)


async def test_a_job_whose_pod_vanished_is_cancelled(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=1, installation_id=installation())
    stack.create_pod("lost")
    _, job_id = await orphan(stack, "lost")
    # The pod goes for good, finalizer and all (force-deleted by someone).
    strip_finalizers(stack, "lost")
    stack.kube.delete_object("pods", "lost", stack.namespace, grace_period_seconds=0)
    await stack.wait_pod("lost", lambda p: p is None)

    result = await sweep(stack)

    assert (result.adopted, result.cancelled, result.finalizers_dropped) == (0, 1, 0), result
    assert "CANCELLED" in await states(stack, job_id)
    assert any(f"Slurm job {job_id}" in line for line in result.done)


async def test_the_finalizer_of_a_deleted_pod_whose_job_ended_is_dropped(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=1, installation_id=installation())
    stack.create_pod("ending")
    _, job_id = await orphan(stack, "ending")
    await stack.slurm.cancel_job(job_id)
    stack.kube.delete_object("pods", "ending", stack.namespace)  # the finalizer holds it
    assert (stack.pod("ending") or {}).get("metadata", {}).get("deletionTimestamp")

    result = await sweep(stack)

    assert (result.adopted, result.cancelled, result.finalizers_dropped) == (0, 0, 1), result
    await stack.wait_pod("ending", finished_cleanly)  # Terminating until a kubelet confirms; not ours
    assert "SweepRemovedFinalizer" in reasons(stack, "ending")


async def test_a_deleted_pod_that_never_had_a_job_loses_its_finalizer(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=1, installation_id=installation())
    # Claimed, then the placement was terminated before it submitted anything.
    never = make_pod(stack.namespace, "never")
    never["metadata"]["finalizers"] = [keys.FINALIZER]
    never["metadata"]["annotations"] = {
        keys.ANNOTATION_PLACEMENT: f"placement/{stack.settings.installation_id}/{stack.namespace}/never/x@x"
    }
    stack.kube.create_object("pods", never)
    stack.kube.delete_object("pods", "never", stack.namespace)

    result = await sweep(stack)

    assert (result.adopted, result.cancelled, result.finalizers_dropped) == (0, 0, 1), result
    await stack.wait_pod("never", lambda p: p is None)


async def test_a_bound_pod_deleted_without_a_placement_releases_its_job_then_its_finalizer(
    make_stack: StackFactory,
) -> None:
    # No grace period and no slack: the pod is past both as soon as it is deleted.
    stack = await make_stack(nodes=1, installation_id=installation(), deletion_slack=0)
    quick = make_pod(stack.namespace, "quick")
    quick["spec"]["terminationGracePeriodSeconds"] = 0
    stack.kube.create_object("pods", quick)
    _, job_id = await orphan(stack, "quick")
    stack.kube.delete_object("pods", "quick", stack.namespace)

    result = await sweep(stack)

    assert (result.adopted, result.cancelled, result.finalizers_dropped) == (0, 1, 1), result
    assert "CANCELLED" in await states(stack, job_id)
    await stack.wait_pod("quick", lambda p: p is None)
    assert {"SweepCancelledJob", "SweepRemovedFinalizer"} <= set(reasons(stack, "quick"))


# -- what the sweep never touches --------------------------------------------------------------


async def test_foreign_jobs_other_installations_jobs_and_running_placements_are_left_alone(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(nodes=2, installation_id=installation())
    stack.create_pod("healthy")
    healthy = await stack.wait_pod("healthy", bound)
    partition, ns = stack.partition.name, stack.namespace
    ghost = admin_comment_for([f"{ns}/ghost"])  # a pod that exists nowhere
    ours = f"placement/{stack.settings.installation_id}/{ns}/ghost/x@x"
    held = {
        # Jobs the bridge did not make, in its partition: a plain one, and one with a bridge-like
        # admin_comment (as upstream slurm-bridge would count) but no placement comment.
        "foreign": await submit_held(stack.slurm, partition, None, None),
        "foreign with pods": await submit_held(stack.slurm, partition, "batch", ghost),
        # This installation's comment, but no bridge admin_comment: not the bridge's either.
        "lookalike": await submit_held(stack.slurm, partition, ours, '{"note": "by hand"}'),
        # Another installation's job, whose placement runs nowhere and whose pod is gone.
        "other installation": await submit_held(
            stack.slurm, partition, f"placement/{installation()}/{ns}/ghost/x@x", ghost
        ),
        # A `placement/` comment with neither installation nor generation: no placement id.
        "no placement id": await submit_held(stack.slurm, partition, f"placement/{ns}/ghost/x", ghost),
    }
    try:
        result = await sweep(stack)

        assert (result.adopted, result.cancelled, result.finalizers_dropped) == (0, 0, 0), result
        assert result.others >= 1
        assert result.listings == 1
        now = stack.slurm_bed.job_states(held.values())
        assert {what: now[job_id] for what, job_id in held.items()} == dict.fromkeys(held, ("PENDING",))
        assert await placement_running(stack, healthy)
        assert await states(stack, job_id_of(healthy) or 0) == ["RUNNING"]
        assert not any(r.startswith("Sweep") for r in reasons(stack, "healthy"))
    finally:
        for job_id in held.values():
            await stack.slurm.cancel_job(job_id)
    stack.kube.set_pod_phase(ns, "healthy", "Succeeded")
    await stack.wait_pod("healthy", finished_cleanly)


class RecordingSlurm(SlurmClient):
    """A Slurm client that remembers which jobs it was asked about."""

    def __init__(self, bed: SlurmTestBed) -> None:
        super().__init__(bed.rest_url, user_name=bed.user_name, token_file=bed.jwt_file)
        self.asked: list[int] = []
        self.probes = 0
        self._changed = asyncio.Condition()

    async def job_states(self, job_ids: Collection[int], *, chunk_size: int = 500) -> dict[int, list[str]]:
        self.asked += job_ids
        async with self._changed:
            self.probes += 1
            self._changed.notify_all()
        return await super().job_states(job_ids, chunk_size=chunk_size)

    async def get_job(self, job_id: int) -> V0044JobInfo:
        self.asked.append(job_id)
        return await super().get_job(job_id)

    async def wait_probes(self, count: int) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: self.probes >= count), 10)


@contextlib.asynccontextmanager
async def second_installation(
    first: Stack, temporal: Client, bed: SlurmTestBed, tmp_path: Path
) -> AsyncIterator[Stack]:
    """Another bridge (own cluster, task queue and installation id) on the first one's Slurm partition."""
    kube = FakeKubeServer().start()
    for name in first.partition.node_names:
        kube.create_node(name, cpu=str(first.partition.cpus), memory=f"{first.partition.memory_mb}Mi")
    kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig-second-installation")
    settings = bed_settings(
        bed, kubeconfig, f"tq-{uuid.uuid4()}", partition=first.partition.name, installation_id=installation()
    )
    stack = Stack(kube, temporal, bed_client(bed), bed, first.partition, settings, kubeconfig)
    await stack.start_bridge()
    try:
        yield stack
    finally:
        await stack.stop_bridge()
        await stack.slurm.close()
        kube.stop()


async def test_two_installations_on_one_partition_never_touch_each_others_jobs(
    make_stack: StackFactory, temporal_client: Client, slurm_bed: SlurmTestBed, tmp_path: Path
) -> None:
    a = await make_stack(nodes=2, installation_id=installation())
    async with second_installation(a, temporal_client, slurm_bed, tmp_path) as b:
        # Same namespace, same pod name: the two jobs' admin_comments are identical.
        for stack in (a, b):
            stack.create_pod("twin")
        a_pod, b_pod = await a.wait_pod("twin", bound), await b.wait_pod("twin", bound)
        a_job, b_job = job_id_of(a_pod), job_id_of(b_pod)
        assert a_job is not None
        assert b_job is not None
        assert bound(a_pod) != bound(b_pod)
        jobs = {j["job_id"]: j for j in await a.partition_jobs()}
        assert jobs[a_job]["comment"] == claim(a_pod)
        assert jobs[b_job]["comment"] == claim(b_pod)
        assert claim(a_pod).startswith(f"placement/{a.settings.installation_id}/")
        assert claim(b_pod).startswith(f"placement/{b.settings.installation_id}/")
        assert jobs[a_job]["admin_comment"] == jobs[b_job]["admin_comment"]

        # A's job watcher, even told of B's job (as if it had seen a pod of B's), never asks about it.
        assert a.bridge is not None
        recorder = RecordingSlurm(slurm_bed)
        a.bridge.job_watcher.slurm = recorder
        a.bridge.live_jobs.track(b_job, claim(b_pod))
        try:
            await recorder.wait_probes(3)
        finally:
            a.bridge.job_watcher.slurm = a.slurm
            await recorder.close()
        assert a_job in recorder.asked
        assert b_job not in recorder.asked

        # Both placements are lost: each sweep adopts its own pod and leaves the other's job alone,
        # although the other's job names a pod of the same name that its own cluster has.
        await placement(a, a_pod).terminate("test: lost")
        await placement(b, b_pod).terminate("test: lost")
        a_result = await sweep(a)
        assert (a_result.adopted, a_result.cancelled, a_result.finalizers_dropped) == (1, 0, 0), a_result
        assert a_result.others >= 1
        assert await states(a, b_job) == ["RUNNING"]
        assert not await placement_running(b, b_pod)
        b_result = await sweep(b)
        assert (b_result.adopted, b_result.cancelled, b_result.finalizers_dropped) == (1, 0, 0), b_result
        await rebound(a, "twin")
        await rebound(b, "twin")

        # B's job ends: B's pod goes; A's pod, job and placement are untouched.
        await b.slurm.cancel_job(b_job)
        await b.wait_pod("twin", lambda p: p is None or p["metadata"].get("deletionTimestamp"), 20)
        await b.wait_pod("twin", finished_cleanly)
        assert await states(a, a_job) == ["RUNNING"]
        assert bound(a.pod("twin")) == bound(a_pod)
        assert await placement_running(a, a_pod)

        # A's pod finishes: A's job goes; nothing of B's is left to touch.
        a.kube.set_pod_phase(a.namespace, "twin", "Succeeded")
        await a.wait_pod("twin", finished_cleanly)
        assert "CANCELLED" in await states(a, a_job)


# -- the schedule --------------------------------------------------------------------------------


async def test_the_schedule_runs_the_sweep_and_interval_zero_removes_it(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=1, installation_id=installation())
    never = make_pod(stack.namespace, "scheduled")
    never["metadata"]["finalizers"] = [keys.FINALIZER]
    never["metadata"]["annotations"] = {
        keys.ANNOTATION_PLACEMENT: f"placement/{stack.settings.installation_id}/{stack.namespace}/s/x@x"
    }
    stack.kube.create_object("pods", never)
    stack.kube.delete_object("pods", "scheduled", stack.namespace)

    created = datetime.now(UTC)
    handle = await ensure_sweep_schedule(stack.temporal, stack.settings)
    assert handle is not None
    try:
        assert handle.id == f"sweep/{stack.settings.installation_id}"
        # The first run is one interval away at least, whatever the clock says: a worker that only
        # ran for a moment never sweeps.
        interval = timedelta(seconds=stack.settings.sweep_interval)
        [first, *_] = (await handle.describe()).info.next_action_times
        assert first >= created + interval - timedelta(seconds=1)
        await handle.trigger()
        await stack.wait_pod("scheduled", lambda p: p is None, 30)
        # A restart with the same settings updates it in place and keeps its start.
        assert (await ensure_sweep_schedule(stack.temporal, stack.settings)) is not None
        assert (await handle.describe()).info.next_action_times[0] == first
    finally:
        off = stack.settings.model_copy(update={"sweep_interval": 0})
        assert await ensure_sweep_schedule(stack.temporal, off) is None
    with pytest.raises(RPCError):
        await handle.describe()
    await ensure_sweep_schedule(stack.temporal, off)  # already gone: fine
