"""Fixtures on the real Slurm test bed (hack/slurm-sid.sh): no fakes, no skips.

`slurm_bed` itself is session-wide, in tests/conftest.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from activities.slurm_client import SlurmClient
from tests.slurm_bed import SlurmTestBed, TestPartition

MakePartition = Callable[..., TestPartition]


@pytest.fixture
def slurm_partition(slurm_bed: SlurmTestBed) -> Iterator[MakePartition]:
    """`slurm_partition(nodes=1, cpus=4, memory_mb=8000, gres=None)`: a private partition.

    Everything it made is cleaned up after the test, and then no job of those
    partitions may still be live.
    """
    made: list[TestPartition] = []

    def make(nodes: int = 1, cpus: int = 4, memory_mb: int = 8000, gres: str | None = None) -> TestPartition:
        partition = slurm_bed.make_partition(nodes=nodes, cpus=cpus, memory_mb=memory_mb, gres=gres)
        made.append(partition)
        return partition

    yield make
    for partition in made:
        partition.cleanup()
    for partition in made:
        live = [job for job in slurm_bed.jobs_in_partition(partition.name) if not job.ended]
        assert not live, f"jobs left live in partition {partition.name}: {live}"


@pytest.fixture
async def slurm_client(slurm_bed: SlurmTestBed) -> AsyncIterator[SlurmClient]:
    async with SlurmClient(
        slurm_bed.rest_url, user_name=slurm_bed.user_name, token_file=slurm_bed.jwt_file
    ) as client:
        yield client
