"""The `stack` factory: a complete bridge on real Temporal and real Slurm per test."""

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from activities.slurm_client import SlurmClient
from bridge import keys
from tests.e2e.harness import Stack
from tests.kube_fake import FakeKubeServer
from tests.slurm_bed import SlurmTestBed
from worker.settings import load_settings

StackFactory = Callable[..., Awaitable[Stack]]


@pytest.fixture
async def make_stack(
    temporal_client: Client, slurm_bed: SlurmTestBed, tmp_path: Path, task_queue: str
) -> AsyncIterator[StackFactory]:
    stacks: list[Stack] = []

    async def make(
        nodes: int = 1, cpus: int = 4, memory_mb: int = 8000, *, bridge: bool = True, **overrides: Any
    ) -> Stack:
        partition = slurm_bed.make_partition(nodes=nodes, cpus=cpus, memory_mb=memory_mb)
        kube = FakeKubeServer().start()
        for name in partition.node_names:
            kube.create_node(name, cpu=str(cpus), memory=f"{memory_mb}Mi")
        kubeconfig = kube.kubeconfig(tmp_path / f"kubeconfig-{len(stacks)}")
        settings = load_settings(
            temporal_task_queue=task_queue,
            slurm_rest_url=slurm_bed.rest_url,
            slurm_user_name=slurm_bed.user_name,
            slurm_jwt_file=slurm_bed.jwt_file,
            kubeconfig=str(kubeconfig),
            partition=partition.name,
            job_watch_interval=0.2,
            metrics_port=0,
            **overrides,
        )
        slurm = SlurmClient(slurm_bed.rest_url, user_name=slurm_bed.user_name, token_file=slurm_bed.jwt_file)
        stack = Stack(kube, temporal_client, slurm, slurm_bed, partition, settings, kubeconfig)
        stacks.append(stack)
        if bridge:
            await stack.start_bridge()
        return stack

    yield make

    for stack in stacks:
        await stack.stop_bridge()
        await stack.slurm.close()
        # Nothing left behind: no pod still carries our finalizer, no job still holds nodes.
        stuck = [
            p["metadata"]["name"]
            for p in stack.kube.objects("pods")
            if keys.FINALIZER in (p["metadata"].get("finalizers") or [])
        ]
        stack.kube.stop()
        live = [job for job in stack.slurm_bed.jobs_in_partition(stack.partition.name) if not job.ended]
        stack.partition.cleanup()
        assert not stuck, f"pods left with the bridge finalizer: {stuck}"
        assert not live, f"Slurm jobs left running or pending: {live}"
