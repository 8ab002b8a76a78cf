"""A pod placed by real Slurm 26.05, end to end, through every real wire.

Real: Temporal dev server, slurmctld + slurmrestd (JWT), the `kubernetes`
client over HTTP. Simulated: the Kubernetes API server (testbed/kube_fake),
whose role as kubelet the tests play by setting pod phases.
"""

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from temporalio.client import WorkflowFailureError, WorkflowHistory
from temporalio.common import TypedSearchAttributes
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from bridge import keys
from bridge import search_attributes as sa
from bridge.slurm_api import API_VERSIONS
from bridge.tolerations import managed_node_toleration
from clients.slurm_client import SlurmClient
from testbed.history_cost import history_cost
from testbed.waiting import until
from tests.e2e.conftest import ON_REAL_KUBE, StackFactory
from tests.e2e.harness import Pod, Stack, bound, finished_cleanly, job_id_of, make_pod, slurm_bridge
from worker.main import unsandboxed_runner
from worker.operations import RetryRefused, retry_placement
from workflows.placement import PlacementWorkflow

pytestmark = pytest.mark.slurm
GOLDEN_HISTORY = Path(__file__).parent.parent / "histories" / "placement-bound-done.json"
GOLDEN_BUSY_HISTORY = Path(__file__).parent.parent / "histories" / "placement-slurm-busy.json"


def scheduled_condition(pod: Pod | None) -> dict[str, Any] | None:
    for condition in (pod or {}).get("status", {}).get("conditions") or []:
        if condition["type"] == "PodScheduled":
            return dict(condition)
    return None


async def replay_and_record(history: WorkflowHistory, golden: Path) -> None:
    """The run replays with the code that made it (sandboxed, as the tests run the placement);
    with SLURM_BRIDGE_RECORD_HISTORY=1 it becomes the golden history `golden`."""
    replayer = Replayer(
        workflows=[PlacementWorkflow],
        data_converter=pydantic_data_converter,
        unsandboxed_workflow_runner=unsandboxed_runner(sandbox_every_workflow=True),
    )
    await replayer.replay_workflow(history)
    if os.environ.get("SLURM_BRIDGE_RECORD_HISTORY"):
        await asyncio.to_thread(golden.write_text, history.to_json())


async def job_states(stack: Stack, job_id: int) -> list[str]:
    job = (await stack.slurm.get_job(job_id)).model_dump(mode="json")
    return list(job["job_state"])


@pytest.mark.parametrize("api_version", API_VERSIONS)  # SLURM_API_VERSION: both, on the same slurmrestd
async def test_pod_is_bound_to_the_node_slurm_allocated_and_job_ends_with_the_pod(
    make_stack: StackFactory, api_version: str
) -> None:
    stack = await make_stack(nodes=2, slurm_api_version=api_version)
    assert stack.bridge is not None
    assert stack.bridge.slurm.api_version == stack.slurm.api_version == api_version
    stack.fake.clear_requests()  # what the bridge's start listed is not this placement's
    created = stack.create_pod("trainer", cpu="2", memory="1Gi")

    pod = await stack.wait_pod("trainer", bound)
    job_id = job_id_of(pod)
    assert job_id is not None
    job = (await stack.slurm.get_job(job_id)).model_dump(mode="json")
    allocated = [n["name"] for n in job["job_resources"]["nodes"]["allocation"]]
    assert job["job_state"] == ["RUNNING"]
    assert bound(pod) == allocated[0]
    assert pod["metadata"]["annotations"][keys.ANNOTATION_SLURM_NODE] == allocated[0]
    assert keys.FINALIZER in pod["metadata"]["finalizers"]
    # What was submitted: the pod's resources, exclusive, our partition, our keys.
    assert job["admin_comment"] == f'{{"pods":["{stack.namespace}/trainer"]}}'
    assert job["partition"] == stack.partition.name
    assert "EXTERNAL_JOB" in job["flags"]
    assert job["mcs_label"] == "kubernetes"

    stack.kube.set_pod_phase(stack.namespace, "trainer", "Running")
    stack.kube.set_pod_phase(stack.namespace, "trainer", "Succeeded")
    await stack.wait_pod("trainer", finished_cleanly)
    assert "CANCELLED" in await job_states(stack, job_id)

    result = await stack.handle(created).result()
    assert result.phase == "Done"
    assert [h.phase for h in result.history] == ["Submitted", "Pending", "Bound", "Cleaning", "Done"]

    # The run replays deterministically with the code that made it; set
    # SLURM_BRIDGE_RECORD_HISTORY=1 to refresh the golden history that guards upgrades.
    history = await stack.handle(created).fetch_history()
    # The per-placement budget of docs/performance.md: a count, not a timing.
    cost = history_cost(history.events)
    assert cost.billable_actions <= 8, cost.actions
    assert cost.events <= 40, cost.events
    assert set(cost.activities) == {"prepare_and_submit", "bind", "release"}
    # The bridge's nodes came from the watched cache: no node listing for this placement.
    assert stack.bridge is not None
    assert (stack.bridge.node_cache.reads, stack.bridge.node_cache.listings) == (2, 0)  # submit, bind
    # ... and its Kubernetes requests keep to docs/performance.md's budget: pod PATCH 4, pod GET 3,
    # Events 3, binding 1, and 1 listing of the pods on the allocated node. (The watchers' own
    # cluster-wide listings, e.g. the node watcher's refresh after start, are not the placement's.)
    made = [
        (r.method, r.path, r.query.get("fieldSelector", ""))
        for r in stack.fake.requests
        if r.query.get("watch") != "true"
        and (
            f"/namespaces/{stack.namespace}/" in r.path
            or r.query.get("fieldSelector") == f"spec.nodeName={bound(pod)}"
        )
    ]
    assert len(made) <= 12, made
    await replay_and_record(history, GOLDEN_HISTORY)


@ON_REAL_KUBE
async def test_second_pod_waits_for_resources_then_takes_the_freed_node(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=1)
    stack.create_pod("first")
    first = await stack.wait_pod("first", bound)

    stack.create_pod("second")
    pod = await stack.wait_pod(
        "second", lambda p: (scheduled_condition(p) or {}).get("reason") == "Resources"
    )
    waiting = scheduled_condition(pod) or {}
    assert waiting["status"] == "False"
    assert "pending: Resources" in waiting["message"]
    assert bound(stack.pod("second")) is None
    await stack.kube.wait_for_async(
        lambda: any(e["reason"] == "SlurmJobPending" for e in stack.events("second"))
    )

    stack.kube.set_pod_phase(stack.namespace, "first", "Succeeded")
    second = await stack.wait_pod("second", bound)
    assert bound(second) == bound(first)

    stack.kube.set_pod_phase(stack.namespace, "second", "Failed")
    await stack.wait_pod("first", finished_cleanly)
    await stack.wait_pod("second", finished_cleanly)


async def test_cancelled_job_removes_the_pod_with_an_event(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=1)
    created = stack.create_pod("victim")
    pod = await stack.wait_pod("victim", bound)
    job_id = job_id_of(pod)
    assert job_id is not None

    await stack.slurm.cancel_job(job_id)  # what `scancel` does

    await stack.wait_pod("victim", lambda p: p is None or p["metadata"].get("deletionTimestamp"))
    events = [e for e in stack.events("victim") if e["reason"] == "SlurmJobCancelled"]
    assert events, "the pod got no event saying why it was evicted"
    assert events[0]["message"].startswith(f"Slurm job {job_id} cancelled in Slurm (CANCELLED")
    # Evicted through the Eviction API (grace period and budgets honoured), the reason kept on the pod.
    assert any(r.method == "POST" and r.path.endswith("/victim/eviction") for r in stack.fake.requests)
    # Terminating (no kubelet confirms here): the bridge's reason survives the eviction's own condition.
    conditions = {c["type"]: c for c in (stack.pod("victim") or {}).get("status", {}).get("conditions", [])}
    assert conditions["SlurmJobEnded"]["reason"] == "SlurmJobCancelled"
    assert conditions["DisruptionTarget"]["reason"] == "EvictionByEvictionAPI"
    result = await stack.handle(created).result()
    assert (result.phase, result.end_reason) == ("Done", "SlurmJobCancelled")
    status = await slurm_bridge(stack, "status", f"{stack.namespace}/victim", "--json")
    assert status["end_reason"] == "SlurmJobCancelled"


@ON_REAL_KUBE
async def test_rejected_job_is_visible_on_the_pod_and_retry_after_fix_places_it(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(nodes=1)
    created = stack.create_pod("typo", annotations={keys.SLURMJOB_PREFIX + "partition": "no-such-partition"})

    await stack.wait_pod("typo", lambda p: (scheduled_condition(p) or {}).get("reason") == "SlurmRejected")
    with pytest.raises(WorkflowFailureError) as failure:
        await stack.handle(created).result()
    message = str(failure.value.cause)
    assert "Slurm rejected the job" in message
    condition = scheduled_condition(stack.pod("typo"))
    assert condition is not None
    assert condition["status"] == "False"
    assert condition["reason"] == "SlurmRejected"
    assert "partition" in condition["message"].lower()
    assert any(e["reason"] == "SlurmRejected" for e in stack.events("typo") if e["type"] == "Warning")
    assert finished_cleanly(stack.pod("typo"))  # the finalizer is gone: the user may delete the pod freely
    assert bound(stack.pod("typo")) is None

    # What an operator sees.
    status = await slurm_bridge(stack, "status", f"{stack.namespace}/typo", "--json")
    assert status["phase"] == "Failed"
    assert status["workflow_status"] == "FAILED"
    assert "Slurm rejected the job" in status["failure"]
    failed = await slurm_bridge(stack, "list", "--phase", "Failed", "--namespace", stack.namespace, "--json")
    assert [p["pod"] for p in failed] == [f"{stack.namespace}/typo"]

    # The user fixes the annotation; the operator retries.
    def fix(pod: Pod) -> None:
        pod["metadata"]["annotations"][keys.SLURMJOB_PREFIX + "partition"] = stack.partition.name

    stack.kube.update_object("pods", "typo", fix, stack.namespace)
    await retry_placement(stack.temporal, stack.pod("typo") or {}, stack.settings.temporal_task_queue)
    with pytest.raises(RetryRefused, match="still running"):
        await retry_placement(stack.temporal, stack.pod("typo") or {}, stack.settings.temporal_task_queue)
    await stack.wait_pod("typo", bound)

    stack.kube.set_pod_phase(stack.namespace, "typo", "Succeeded")
    await stack.wait_pod("typo", finished_cleanly)


class FullQueue(httpx.AsyncBaseTransport):
    """The bridge's way to the real slurmrestd, except that the next `refusals` submissions get
    the answer slurmrestd 26.05 gave on the test bed at MaxJobCount (recorded 2026-11-27 with a
    limit of the jobs it held plus three: the fourth submission). Filling the shared test bed's
    queue for real would turn away every other test's jobs too."""

    ANSWER: ClassVar[dict[str, Any]] = {
        "errors": [
            {
                "description": "Batch job submission failed",
                "error_number": 2007,
                "error": "MaxJobCount limit reached",
                "source": "slurm_submit_batch_job()",
            }
        ],
        "warnings": [],
    }

    def __init__(self, refusals: int) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.refusals = refusals
        self.submissions = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path.endswith("/job/submit"):
            self.submissions += 1
            if self.submissions <= self.refusals:
                return httpx.Response(422, json=self.ANSWER)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_full_slurm_queue_is_told_and_the_pod_placed_once_there_is_room(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(nodes=1, bridge=False)
    queue = FullQueue(refusals=1)
    stack.slurm = SlurmClient(
        stack.slurm_bed.rest_url,
        user_name=stack.slurm_bed.user_name,
        token_file=stack.slurm_bed.jwt_file,
        transport=queue,
    )
    await stack.start_bridge()
    created = stack.create_pod("waits")

    def told_busy(pod: Pod | None) -> bool:
        return (scheduled_condition(pod) or {}).get("reason") == "SlurmBusy"

    pod = await stack.wait_pod("waits", told_busy)
    condition = scheduled_condition(pod) or {}
    assert condition["status"] == "False"
    assert "MaxJobCount limit reached" in condition["message"]
    # The Event follows the condition (one write each).
    [event] = await stack.kube.wait_for_async(
        lambda: [e for e in stack.events("waits") if e["reason"] == "SlurmBusy"], timeout=10
    )
    assert event["type"] == "Warning"
    assert "submits again by itself" in event["message"]
    status = await slurm_bridge(stack, "status", f"{stack.namespace}/waits", "--json")
    assert "MaxJobCount limit reached" in status["slurm_unavailable"]

    # Submitted again after the first pause (15 to 18 s): placed, with one Slurm job.
    bound_pod = await stack.wait_pod("waits", bound, timeout=40)
    assert queue.submissions == 2
    jobs = await stack.partition_jobs()
    assert [job["job_id"] for job in jobs] == [job_id_of(bound_pod)]
    stack.kube.set_pod_phase(stack.namespace, "waits", "Succeeded")
    await stack.wait_pod("waits", finished_cleanly)

    # The path through a full queue replays with the code that made it; set
    # SLURM_BRIDGE_RECORD_HISTORY=1 to refresh its golden history (tests/unit/test_replay.py).
    await stack.handle(created).result()
    await replay_and_record(await stack.handle(created).fetch_history(), GOLDEN_BUSY_HISTORY)


@ON_REAL_KUBE
async def test_pod_deleted_while_pending_cancels_its_job(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=1)
    stack.create_pod("holder")
    await stack.wait_pod("holder", bound)
    created = stack.create_pod("impatient")
    pending = job_id_of(await stack.wait_pod("impatient", job_id_of))
    assert pending is not None

    stack.kube.delete_object("pods", "impatient", stack.namespace)
    await stack.wait_pod("impatient", lambda p: p is None)
    assert "CANCELLED" in await job_states(stack, pending)
    assert (await stack.handle(created).result()).phase == "Done"

    stack.kube.set_pod_phase(stack.namespace, "holder", "Succeeded")
    await stack.wait_pod("holder", finished_cleanly)


@ON_REAL_KUBE
async def test_worker_restart_while_waiting_keeps_exactly_one_job(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=1)
    stack.create_pod("first")
    await stack.wait_pod("first", bound)
    stack.create_pod("second")
    job_id = job_id_of(await stack.wait_pod("second", job_id_of))

    await stack.stop_bridge()  # the worker process goes away mid-wait
    stack.kube.set_pod_phase(stack.namespace, "first", "Succeeded")
    await stack.start_bridge()

    second = await stack.wait_pod("second", bound)
    assert job_id_of(second) == job_id
    jobs_for_second = [
        j
        for j in await stack.partition_jobs()
        if j["admin_comment"] == f'{{"pods":["{stack.namespace}/second"]}}'
    ]
    assert [j["job_id"] for j in jobs_for_second] == [job_id]

    stack.kube.set_pod_phase(stack.namespace, "second", "Succeeded")
    await stack.wait_pod("second", finished_cleanly)
    await stack.wait_pod("first", finished_cleanly)


@pytest.mark.slow
@pytest.mark.parametrize("limit_minutes", [1])
async def test_time_limit_removes_the_pod(make_stack: StackFactory, limit_minutes: int) -> None:
    stack = await make_stack(nodes=1)
    created = stack.create_pod("short", annotations={keys.SLURMJOB_PREFIX + "timelimit": str(limit_minutes)})
    await stack.wait_pod("short", bound)
    # Slurm enforces time limits on its own schedule (about 30 s granularity).
    await stack.wait_pod("short", lambda p: p is None or p["metadata"].get("deletionTimestamp"), timeout=150)
    events = [e for e in stack.events("short") if e["reason"] == "SlurmTimeLimit"]
    assert events, [(e["reason"], e["message"]) for e in stack.events("short")]
    assert "TIMEOUT" in events[0]["message"]
    # Terminating (no kubelet confirms here): the bridge's reason is kept in a condition of its own.
    conditions = {c["type"]: c for c in (stack.pod("short") or {}).get("status", {}).get("conditions", [])}
    assert conditions[keys.CONDITION_SLURM_JOB_ENDED]["status"] == "True"
    assert conditions[keys.CONDITION_SLURM_JOB_ENDED]["reason"] == "SlurmTimeLimit"
    assert "reached its Slurm time limit (TIMEOUT" in conditions[keys.CONDITION_SLURM_JOB_ENDED]["message"]
    result = await stack.handle(created).result()
    assert (result.phase, result.end_reason) == ("Done", "SlurmTimeLimit")


async def test_two_worker_replicas_place_each_pod_once(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=2)
    replica = await stack.start_replica()  # a second worker with its own watchers, same task queue
    names = ["left", "right"]
    for name in names:
        stack.create_pod(name)
    pods = [await stack.wait_pod(name, bound) for name in names]

    assert {bound(p) for p in pods} == set(stack.partition.node_names)  # exclusive: one pod per node
    bindings = [r for r in stack.fake.requests if r.method == "POST" and r.path.endswith("/binding")]
    assert sorted(r.path.split("/")[-2] for r in bindings) == names
    jobs = await stack.partition_jobs()
    assert sorted(j["admin_comment"] for j in jobs) == sorted(
        f'{{"pods":["{stack.namespace}/{n}"]}}' for n in names
    )

    await replica.stop()
    await stack.finish(*names)


async def test_annotation_change_updates_a_pending_job_and_is_refused_once_running(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(nodes=1)
    stack.create_pod("holder")
    await stack.wait_pod("holder", bound)
    stack.create_pod("waiting", annotations={keys.SLURMJOB_PREFIX + "timelimit": "30"})
    job_id = job_id_of(
        await stack.wait_pod("waiting", lambda p: (scheduled_condition(p) or {}).get("reason"))
    )
    assert job_id is not None

    def set_limit(minutes: str) -> Callable[[Pod], None]:
        def change(pod: Pod) -> None:
            pod["metadata"]["annotations"][keys.SLURMJOB_PREFIX + "timelimit"] = minutes

        return change

    stack.kube.update_object("pods", "waiting", set_limit("45"), stack.namespace)
    await stack.kube.wait_for_async(
        lambda: any(e["reason"] == "SlurmJobUpdated" for e in stack.events("waiting")), 15
    )
    job = (await stack.slurm.get_job(job_id)).model_dump(mode="json")
    assert job["time_limit"]["number"] == 45
    assert job["job_state"] == ["PENDING"]

    stack.kube.set_pod_phase(stack.namespace, "holder", "Succeeded")
    await stack.wait_pod("waiting", bound)
    stack.kube.update_object("pods", "waiting", set_limit("60"), stack.namespace)
    await stack.kube.wait_for_async(
        lambda: any(e["reason"] == "SlurmJobAlreadyAllocated" for e in stack.events("waiting"))
    )
    assert (await stack.slurm.get_job(job_id)).model_dump(mode="json")["time_limit"]["number"] == 45

    stack.kube.set_pod_phase(stack.namespace, "waiting", "Succeeded")
    await stack.wait_pod("waiting", finished_cleanly)
    await stack.wait_pod("holder", finished_cleanly)


async def test_pod_watcher_recovers_from_a_broken_watch_and_expired_history(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=2)
    stack.create_pod("before")
    await stack.wait_pod("before", bound)
    lists_before = sum(1 for r in stack.fake.requests if r.path == "/api/v1/pods" and "watch" not in r.query)

    stack.fake.compact_history()  # the resourceVersion the watcher holds is now too old (410)
    stack.fake.break_connections()  # and its watch stream breaks
    stack.create_pod("after")
    await stack.wait_pod("after", bound)
    lists_after = sum(1 for r in stack.fake.requests if r.path == "/api/v1/pods" and "watch" not in r.query)
    assert lists_after > lists_before  # it re-listed instead of missing the new pod

    await stack.finish("before", "after")


@ON_REAL_KUBE
async def test_slurm_node_names_map_to_kubernetes_nodes_through_the_label(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=1)
    [slurm_name] = stack.partition.node_names
    # The Kubernetes node has another name and says which Slurm node it is.
    stack.kube.delete_object("nodes", slurm_name)
    stack.kube.create_node("kube-worker-7", labels={keys.LABEL_SLURM_NODE_NAME: slurm_name})
    created = stack.create_pod("mapped")

    pod = await stack.wait_pod("mapped", bound)
    assert bound(pod) == "kube-worker-7"
    assert pod["metadata"]["annotations"][keys.ANNOTATION_SLURM_NODE] == "kube-worker-7"

    # What an operator searches for is Slurm's name; the state keeps both. The binding happens
    # before the workflow task that upserts ends: ask Temporal until it has (bounded, no event).
    async def upserted() -> TypedSearchAttributes | None:
        attributes = (await stack.handle(created).describe()).typed_search_attributes
        return attributes if attributes.get(sa.PLACEMENT_PHASE) == "Bound" else None

    attributes = await until(upserted, "the search attribute PlacementPhase=Bound", 10, 0.1)
    assert attributes.get(sa.SLURM_NODES) == [slurm_name]
    assert attributes.get(sa.SLURM_JOB_ID) == job_id_of(pod)
    status = await slurm_bridge(stack, "status", f"{stack.namespace}/mapped", "--json")
    assert (status["nodes"], status["kube_nodes"]) == ([slurm_name], ["kube-worker-7"])
    listed = await slurm_bridge(stack, "list", "--namespace", stack.namespace, "--json")
    assert [p["nodes"] for p in listed] == [[slurm_name]]

    stack.kube.set_pod_phase(stack.namespace, "mapped", "Succeeded")
    await stack.wait_pod("mapped", finished_cleanly)


async def test_a_pod_with_the_webhooks_toleration_is_annotated_by_its_binding(
    make_stack: StackFactory,
) -> None:
    """The mutating webhook adds the managed-node toleration; then the node annotation travels in
    the Binding (the API server copies it onto the pod with the node), with no patch before it."""
    stack = await make_stack(nodes=1)
    pod = make_pod(stack.namespace, "tolerant", scheduler=stack.settings.scheduler_name)
    pod["spec"]["tolerations"] = [managed_node_toleration(stack.settings.scheduler_name)]
    stack.kube.create_object("pods", pod)
    placed = await stack.wait_pod("tolerant", bound)
    node = bound(placed)
    assert placed["metadata"]["annotations"][keys.ANNOTATION_SLURM_NODE] == node
    assert placed["spec"]["tolerations"] == pod["spec"]["tolerations"]  # untouched
    pod_path = f"/api/v1/namespaces/{stack.namespace}/pods/tolerant"
    made = [(r.method, r.path) for r in stack.fake.requests if r.path.startswith(pod_path)]
    [binding] = [r for r in stack.fake.requests if r.path == f"{pod_path}/binding"]
    assert binding.body["metadata"]["annotations"] == {keys.ANNOTATION_SLURM_NODE: node}
    # Claimed (finalizer + placement annotation) and labelled: the only pod patches before binding.
    assert made[: made.index(("POST", f"{pod_path}/binding"))].count(("PATCH", pod_path)) == 2
    stack.kube.set_pod_phase(stack.namespace, "tolerant", "Succeeded")
    await stack.wait_pod("tolerant", finished_cleanly)


async def until_told_cancelled(handle: Any, timeout: float = 15) -> None:
    """Until the job watcher's `job_changed` saying CANCELLED is in the placement's history.

    The history is followed as it grows (the server answers each new event as it is written),
    so the wait ends on the event itself, not on a poll.
    """
    async with asyncio.timeout(timeout):
        async for event in handle.fetch_history_events(wait_new_event=True):
            if not event.HasField("workflow_execution_signaled_event_attributes"):
                continue
            signal = event.workflow_execution_signaled_event_attributes
            cancelled = any(b"CANCELLED" in p.data for p in signal.input.payloads)
            if signal.signal_name == "job_changed" and cancelled:
                return


async def test_status_of_a_placement_cancelled_while_pending_shows_its_job_cancelled(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(nodes=1)
    stack.create_pod("holder")
    await stack.wait_pod("holder", bound)
    created = stack.create_pod("waiting")
    pod = await stack.wait_pod(
        "waiting", lambda p: (scheduled_condition(p) or {}).get("reason") == "Resources"
    )
    job_id = job_id_of(pod)
    assert job_id is not None
    before = await slurm_bridge(stack, "status", f"{stack.namespace}/waiting", "--json")
    assert before["job_state"].startswith("PENDING")

    # The release's last write (dropping the finalizer) is held until the job watcher has told
    # the placement that its job is CANCELLED: that news must not make the job look as if it had
    # ended by itself (the order CI once met by chance).
    pod_path = f"/api/v1/namespaces/{stack.namespace}/pods/waiting$"
    last_write = stack.fake.hold_next(
        "PATCH", pod_path, body="$deleteFromPrimitiveList/finalizers", applied=False
    )
    await stack.handle(created).cancel()  # what `temporal workflow cancel` does
    await stack.kube.wait_for_async(lambda: last_write.arrived, timeout=30)
    assert "CANCELLED" in await job_states(stack, job_id)
    await until_told_cancelled(stack.handle(created))
    last_write.release()
    with pytest.raises(WorkflowFailureError):
        await stack.handle(created).result()
    await stack.wait_pod("waiting", finished_cleanly)
    after = await slurm_bridge(stack, "status", f"{stack.namespace}/waiting", "--json")
    assert (after["workflow_status"], after["phase"]) == ("CANCELED", "Failed")
    assert after["job_state"] == "CANCELLED (placement cancelled)"  # not the PENDING read before

    stack.kube.set_pod_phase(stack.namespace, "holder", "Succeeded")
    await stack.wait_pod("holder", finished_cleanly)
