"""Replicas share the work, one leader watches: Lease election end to end on real Slurm.

Two bridges (as two worker processes would: own Temporal connection, own
Kubernetes and Slurm clients) serve the same task queue; only the holder of the
coordination.k8s.io/v1 Lease runs the pod, job and node watchers. When it stops,
the other takes over within the lease duration and re-lists: a pod created
during the handover is placed, once, and so is a pod whose Slurm job starts while
no replica leads. Readiness (/readyz) follows the Lease and Kubernetes.
(tests/e2e/test_leader_kills.py does it with real processes.)
"""

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from temporalio.client import Client

from bridge import keys
from clients.kube_client import KubeClient, load_configuration
from testbed.waiting import until
from tests.e2e.conftest import StackFactory
from tests.e2e.harness import Stack, bed_client, bound, finished_cleanly, job_id_of, wait_job_state
from tests.health_probe import probe
from worker.health import HealthServer
from worker.main import Bridge

pytestmark = pytest.mark.slurm

TIMINGS = {"lease_duration": 2.0, "renew_deadline": 1.5, "retry_period": 0.3}


@dataclass
class Running:
    bridge: Bridge
    task: asyncio.Task[None]

    @property
    def leading(self) -> bool:
        return self.bridge.elector is not None and self.bridge.elector.is_leader


@contextlib.asynccontextmanager
async def replica(stack: Stack) -> AsyncIterator[Running]:
    kube = KubeClient(await load_configuration(str(stack.kubeconfig)))
    slurm = bed_client(stack.slurm_bed, stack.settings.slurm_api_version)
    temporal = await Client.connect(
        stack.temporal.service_client.config.target_host,
        namespace=stack.temporal.namespace,
        data_converter=stack.temporal.data_converter,
        # Its own name in the histories (the default, pid@host, is the same for every replica here).
        identity=f"replica-{uuid.uuid4().hex[:8]}",
    )
    bridge = Bridge(temporal, kube, slurm, stack.settings, sandbox_every_workflow=True)
    running = Running(bridge, asyncio.create_task(bridge.run()))
    try:
        yield running
    finally:
        running.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running.task
        await kube.close()
        await slurm.close()


async def leader_among(*replicas: Running) -> Running:
    """The one replica that holds the Lease (asked of each elector: there is no event to wait on)."""

    def one_leader() -> list[Running] | None:
        leaders = [r for r in replicas if r.leading]
        return leaders if len(leaders) == 1 else None

    [leader] = await until(
        one_leader, lambda: f"one leader ({sum(r.leading for r in replicas)} now)", 15, interval=0.1
    )
    return leader


async def test_one_leader_watches_and_another_takes_over(make_stack: StackFactory) -> None:
    stack = await make_stack(
        nodes=2, bridge=False, leader_election=True, lease_namespace="default", **TIMINGS
    )
    async with replica(stack) as first, replica(stack) as second:
        leader = await leader_among(first, second)
        standby = second if leader is first else first
        stack.create_pod("before")
        before = await stack.wait_pod("before", bound)
        assert leader.bridge.job_watcher.passes > 0
        assert standby.bridge.job_watcher.passes == 0, "a standby asks Slurm nothing"
        assert standby.bridge.pod_watcher.starts == 0

        # The leader goes (a rolling upgrade: it releases the Lease); a pod arrives meanwhile.
        leader.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await leader.task
        stack.create_pod("during")
        assert await leader_among(standby) is standby
        during = await stack.wait_pod("during", bound)
        assert {bound(before), bound(during)} == set(stack.partition.node_names)

        for name in ("before", "during"):
            stack.kube.set_pod_phase(stack.namespace, name, "Succeeded")
            await stack.wait_pod(name, finished_cleanly)
    jobs = await stack.partition_jobs()
    assert sorted(j["job_id"] for j in jobs) == sorted([job_id_of(before) or 0, job_id_of(during) or 0])
    bindings = [r for r in stack.fake.requests if r.method == "POST" and r.path.endswith("/binding")]
    assert sorted(r.path.split("/")[-2] for r in bindings) == ["before", "during"]


async def test_the_placements_the_leader_starts_run_on_the_standby_too(make_stack: StackFactory) -> None:
    """The leader's pod watcher starts every placement, through the task queue: an eager start
    runs the first workflow task on the starter's own worker, and Temporal keeps a workflow's
    later tasks (the bind among them) on the worker that ran its last, so the standby would run
    none of them."""
    stack = await make_stack(
        nodes=3, cpus=4, bridge=False, leader_election=True, lease_namespace="default", **TIMINGS
    )
    names = [f"p{i}" for i in range(12)]  # one CPU each, sharing nodes: all run at once
    async with replica(stack) as first, replica(stack) as second:
        leader = await leader_among(first, second)
        standby = second if leader is first else first
        for name in names:
            stack.create_pod(name, annotations={keys.SLURMJOB_PREFIX + "exclusive": "false"})
        pods = [await stack.wait_pod(name, bound) for name in names]
        assert standby.bridge.pod_watcher.starts == 0
        ran_first: list[str] = []  # who ran each placement's first workflow task
        for pod in pods:
            async for event in stack.handle(pod).fetch_history_events():
                if event.HasField("workflow_task_started_event_attributes"):
                    ran_first.append(event.workflow_task_started_event_attributes.identity)
                    break
        # Twelve tasks that either replica's pollers may take: the standby's share is not zero
        # unless all twelve went one way (1 in 4,096 were the two equally quick to take them).
        assert standby.bridge.temporal.identity in ran_first, ran_first
        await stack.finish(*names)


async def test_a_job_that_starts_while_no_replica_leads_is_bound_by_the_next_leader(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(
        nodes=1,
        bridge=False,
        leader_election=True,
        lease_namespace="default",
        # The placement's cached workflow waits this long for the dead replica's sticky queue.
        temporal_sticky_timeout=1,
        **TIMINGS,
    )
    # Another job (not the bridge's: no placement comment) holds the partition's one node.
    answer = stack.slurm_bed.rest(
        "POST",
        "/job/submit",
        {
            "job": {
                "name": "blocker",
                "flags": ["EXTERNAL_JOB"],
                "nodes": "1",
                "partition": stack.partition.name,
                "current_working_directory": "/tmp",
            }
        },
    )
    assert answer.status_code == 200, answer.text
    blocker = int(answer.json()["job_id"])
    freed = False
    try:
        await wait_job_state(stack.slurm, blocker, lambda s: "RUNNING" in s)
        async with replica(stack) as first, replica(stack) as second:
            leader = await leader_among(first, second)
            standby = second if leader is first else first
            stack.create_pod("late")
            job_id = job_id_of(await stack.wait_pod("late", job_id_of))
            assert job_id is not None
            await wait_job_state(stack.slurm, job_id, lambda s: "PENDING" in s)
            # The pod is told it waits: the placement's submit step is over, it waits for the
            # watchers' word (a step cut short by the crash would be retried, and see the job run).
            await stack.kube.wait_for_async(
                lambda: any(e["reason"] == "SlurmJobPending" for e in stack.events("late")), 30
            )

            # The leader crashes: its watchers stop, its Lease is not released. While the API
            # server refuses Lease requests no replica can lead, however long Slurm takes.
            elector = leader.bridge.elector
            assert elector is not None
            elector.release_on_cancel = False
            stack.fake.fail_next("*", LEASES, 500, count=1_000_000)
            leader.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await leader.task
            # The node is freed; Slurm starts the job while no replica leads, and nobody binds.
            await asyncio.to_thread(stack.slurm_bed.cancel_job, blocker)
            freed = True
            await wait_job_state(stack.slurm, job_id, lambda s: "RUNNING" in s)
            assert not standby.leading
            assert bound(stack.pod("late")) is None
            assert standby.bridge.job_watcher.signals == 0

            # The dead leader's Lease runs out; the new leader's watchers re-list, find the job
            # running and bind the pod.
            stack.fake.clear_faults()
            assert await leader_among(standby) is standby
            late = await stack.wait_pod("late", bound)
            assert bound(late) == stack.partition.node_names[0]
            assert job_id_of(late) == job_id
            assert standby.bridge.job_watcher.signals > 0  # it told the placement the job runs

            stack.kube.set_pod_phase(stack.namespace, "late", "Succeeded")
            await stack.wait_pod("late", finished_cleanly)
    finally:
        if not freed:
            await asyncio.to_thread(stack.slurm_bed.cancel_job, blocker)
    ours = [j for j in await stack.partition_jobs() if j["admin_comment"]]
    assert [(j["job_id"], j["admin_comment"]) for j in ours] == [
        (job_id, f'{{"pods":["{stack.namespace}/late"]}}')
    ]
    bindings = [r for r in stack.fake.requests if r.method == "POST" and r.path.endswith("/binding")]
    assert [r.path.split("/")[-2] for r in bindings] == ["late"]


LEASES = r"^/apis/coordination\.k8s\.io/v1/namespaces/default/leases"


async def until_ready(server: HealthServer, ready: bool, timeout: float = 15) -> dict[str, Any]:
    """Poll /readyz until it says `ready` (readiness is computed when asked: nothing to wait on)."""
    seen: list[object] = [None]

    async def says() -> dict[str, Any] | None:
        status, body = await probe(server.port, "/readyz")
        seen[0] = body
        return body if (status == 200, body.get("ready")) == (ready, ready) else None

    return await until(
        says, lambda: f"/readyz to say ready={ready} (last: {seen[0]})", timeout, 0.1, ignoring=OSError
    )


async def test_readiness_follows_the_lease_and_kubernetes(make_stack: StackFactory) -> None:
    stack = await make_stack(
        nodes=1, bridge=False, leader_election=True, lease_namespace="default", **TIMINGS
    )
    async with replica(stack) as first, replica(stack) as second:
        leader = await leader_among(first, second)
        standby = second if leader is first else first
        async with (
            HealthServer(leader.bridge.readiness, 0, host="127.0.0.1") as leader_probe,
            HealthServer(standby.bridge.readiness, 0, host="127.0.0.1") as standby_probe,
        ):
            body = await until_ready(leader_probe, True)
            assert (body["identity"], body["leader"], body["watching"]) == (
                leader.bridge.identity,
                leader.bridge.identity,
                True,
            )
            assert set(body["watchers"]) == {"pod", "job", "node"}
            elector = standby.bridge.elector
            assert elector is not None
            await stack.kube.wait_for_async(lambda: elector.leader == leader.bridge.identity)
            body = await until_ready(standby_probe, True)  # a standby serves activities: ready
            assert (body["leader"], body["watching"]) == (leader.bridge.identity, False)
            assert "watchers" not in body

            # The API server stops answering about the Lease: the leader cannot renew.
            stack.fake.fail_next("*", LEASES, 500, count=1_000_000)
            body = await until_ready(leader_probe, False)
            assert any("Lease default/slurm-bridge" in problem for problem in body["problems"]), body
            assert not leader.leading
            await until_ready(standby_probe, False)

            stack.fake.clear_faults()
            await until_ready(leader_probe, True)
            await until_ready(standby_probe, True)
            await leader_among(first, second)


async def test_readiness_without_leader_election_follows_the_pod_watch(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=1)
    assert stack.bridge is not None
    bridge = stack.bridge
    async with HealthServer(lambda: bridge.readiness(kube_grace=0.5), 0, host="127.0.0.1") as probe:
        body = await until_ready(probe, True)
        assert (body["leader"], body["watching"]) == (None, True)

        stack.fake.fail_next("*", r"^/api/v1/pods", 500, count=1_000_000)
        stack.fake.break_connections()  # the watch stream ends; re-listing fails
        body = await until_ready(probe, False)
        assert any("pod list/watch has failed" in problem for problem in body["problems"]), body
        assert body["watchers"]["pod"]["failing"] > 0

        stack.fake.clear_faults()
        body = await until_ready(probe, True)
        assert body["watchers"]["pod"]["failing"] == 0
