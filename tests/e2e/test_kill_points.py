"""SIGKILL the real worker process at every step of a placement, for a pod and for a group.

Each kill lands between two side effects (testbed/kill_points.py); a new worker process
takes over. Afterwards exactly one Slurm job ever existed per placement, every pod was bound
(each on its own node) and then released, no job outlives its pods, no pod keeps the finalizer,
and the new worker took over well before the 60 s attempt timeout (a killed worker's step is
noticed by its missing heartbeat). The soak (bench/soak.py) does the same at random, many times.
"""

import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from bridge import keys
from bridge.models import admin_comment_for
from bridge.sweep import SweepResult
from testbed.kill_points import HoldingKube, KillBed, KillPoint, Kind, place_with_kill, worker_env
from testbed.kube_fake import FakeKubeServer
from testbed.kube_real.proxy import ProxiedCluster
from testbed.slurm_bed import SlurmTestBed
from testbed.waiting import until
from tests.e2e.conftest import ON_REAL_KUBE
from tests.e2e.harness import bed_client, run_scheduled
from tests.slurm.test_slurm_client import external_job
from worker.schedules import sweep_schedule_id

pytestmark = [pytest.mark.slurm, ON_REAL_KUBE]


@pytest.fixture
async def kill_bed(
    temporal_client: Client,
    slurm_bed: SlurmTestBed,
    tmp_path: Path,
    task_queue: str,
    kube_backend: str,
    request: pytest.FixtureRequest,
) -> AsyncIterator[KillBed]:
    partition = slurm_bed.make_partition(nodes=2, cpus=2)
    kube: HoldingKube
    if kube_backend == "real":
        # The real API server, through a proxy that parks the step's request.
        kube = ProxiedCluster(request.getfixturevalue("real_apiserver"), partition.name)
    else:
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


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(Kind), ids=lambda kind: kind.value)
async def test_a_worker_killed_at_any_step_loses_and_duplicates_nothing(
    kill_bed: KillBed, kind: Kind
) -> None:
    outcomes = [await place_with_kill(kill_bed, kind, point, f"k{i}") for i, point in enumerate(KillPoint)]

    assert [v for o in outcomes for v in o.violations()] == []
    assert all(o.killed for o in outcomes)
    assert kill_bed.starts == 1 + len(KillPoint)  # one worker, then one after each kill


async def test_the_worker_sweeps_only_its_own_installation_on_a_shared_slurm(
    kill_bed: KillBed, temporal_client: Client, slurm_bed: SlurmTestBed
) -> None:
    """Another run's bridge job on the same Slurm (the default installation, its pods in another
    cluster) is not this worker's to sweep. Before each bed was an installation of its own, a
    soak's sweep cancelled such jobs of the tests running beside it."""
    assert kill_bed.installation != keys.DEFAULT_INSTALLATION
    other = slurm_bed.make_partition(nodes=1, cpus=1)
    namespace = f"elsewhere-{secrets.token_hex(3)}"
    slurm = bed_client(slurm_bed)
    try:
        job_id = await slurm.submit_job(
            external_job(
                other.name,
                comment=f"placement/{keys.DEFAULT_INSTALLATION}/{namespace}/p/u1@u1",
                admin_comment=admin_comment_for([f"{namespace}/p"]),
            )
        )
        await kill_bed.ensure_worker()
        result = await run_sweep(temporal_client, sweep_schedule_id(kill_bed.installation))
        assert result.cancelled == 0, result
        assert result.others >= 1, result  # seen, and left alone
        assert slurm_bed.job_states([job_id])[job_id][0] in ("PENDING", "RUNNING")
        await slurm.cancel_job(job_id)
    finally:
        await slurm.close()
        other.cleanup()


async def run_sweep(temporal: Client, schedule_id: str, timeout: float = 60) -> SweepResult:
    """Run the worker's sweep schedule (created when the worker starts) once; that run's result."""
    handle = temporal.get_schedule_handle(schedule_id)

    async def created() -> bool:  # polling Temporal for the schedule the worker creates: it sends no event
        await handle.describe()  # RPCError (not found) until then
        return True

    await until(created, f"the worker to create schedule {schedule_id}", timeout, 0.1, ignoring=RPCError)
    return await run_scheduled(temporal, schedule_id, SweepResult, timeout)
