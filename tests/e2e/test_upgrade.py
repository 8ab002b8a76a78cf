"""A rolling upgrade: placements started by the previous release finish on today's worker.

The previous release (the last commit before the lean `Placement` workflow type)
runs as a real `slurm-bridge worker` process from a git worktree; it starts
placements of type `PlacementWorkflow`. It is stopped while one of them waits
for Slurm, and today's worker, which still registers that type, takes over:
it replays the old histories, recognises the old pods (finalizer, no claim
annotation) and the old jobs (comment without installation), binds, and cleans up.
"""

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bridge import keys
from tests.e2e.conftest import StackFactory
from tests.e2e.harness import (
    Pod,
    Stack,
    bound,
    finished_cleanly,
    job_id_of,
    make_pod,
    running_process,
    worker_env,
)

pytestmark = pytest.mark.slurm

PREVIOUS_RELEASE = "d15ba29"  # the last commit whose worker starts PlacementWorkflow placements
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    where = tmp_path_factory.mktemp("previous") / "tree"
    found = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"], capture_output=True
    )
    if found.returncode != 0:
        pytest.fail(f"commit {PREVIOUS_RELEASE} is not in this clone: the upgrade test needs the history")
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), PREVIOUS_RELEASE],
        check=True,
        capture_output=True,
    )
    try:
        yield where
    finally:
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "remove", "--force", str(where)], capture_output=True
        )


@contextlib.asynccontextmanager
async def old_worker(stack: Stack, tree: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    # The previous release's packages shadow today's.
    env = worker_env(stack, PYTHONPATH=str(tree), METRICS_PORT="0")
    command = (sys.executable, "-c", "from worker.cli import app; app()", "worker")
    async with running_process(*command, cwd=tree, env=env) as process:
        yield process


def tolerated_pod(stack: Stack, name: str) -> Pod:
    """A pod as the previous release's webhook left it: with the managed-node toleration."""
    pod = make_pod(stack.namespace, name)
    pod["spec"]["tolerations"] = [
        {
            "key": keys.TAINT_MANAGED_NODE,
            "operator": "Equal",
            "value": keys.DEFAULT_SCHEDULER_NAME,
            "effect": "NoExecute",
        }
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
