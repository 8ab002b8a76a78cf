"""A rolling upgrade: placements started by the previous release finish on today's worker.

The previous release (the last commit before the lean `Placement` workflow type)
runs as a real `slurm-bridge worker` process from a git worktree; it starts
placements of type `PlacementWorkflow`. It is stopped while one of them waits
for Slurm, and today's worker, which still registers that type, takes over:
it replays the old histories, recognises the old pods (finalizer, no claim
annotation) and the old jobs (comment without installation), binds, and cleans up.

The rolling case runs the release before type `PlacementV3` next to today's worker, both
with leader election on one Lease: tasks of `PlacementV3` placements that reach the old
replica fail there (type not registered) and today's replica takes them at once.
"""

import asyncio
import contextlib
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType

from bridge import keys
from tests.e2e.conftest import StackFactory
from tests.e2e.harness import (
    Pod,
    Stack,
    bound,
    finished_cleanly,
    free_port,
    job_id_of,
    leader_worker_env,
    make_pod,
    running_process,
    unique,
    worker_env,
)
from tests.health_probe import ready_body, sees_leader

pytestmark = pytest.mark.slurm

PREVIOUS_RELEASE = "d15ba29"  # the last commit whose worker starts PlacementWorkflow placements
# The last commit before type PlacementV3 (aff7055): its worker starts, and knows, type `Placement` only.
BEFORE_V3 = "20533cc"
REPO = Path(__file__).resolve().parents[2]


def release_tree(tmp_path_factory: pytest.TempPathFactory, commit: str) -> Iterator[Path]:
    """A git worktree of `commit` in pytest's temporary directory (outside the repository), removed after."""
    where = tmp_path_factory.mktemp(f"release-{commit}") / "tree"
    found = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
    )
    if found.returncode != 0:
        pytest.fail(f"commit {commit} is not in this clone: the upgrade test needs the history")
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), commit],
        check=True,
        capture_output=True,
    )
    try:
        yield where
    finally:
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "remove", "--force", str(where)], capture_output=True
        )


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from release_tree(tmp_path_factory, PREVIOUS_RELEASE)


@pytest.fixture(scope="module")
def release_before_v3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from release_tree(tmp_path_factory, BEFORE_V3)


@contextlib.asynccontextmanager
async def old_worker(stack: Stack, tree: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    # The previous release's packages shadow today's.
    env = worker_env(stack, PYTHONPATH=str(tree), METRICS_PORT="0")
    command = (sys.executable, "-c", "from worker.cli import app; app()", "worker")
    async with running_process(*command, cwd=tree, env=env) as process:
        yield process


def tolerated_pod(stack: Stack, name: str) -> Pod:
    """A pod as the previous release's webhook left it: with the managed-node toleration."""
    scheduler = stack.settings.scheduler_name
    pod = make_pod(stack.namespace, name, scheduler=scheduler)
    pod["spec"]["tolerations"] = [
        {"key": keys.TAINT_MANAGED_NODE, "operator": "Equal", "value": scheduler, "effect": "NoExecute"}
    ]
    return stack.kube.create_object("pods", pod)


async def test_placements_of_the_previous_release_finish_on_todays_worker(
    make_stack: StackFactory, previous_release: Path
) -> None:
    stack = await make_stack(nodes=1, bridge=False)

    # The previous release's node sync would take labelled nodes over: keep it out of this test.
    def unlabel(node: Pod) -> None:
        node["metadata"]["labels"].pop(keys.LABEL_EXTERNAL_NODE)

    for name in stack.partition.node_names:
        stack.kube.update_object("nodes", name, unlabel)

    async with old_worker(stack, previous_release):
        tolerated_pod(stack, "holder")
        holder = await stack.wait_pod("holder", bound, timeout=60)
        tolerated_pod(stack, "upgraded")
        waiting = await stack.wait_pod("upgraded", job_id_of, timeout=60)  # submitted, pending on Resources
    assert bound(waiting) is None
    assert keys.ANNOTATION_PLACEMENT not in (waiting["metadata"].get("annotations") or {})

    await stack.start_bridge()  # today's worker
    stack.kube.set_pod_phase(stack.namespace, "holder", "Succeeded")
    upgraded = await stack.wait_pod("upgraded", bound, timeout=60)
    assert bound(upgraded) == bound(holder)
    stack.kube.set_pod_phase(stack.namespace, "upgraded", "Succeeded")
    await stack.wait_pod("holder", finished_cleanly)
    await stack.wait_pod("upgraded", finished_cleanly)

    runs = [
        run
        async for run in stack.temporal.list_workflows(
            f"WorkflowId STARTS_WITH 'placement/{stack.namespace}/'"
        )
    ]
    assert [run.workflow_type for run in runs] == ["PlacementWorkflow", "PlacementWorkflow"]
    for run in runs:  # each finishes on today's worker (the finalizer goes just before the end)
        await stack.temporal.get_workflow_handle(run.id, run_id=run.run_id).result()
    jobs = await stack.partition_jobs()
    assert sorted(j["job_id"] for j in jobs) == sorted([job_id_of(holder) or 0, job_id_of(waiting) or 0])


# --------------------------------------------------------------------------------------------
# Old and new replicas side by side: the Deployment's rolling update with two replicas.

LEASE = {"lease_duration": 4.0, "renew_deadline": 3.0, "retry_period": 0.5}  # as test_leader_kills


@dataclass
class Replica:
    """One `slurm-bridge worker` process: the previous release's or today's."""

    process: asyncio.subprocess.Process
    health_port: int
    identity: str = ""  # the Lease's name for it (from /readyz)

    @property
    def temporal_identity(self) -> str:
        """The worker identity Temporal records on the tasks it answers (the SDK's default)."""
        return f"{self.process.pid}@{socket.gethostname()}"

    async def readyz(self) -> dict[str, Any]:
        """/readyz once it says 200."""
        body = await ready_body(self.process, self.health_port)
        self.identity = body["identity"]
        return body


@contextlib.asynccontextmanager
async def replica(stack: Stack, log: Path, tree: Path | None = None) -> AsyncIterator[Replica]:
    """A worker process with leader election, from `tree` (a release's worktree) or today's code."""
    health_port = free_port()
    env = leader_worker_env(stack, health_port, METRICS_PORT="0")
    if tree is None:
        command: tuple[str, ...] = (str(Path(sys.executable).with_name("slurm-bridge")), "worker")
        # Every workflow task goes to the shared queue, as when more placements run than the
        # cache holds (500): either replica may take it, not only the one that ran the last.
        env["TEMPORAL_MAX_CACHED_WORKFLOWS"] = "0"
        cwd = REPO
    else:
        env["PYTHONPATH"] = str(tree)  # the release's packages shadow today's
        command, cwd = (sys.executable, "-c", "from worker.cli import app; app()", "worker"), tree
    with log.open("wb") as stderr:
        async with running_process(*command, cwd=cwd, env=env, stderr=stderr) as process:
            yield Replica(process, health_port)


async def lease_names(stack: Stack, identity: str) -> None:
    """Until the Lease names `identity` as its holder (event-driven on the fake's store)."""

    def holder() -> bool:
        lease = stack.kube.get_object("leases.coordination.k8s.io", stack.settings.lease_name, "default")
        return ((lease or {}).get("spec") or {}).get("holderIdentity") == identity

    assert await stack.kube.wait_for_async(holder, timeout=30)


async def history_of(stack: Stack, pod: Pod) -> tuple[str, list[Any]]:
    """A pod's placement: its workflow type and its (latest run's) history events."""
    handle = stack.handle(pod)
    described = await handle.describe()
    return described.workflow_type, list((await handle.fetch_history()).events)


def failed_on(events: list[Any], worker: Replica) -> list[str]:
    """The messages of the workflow tasks `worker` failed, as the history records them."""
    return [
        e.workflow_task_failed_event_attributes.failure.message
        for e in events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
        and e.workflow_task_failed_event_attributes.identity == worker.temporal_identity
    ]


async def test_old_and_new_replicas_side_by_side_in_a_rolling_update(
    make_stack: StackFactory, release_before_v3: Path, tmp_path: Path
) -> None:
    """Two replicas, updated one at a time: the previous release (it knows type `Placement` only)
    and today's run together on one task queue, one of them leading the watchers.

    1. The old Deployment: an old replica leads and starts "before" (type `Placement`).
    2. The rollout adds today's replica: a standby; the old one still leads and starts "during".
    3. The first old replica goes (its Lease released) and today's takes the Lease; the second
       old replica, not reached yet, still serves the task queue. Pods created now are `PlacementV3`;
       tasks of theirs that reach the old replica fail there and today's takes them.
    4. The second old replica goes. Every pod ends bound once, with one Slurm job.
    """
    stack = await make_stack(
        nodes=3,
        bridge=False,
        leader_election=True,
        lease_namespace="default",
        # Node sync of both releases claims only this scheduler's nodes on the shared Slurm.
        scheduler_name=unique("sched"),
        **LEASE,
    )
    names = ["before", "during"]
    placed: dict[str, Pod] = {}

    async def bind(name: str) -> None:
        tolerated_pod(stack, name)
        placed[name] = await stack.wait_pod(name, bound, timeout=60)

    async with contextlib.AsyncExitStack() as new_deployment:
        async with replica(stack, tmp_path / "old-1.log", release_before_v3) as first_old:
            await first_old.readyz()
            await lease_names(stack, first_old.identity)
            await bind("before")

            new = await new_deployment.enter_async_context(replica(stack, tmp_path / "new.log"))
            await new.readyz()
            await sees_leader(new.health_port, first_old.identity, watching=False)
            await bind("during")
        # The first old replica stopped: it released the Lease, today's replica leads.
        await lease_names(stack, new.identity)
        await sees_leader(new.health_port, new.identity, watching=True)

        async with replica(stack, tmp_path / "old-2.log", release_before_v3) as second_old:
            await second_old.readyz()
            await sees_leader(second_old.health_port, new.identity, watching=False)
            # Placements of today's type, each placed and finished while the old replica runs,
            # until one of its workflow tasks reached the old replica (either replica takes a task
            # from the shared queue: one placement is usually enough).
            reached_old: list[str] = []
            for n in range(6):
                names.append(f"today-{n}")
                await bind(names[-1])
                stack.kube.set_pod_phase(stack.namespace, names[-1], "Succeeded")
                await asyncio.wait_for(stack.handle(placed[names[-1]]).result(), 60)
                kind, events = await history_of(stack, placed[names[-1]])
                assert kind == keys.PLACEMENT_WORKFLOW_TYPE
                if failures := failed_on(events, second_old):
                    reached_old.append(names[-1])
                    assert all("PlacementV3 is not registered" in f for f in failures), failures
                    break
            assert reached_old, "no workflow task of a PlacementV3 placement reached the old replica"
            # One more placement of today's type, still running when the old replica goes.
            names.append("last")
            await bind("last")
        assert second_old.process.returncode is not None
        await sees_leader(new.health_port, new.identity, watching=True)

        for name in ("before", "during", "last"):
            stack.kube.set_pod_phase(stack.namespace, name, "Succeeded")
        for name in names:
            await stack.wait_pod(name, finished_cleanly, timeout=60)
            await asyncio.wait_for(stack.handle(placed[name]).result(), 60)  # ends on today's replica

    # Each placement is of the type its leader started; the old replicas failed no task of a type
    # they know.
    old = (first_old, second_old)
    for name in names:
        kind, events = await history_of(stack, placed[name])
        expected = (
            keys.PLACEMENT_V2_WORKFLOW_TYPE if name in ("before", "during") else keys.PLACEMENT_WORKFLOW_TYPE
        )
        assert kind == expected, name
        if kind == keys.PLACEMENT_V2_WORKFLOW_TYPE:
            assert not any(failed_on(events, worker) for worker in old), name
    # Every pod bound once, by one Slurm job of its own.
    bindings = [
        r.path.split("/")[-2]
        for r in stack.fake.requests
        if r.method == "POST" and r.path.endswith("/binding")
    ]
    assert sorted(bindings) == sorted(names)
    job_ids = sorted(job_id_of(placed[name]) or 0 for name in names)
    assert len(set(job_ids)) == len(names)
    assert sorted(j["job_id"] for j in await stack.partition_jobs()) == job_ids
