"""The real `slurm-bridge worker` process: it places a pod and serves the SDK's and the bridge's metrics."""

import asyncio
import contextlib
import signal
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.conftest import StackFactory
from tests.e2e.harness import Pod, Stack, bound, free_port, job_id_of, running_process, unique, worker_env

pytestmark = pytest.mark.slurm


@contextlib.asynccontextmanager
async def worker_process(stack: Stack, metrics_port: int) -> AsyncIterator[asyncio.subprocess.Process]:
    env = worker_env(stack, METRICS_PORT=str(metrics_port), LOG_FORMAT="json")
    command = (str(Path(sys.executable).with_name("slurm-bridge")), "worker")
    async with running_process(*command, env=env) as process:
        yield process


async def handle_result(stack: Stack, pod: Pod) -> None:
    """Wait for the placement to finish: its metrics are recorded by then."""
    assert (await stack.handle(pod).result()).phase == "Done"


async def test_the_worker_process_places_a_pod_and_serves_metrics(make_stack: StackFactory) -> None:
    # Its own scheduler name: the process's node sync then touches only this test's node on the shared Slurm.
    stack = await make_stack(nodes=1, bridge=False, scheduler_name=unique("sched"))
    metrics_port = free_port()
    async with worker_process(stack, metrics_port) as process:
        stack.create_pod("solo")
        pod = await stack.wait_pod("solo", bound, timeout=60)
        assert job_id_of(pod) is not None

        stack.kube.set_pod_phase(stack.namespace, "solo", "Succeeded")
        await stack.wait_pod("solo", lambda p: p is None or not p["metadata"].get("finalizers"), timeout=60)
        await handle_result(stack, pod)

        # The process serves the SDK's and the bridge's metrics on one port.
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        metrics = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
        # (The job watcher's `GET /jobs/state/` shows only if it probed while the job lived: a
        # placement that reads its job RUNNING right after submitting can end before that.)
        assert 'slurm_bridge_slurm_requests{operation="POST /job/submit",outcome="ok"' in metrics
        assert 'slurm_bridge_slurm_requests{operation="DELETE /job/{}",outcome="ok"' in metrics
        assert "slurm_bridge_slurm_available" in metrics
        assert "slurm_bridge_pod_created_to_bound_seconds" in metrics
        assert "slurm_bridge_placements_total{" in metrics or "slurm_bridge_placements{" in metrics
        assert "temporal_workflow_task_execution_latency" in metrics

        # Kubernetes stops a container with SIGTERM: the worker shuts down as on SIGINT, exit 0.
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
