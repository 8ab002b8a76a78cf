"""Fixtures on the real Slurm test bed (hack/slurm-sid.sh): no fakes, no skips.

`slurm_bed` itself is session-wide, in tests/conftest.py.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from bridge.keys import EXTERNAL_JOB_FLAG
from clients.slurm_client import SlurmClient
from testbed.slurm_bed import BedJob, SlurmBedError, SlurmTestBed, TestPartition
from testbed.waiting import wait_until

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


@dataclass
class BridgeNodes:
    """External nodes in slurm.conf's static partitions (slurm-bridge, bridge-low, bridge-high).

    Those partitions hold every node with the feature slurm-bridge, other
    sessions' too; `submit` pins a job to these nodes by their own feature
    `tag`, and their high Weight keeps other sessions' jobs away while any
    other node is free.
    """

    bed: SlurmTestBed
    tag: str
    names: list[str]
    jobs: list[int] = field(default_factory=list)

    def submit(self, partition: str, **fields: Any) -> int:
        """An external job (1 CPU, 100 MB unless `fields` say otherwise) on one of these nodes."""
        job: dict[str, Any] = {
            "name": self.tag,
            "flags": [EXTERNAL_JOB_FLAG],
            "partition": partition,
            "constraints": self.tag,
            "current_working_directory": "/tmp",
            "nodes": "1",
            "tasks": 1,
            "cpus_per_task": 1,
            "memory_per_node": {"set": True, "infinite": False, "number": 100},
            "time_limit": {"set": True, "infinite": False, "number": 10},
            **fields,
        }
        response = self.bed.rest("POST", "/job/submit", {"job": job})
        if response.status_code != 200:
            raise SlurmBedError(f"submit: HTTP {response.status_code} {response.text[:300]}")
        job_id = int(response.json()["job_id"])
        self.jobs.append(job_id)
        return job_id

    def job(self, job_id: int) -> dict[str, Any]:
        response = self.bed.rest("GET", f"/job/{job_id}")
        if response.status_code != 200:
            raise SlurmBedError(f"GET /job/{job_id}: HTTP {response.status_code} {response.text[:300]}")
        job: dict[str, Any] = response.json()["jobs"][0]
        return job

    def cleanup(self) -> None:
        live = [job_id for job_id, states in self.bed.job_states(self.jobs).items() if not _ended(states)]
        for job_id in live:
            self.bed.cancel_job(job_id)
        wait_until(
            lambda: all(_ended(states) for states in self.bed.job_states(live).values()),
            f"jobs {live} ended",
            timeout=15,
        )
        self.bed.delete_nodes(self.names)


MakeBridgeNodes = Callable[..., BridgeNodes]


@pytest.fixture
def bridge_nodes(slurm_bed: SlurmTestBed) -> Iterator[MakeBridgeNodes]:
    """`bridge_nodes(*gres, cpus=4, memory_mb=8000)`: one node per `gres` ("" for none, "gpu:4").

    Registered the way the bridge does it (`POST /new/node/`); their jobs and
    the nodes themselves are removed after the test.
    """
    made: list[BridgeNodes] = []

    def make(*gres: str, cpus: int = 4, memory_mb: int = 8000) -> BridgeNodes:
        tag = f"tb-{secrets.token_hex(4)}"
        nodes = BridgeNodes(slurm_bed, tag, [])
        made.append(nodes)
        for index, node_gres in enumerate(gres or ("",), start=1):
            name = f"{tag}-n{index}"
            words = [
                f"NodeName={name}",
                "State=EXTERNAL",
                f"CPUs={cpus}",
                "Sockets=1",
                f"CoresPerSocket={cpus}",
                "ThreadsPerCore=1",
                f"RealMemory={memory_mb}",
                "NodeAddr=127.0.0.1",
                f"Features=slurm-bridge,{tag}",
                "Weight=60000",
            ]
            if node_gres:
                words.append(f"Gres={node_gres}")
            response = slurm_bed.rest("POST", "/new/node/", {"node_conf": " ".join(words)})
            if response.status_code != 200:
                raise SlurmBedError(
                    f"POST /new/node/ {name}: HTTP {response.status_code} {response.text[:300]}"
                )
            nodes.names.append(name)
        return nodes

    yield make
    for nodes in made:
        nodes.cleanup()


def _ended(states: tuple[str, ...]) -> bool:
    return BedJob(0, states).ended
