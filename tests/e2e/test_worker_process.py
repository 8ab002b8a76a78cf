"""The real `slurm-bridge worker` process: killed mid-wait, restarted, and scraped for metrics."""

import asyncio
import contextlib
import os
import signal
import socket
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.conftest import StackFactory
from tests.e2e.harness import Pod, Stack, job_id_of

pytestmark = pytest.mark.slurm


def bound(pod: Pod | None) -> str | None:
    node = (pod or {}).get("spec", {}).get("nodeName")
    return str(node) if node else None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.asynccontextmanager
async def worker_process(stack: Stack, metrics_port: int) -> AsyncIterator[asyncio.subprocess.Process]:
    s = stack.settings
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": stack.temporal.service_client.config.target_host,
        "TEMPORAL_TASK_QUEUE": s.temporal_task_queue,
        "SLURM_REST_URL": s.slurm_rest_url,
        "SLURM_USER_NAME": s.slurm_user_name or "",
        "SLURM_JWT_FILE": str(s.slurm_jwt_file),
        "KUBECONFIG": str(stack.kubeconfig),
        "SLURM_PARTITION": s.partition,
        "JOB_WATCH_INTERVAL": "0.2",
        "METRICS_PORT": str(metrics_port),
        "LOG_FORMAT": "json",
    }
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("slurm-bridge")),
        "worker",
        env=env,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(process.wait(), 20)
            except TimeoutError:
                process.kill()
                await process.wait()


async def test_a_killed_worker_leaves_one_job_and_its_successor_binds_the_pod(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(nodes=1, bridge=False)
    metrics_port = free_port()
    async with worker_process(stack, metrics_port) as first_worker:
        stack.create_pod("first")
        await stack.wait_pod("first", bound, timeout=60)
        stack.create_pod("second")
        job_id = job_id_of(await stack.wait_pod("second", job_id_of))
        first_worker.kill()  # SIGKILL while the second placement waits
        await first_worker.wait()

    stack.kube.set_pod_phase(stack.namespace, "first", "Succeeded")
    async with worker_process(stack, metrics_port):
        second = await stack.wait_pod("second", bound, timeout=60)
        assert job_id_of(second) == job_id
        comment = f'{{"pods":["{stack.namespace}/second"]}}'
        assert [j["job_id"] for j in await stack.partition_jobs() if j["admin_comment"] == comment] == [
            job_id
        ]

        # The process serves the SDK's and the bridge's metrics on one port.
        metrics = await asyncio.to_thread(
            lambda: (
                urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
            )
        )
        assert 'slurm_bridge_slurm_requests{operation="GET /jobs/",outcome="ok"' in metrics
        assert "slurm_bridge_pod_created_to_bound_seconds" in metrics
        assert "temporal_workflow_task_execution_latency" in metrics

        stack.kube.set_pod_phase(stack.namespace, "second", "Succeeded")
        await stack.wait_pod("second", lambda p: p is None or not p["metadata"].get("finalizers"), timeout=60)
        await stack.wait_pod("first", lambda p: p is None or not p["metadata"].get("finalizers"), timeout=60)
