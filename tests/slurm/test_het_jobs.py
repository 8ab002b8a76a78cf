"""Heterogeneous external jobs (one Slurm job, one component per pod shape) on the real Slurm.

What the client relies on, as slurmctld 26.05.5 answered here: the components get
consecutive ids (leader + offset) and `het_job_id` = the leader; `GET /jobs/state/`
answers them as "<component id>+<offset>" strings (every component for the leader's id,
a component twice when it is asked for beside its leader); `GET /job/{leader}` answers
every component in offset order, `GET /job/{component}` that component alone;
`DELETE /job/{leader}` ends them all, `DELETE /job/{component}` that component alone.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import pytest

from bridge.hostlist import compress
from bridge.keys import EXTERNAL_JOB_FLAG
from bridge.slurm_api import JobDescMsg, JobInfo, Uint32NoVal, Uint64NoVal
from clients.slurm_client import SlurmClient
from clients.slurm_errors import SlurmRejected
from testbed import waiting
from tests.slurm.conftest import MakePartition

pytestmark = pytest.mark.slurm

POLL_INTERVAL = 0.05
DEADLINE = 15.0


def component(partition: str, /, nodes: int, cpus: int, **fields: Any) -> JobDescMsg:
    """One component: `nodes` nodes with one task of `cpus` CPUs each, EXTERNAL_JOB, no script."""
    base: dict[str, Any] = {
        "name": f"het/{secrets.token_hex(3)}",
        "flags": [EXTERNAL_JOB_FLAG],
        "partition": partition,
        "current_working_directory": "/tmp",
        "minimum_nodes": nodes,
        "maximum_nodes": nodes,
        "nodes": str(nodes),
        "tasks": nodes,
        "cpus_per_task": cpus,
        "memory_per_node": Uint64NoVal(set=True, infinite=False, number=100),
        "time_limit": Uint32NoVal(set=True, infinite=False, number=10),
    }
    base.update(fields)
    return JobDescMsg.model_validate(base)


async def wait_for_state(
    client: SlurmClient, job_id: int, until: Callable[[list[str]], bool], what: str
) -> None:
    """Poll `job_states` (the leader's id; Slurm has no watch) until `until(states)`."""
    seen: list[list[str] | None] = [None]

    async def reached() -> bool:
        seen[0] = states = (await client.job_states([job_id])).get(job_id)
        return states is not None and until(states)

    await waiting.until(reached, lambda: f"het job {job_id} {what} (last {seen[0]})", DEADLINE, POLL_INTERVAL)


def number(value: Any) -> int | None:
    return value.number if value is not None and value.set else None


def allocated_cpus(job: JobInfo) -> dict[str, int]:
    """Node name -> CPUs this component holds there."""
    assert job.job_resources is not None
    assert job.job_resources.nodes is not None
    return {
        entry.name or "": (entry.cpus.count or 0) if entry.cpus is not None else 0
        for entry in job.job_resources.nodes.allocation or []
    }


async def test_het_external_job_runs_each_component_on_its_own_nodes_and_ends_with_its_leader(
    slurm_client: SlurmClient, slurm_partition: MakePartition
) -> None:
    partition = slurm_partition(nodes=3, cpus=4)
    leader = await slurm_client.submit_het_job(
        [
            component(partition.name, nodes=1, cpus=1, admin_comment="leader"),
            component(partition.name, nodes=2, cpus=2, admin_comment="workers"),
        ]
    )

    await wait_for_state(slurm_client, leader, lambda states: "RUNNING" in states, "RUNNING")

    components = await slurm_client.get_job_components(leader)
    assert [job.job_id for job in components] == [leader, leader + 1]  # consecutive ids
    assert [number(job.het_job_id) for job in components] == [leader, leader]
    assert [number(job.het_job_offset) for job in components] == [0, 1]
    assert all("RUNNING" in (job.job_state or []) for job in components)  # started together
    first, second = components
    assert first.admin_comment == "leader"  # each component keeps its own comment
    assert second.admin_comment == "workers"
    # Each component its own size: 1 node x 1 CPU, then 2 other nodes x 2 CPUs.
    first_cpus, second_cpus = allocated_cpus(first), allocated_cpus(second)
    assert list(first_cpus.values()) == [1]
    assert list(second_cpus.values()) == [2, 2]
    assert set(first_cpus).isdisjoint(second_cpus)
    assert sorted([*first_cpus, *second_cpus]) == partition.node_names
    assert second.nodes == compress(sorted(second_cpus))
    assert number(first.cpus) == 1
    assert number(second.cpus) == 4

    # A non-leader id names the whole het job too.
    assert [job.job_id for job in await slurm_client.get_job_components(leader + 1)] == [leader, leader + 1]
    # Every state answer is under the leader's id, duplicates ("<id>+1" twice) folded.
    assert await slurm_client.job_states([leader]) == {leader: ["RUNNING"]}
    assert await slurm_client.job_states([leader + 1]) == {leader: ["RUNNING"]}
    assert await slurm_client.job_states([leader, leader + 1]) == {leader: ["RUNNING"]}
    # get_job of the leader is the leader's component.
    assert (await slurm_client.get_job(leader)).job_id == leader

    await slurm_client.cancel_job(leader)

    await wait_for_state(slurm_client, leader, lambda states: "CANCELLED" in states, "CANCELLED")
    ended = await slurm_client.get_job_components(leader)
    assert [job.job_state for job in ended] == [["CANCELLED"], ["CANCELLED"]]


async def test_a_component_that_ended_alone_ends_the_het_jobs_state(
    slurm_client: SlurmClient, slurm_partition: MakePartition
) -> None:
    partition = slurm_partition(nodes=3, cpus=4)
    leader = await slurm_client.submit_het_job(
        [component(partition.name, nodes=1, cpus=1), component(partition.name, nodes=2, cpus=2)]
    )
    await wait_for_state(slurm_client, leader, lambda states: "RUNNING" in states, "RUNNING")

    # Cancelling a non-leader id ends that component only; the leader runs on.
    await slurm_client.cancel_job(leader + 1)

    await wait_for_state(slurm_client, leader, lambda states: "CANCELLED" in states, "CANCELLED")
    first, second = await slurm_client.get_job_components(leader)
    assert first.job_state == ["RUNNING"]
    assert second.job_state == ["CANCELLED"]

    await slurm_client.cancel_job(leader)  # the rest; one already ended is no error
    first, second = await slurm_client.get_job_components(leader)
    assert first.job_state == ["CANCELLED"]


async def test_a_het_job_pends_as_a_whole_while_one_component_cannot_start(
    slurm_client: SlurmClient, slurm_partition: MakePartition
) -> None:
    partition = slurm_partition(nodes=2, cpus=4)
    # The leader would fit at once; the second component needs more CPUs than a node has.
    leader = await slurm_client.submit_het_job(
        [component(partition.name, nodes=1, cpus=1), component(partition.name, nodes=1, cpus=64)]
    )

    await wait_for_state(slurm_client, leader, lambda states: "PENDING" in states, "PENDING")

    async def evaluated() -> int:
        [leader_info, *_] = await slurm_client.get_job_components(leader)
        stamp = leader_info.last_sched_evaluation
        return stamp.number if stamp is not None and stamp.number else 0

    # Still not started after the scheduler has looked at it twice more (its evaluation stamp
    # moved on twice): not a moment too soon to tell.
    for _ in range(2):
        before = await evaluated()

        async def passed(before: int = before) -> bool:
            return await evaluated() > before

        await waiting.until(passed, "a scheduler pass over the pending het job", timeout=15, interval=0.2)
    assert await slurm_client.job_states([leader, leader + 1]) == {leader: ["PENDING"]}
    components = await slurm_client.get_job_components(leader)
    assert [job.job_state for job in components] == [["PENDING"], ["PENDING"]]

    await slurm_client.cancel_job(leader)
    await wait_for_state(slurm_client, leader, lambda states: "CANCELLED" in states, "CANCELLED")


async def test_a_bad_component_refuses_the_whole_het_job(
    slurm_client: SlurmClient, slurm_partition: MakePartition
) -> None:
    partition = slurm_partition()
    with pytest.raises(SlurmRejected) as refused:
        await slurm_client.submit_het_job(
            [component(partition.name, nodes=1, cpus=1), component("no-such-partition", nodes=1, cpus=1)]
        )
    assert refused.value.status == 422
    assert 2000 in refused.value.error_numbers  # ESLURM_INVALID_PARTITION_NAME


async def test_an_ordinary_job_is_its_only_component(
    slurm_client: SlurmClient, slurm_partition: MakePartition
) -> None:
    partition = slurm_partition()
    job_id = await slurm_client.submit_job(component(partition.name, nodes=1, cpus=1))
    await wait_for_state(slurm_client, job_id, lambda states: "RUNNING" in states, "RUNNING")

    [job] = await slurm_client.get_job_components(job_id)
    assert job.job_id == job_id
    assert number(job.het_job_id) == 0  # set, and 0: no het job
    assert await slurm_client.job_states([job_id]) == {job_id: ["RUNNING"]}
    await slurm_client.cancel_job(job_id)
