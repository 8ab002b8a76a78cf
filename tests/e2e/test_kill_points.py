"""SIGKILL the real worker process at every step of a placement, for a pod and for a group.

Each kill lands between two side effects (tests/e2e/kill_points.py); a new worker process
takes over. Afterwards exactly one Slurm job ever existed per placement, every pod was bound
(each on its own node) and then released, no job outlives its pods, no pod keeps the finalizer,
and the new worker took over well before the 60 s attempt timeout (a killed worker's step is
noticed by its missing heartbeat). The soak (bench/soak.py) does the same at random, many times.
"""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client

from bridge import keys
from tests.e2e.kill_points import KillBed, KillPoint, Kind, place_with_kill, worker_env
from tests.kube_fake import FakeKubeServer
from tests.slurm_bed import SlurmTestBed

pytestmark = pytest.mark.slurm


@pytest.fixture
async def kill_bed(
    temporal_client: Client, slurm_bed: SlurmTestBed, tmp_path: Path, task_queue: str
) -> AsyncIterator[KillBed]:
    partition = slurm_bed.make_partition(nodes=2, cpus=2)
    kube = FakeKubeServer().start()
    for name in partition.node_names:
        kube.create_node(name, cpu="2", memory="8000Mi", labels={keys.LABEL_EXTERNAL_NODE: "true"})
    env = worker_env(
        temporal_address=temporal_client.service_client.config.target_host,
        task_queue=task_queue,
        slurm=slurm_bed,
        kubeconfig=kube.kubeconfig(tmp_path / "kubeconfig"),
        partition=partition.name,
    )
    bed = KillBed(kube, slurm_bed, partition.name, env, tmp_path)
    try:
        yield bed
    finally:
        await bed.stop_worker()
        kube.stop()
        partition.cleanup()


@pytest.mark.parametrize("kind", list(Kind), ids=lambda kind: kind.value)
async def test_a_worker_killed_at_any_step_loses_and_duplicates_nothing(
    kill_bed: KillBed, kind: Kind
) -> None:
    outcomes = [await place_with_kill(kill_bed, kind, point, f"k{i}") for i, point in enumerate(KillPoint)]

    assert [v for o in outcomes for v in o.violations()] == []
    assert all(o.killed for o in outcomes)
    assert kill_bed.starts == 1 + len(KillPoint)  # one worker, then one after each kill
