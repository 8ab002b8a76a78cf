"""SlurmClient against the real slurmctld + slurmrestd (hack/slurm-sid.sh)."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bridge.hostlist import compress
from bridge.keys import EXTERNAL_JOB_FLAG
from bridge.slurm_api import JobDescMsg, JobInfo, Uint32NoVal, Uint64NoVal, UpdateNodeMsg
from clients.slurm_client import SlurmClient
from clients.slurm_errors import (
    ESLURM_INVALID_JOB_ID,
    ESLURM_INVALID_NODE_NAME,
    ESLURM_NODES_BUSY,
    SLURM_PROTOCOL_AUTHENTICATION_ERROR,
    SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR,
    SlurmAuthError,
    SlurmNotFound,
    SlurmRejected,
    SlurmUnavailable,
)
from testbed import waiting
from testbed.slurm_bed import SlurmTestBed
from tests.slurm.conftest import MakePartition

pytestmark = pytest.mark.slurm

# Far above any job id this bed hands out, below MaxJobId.
UNKNOWN_JOB_ID = 66_000_000
POLL_INTERVAL = 0.05
DEADLINE = 15.0


def external_job(partition: str, /, **fields: Any) -> JobDescMsg:
    """A placeholder job shaped like the bridge's: EXTERNAL_JOB, no script."""
    base: dict[str, Any] = {
        "name": f"test/{secrets.token_hex(3)}",
        "flags": [EXTERNAL_JOB_FLAG],
        "partition": partition,
        "current_working_directory": "/tmp",
        "minimum_nodes": 1,
        "maximum_nodes": 1,
        "nodes": "1",
        "tasks": 1,
        "cpus_per_task": 1,
        "memory_per_node": Uint64NoVal(set=True, infinite=False, number=1024),
        "time_limit": Uint32NoVal(set=True, infinite=False, number=60),
    }
    base.update(fields)
    return JobDescMsg.model_validate(base)


async def wait_for_job(
    client: SlurmClient, job_id: int, until: Callable[[JobInfo], bool], what: str
) -> JobInfo:
    """Poll slurmctld (a third-party system this test observes) until `until(job)`."""
    seen: list[JobInfo] = []

    async def reached() -> JobInfo | None:
        seen[:] = [job := await client.get_job(job_id)]
        return job if until(job) else None

    def last() -> str:
        return f"job {job_id} {what} (last {seen[0].job_state} {seen[0].state_reason})" if seen else what

    return await waiting.until(reached, last, DEADLINE, POLL_INTERVAL)


def in_state(state: str) -> Callable[[JobInfo], bool]:
    return lambda job: state in (job.job_state or [])


async def test_external_job_runs_with_its_allocation(
    slurm_client: SlurmClient, slurm_partition: MakePartition
) -> None:
    partition = slurm_partition()
    comment = '{"pods":["default/nginx-1"]}'
    job_id = await slurm_client.submit_job(
        external_job(partition.name, cpus_per_task=2, admin_comment=comment)
    )

    job = await wait_for_job(slurm_client, job_id, in_state("RUNNING"), "RUNNING")

    node = partition.node_names[0]
    assert job.job_id == job_id
    assert job.partition == partition.name
    assert job.nodes == node
    assert EXTERNAL_JOB_FLAG in (job.flags or [])
    assert job.admin_comment == comment
    assert job.job_resources is not None
    assert job.job_resources.nodes is not None
    [allocation] = job.job_resources.nodes.allocation or []
    assert allocation.name == node
    assert allocation.cpus is not None
    assert allocation.cpus.count == 2
    assert allocation.memory is not None
    assert allocation.memory.allocated == 1024

    [layout] = await slurm_client.get_job_resources(job_id)
    assert layout.node == node
    assert layout.mem_alloc == 1024
    assert layout.core_bitmap is not None
    assert bin(int(layout.core_bitmap, 16)).count("1") == 2


async def test_job_spans_nodes(slurm_client: SlurmClient, slurm_partition: MakePartition) -> None:
    partition = slurm_partition(nodes=2, cpus=2, memory_mb=2000)
    job = external_job(partition.name, minimum_nodes=2, maximum_nodes=2, nodes="2", tasks=2)
    job_id = await slurm_client.submit_job(job)

    running = await wait_for_job(slurm_client, job_id, in_state("RUNNING"), "RUNNING")

    assert running.nodes == compress(partition.node_names)
    assert running.job_resources is not None
    assert running.job_resources.nodes is not None
    allocated = [entry.name for entry in running.job_resources.nodes.allocation or []]
    assert allocated == partition.node_names
    assert {layout.node for layout in await slurm_client.get_job_resources(job_id)} == set(
        partition.node_names
    )


async def test_update_pending_job(slurm_client: SlurmClient, slurm_partition: MakePartition) -> None:
    partition = slurm_partition(cpus=4)
    holder = await slurm_client.submit_job(external_job(partition.name, cpus_per_task=2))
    await wait_for_job(slurm_client, holder, in_state("RUNNING"), "RUNNING")
    job_id = await slurm_client.submit_job(external_job(partition.name, cpus_per_task=4))
    pending = await wait_for_job(
        slurm_client, job_id, lambda job: job.state_reason == "Resources", "pending on Resources"
    )
    assert pending.job_state == ["PENDING"]

    # Observed: cpus_per_task alone leaves the job's min_cpus and pn_min_cpus at
    # 4 and it keeps waiting; all three must shrink for it to fit.
    update = JobDescMsg(
        cpus_per_task=2,
        minimum_cpus=2,
        minimum_cpus_per_node=2,
        admin_comment='{"updated":true}',
        time_limit=Uint32NoVal(set=True, infinite=False, number=30),
    )
    await slurm_client.update_job(job_id, update)

    running = await wait_for_job(slurm_client, job_id, in_state("RUNNING"), "RUNNING after the update")
    assert running.cpus_per_task is not None
    assert running.cpus_per_task.number == 2
    assert running.admin_comment == '{"updated":true}'
    assert running.time_limit is not None
    assert running.time_limit.number == 30


async def test_job_bigger_than_any_node_pends_and_cannot_be_updated(
    slurm_client: SlurmClient, slurm_partition: MakePartition
) -> None:
    partition = slurm_partition(cpus=4)
    # 64 CPUs on 4-CPU nodes is not an error: HTTP 200 (with warnings), then PENDING.
    job_id = await slurm_client.submit_job(external_job(partition.name, cpus_per_task=64))
    pending = await wait_for_job(
        slurm_client, job_id, lambda job: job.state_reason == "PartitionConfig", "pending on PartitionConfig"
    )
    assert pending.job_state == ["PENDING"]

    # Observed: slurmctld re-checks the partition on every update of such a job
    # and refuses any change, even one to admin_comment alone.
    with pytest.raises(SlurmRejected, match="Requested partition configuration not available now") as caught:
        await slurm_client.update_job(job_id, JobDescMsg(admin_comment="x"))
    assert 2015 in caught.value.error_numbers


async def test_update_running_job_size_is_rejected(
    slurm_client: SlurmClient, slurm_partition: MakePartition
) -> None:
    partition = slurm_partition()
    job_id = await slurm_client.submit_job(external_job(partition.name))
    await wait_for_job(slurm_client, job_id, in_state("RUNNING"), "RUNNING")

    with pytest.raises(SlurmRejected, match="no longer pending") as caught:
        await slurm_client.update_job(job_id, JobDescMsg(cpus_per_task=2))
    assert caught.value.status == 422
    assert not caught.value.retryable


async def test_cancel_job(slurm_client: SlurmClient, slurm_partition: MakePartition) -> None:
    partition = slurm_partition()
    job_id = await slurm_client.submit_job(external_job(partition.name))
    await wait_for_job(slurm_client, job_id, in_state("RUNNING"), "RUNNING")

    await slurm_client.cancel_job(job_id)

    job = await slurm_client.get_job(job_id)
    assert job.job_state == ["CANCELLED"]  # external jobs skip COMPLETING
    await slurm_client.cancel_job(job_id)  # already over: still fine


async def test_unknown_job_is_not_found(slurm_client: SlurmClient) -> None:
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: slurm_client.get_job(UNKNOWN_JOB_ID),
        lambda: slurm_client.cancel_job(UNKNOWN_JOB_ID),
        lambda: slurm_client.update_job(UNKNOWN_JOB_ID, JobDescMsg(comment="x")),
        lambda: slurm_client.get_job_resources(UNKNOWN_JOB_ID),
    ]
    for call in calls:
        with pytest.raises(SlurmNotFound, match="Invalid job id specified") as caught:
            await call()
        assert ESLURM_INVALID_JOB_ID in caught.value.error_numbers
        assert not caught.value.retryable


@pytest.mark.parametrize(
    ("fields", "status", "number", "text"),
    [
        ({"partition": "no-such-partition"}, 422, 2000, "Invalid partition name specified"),
        ({"script": "#!/bin/sh\ntrue"}, 500, 2189, "Invalid configuration for external job"),
        ({"flags": []}, 422, 9000, 'Populated "script" field is required'),
        ({"required_nodes": ["no-such-node"]}, 422, ESLURM_INVALID_NODE_NAME, "Invalid node name specified"),
        (
            {"memory_per_node": Uint64NoVal(set=True, infinite=False, number=10**6)},
            422,
            2014,
            "Requested node configuration is not available",
        ),
        ({"constraints": "no-such-feature"}, 422, 2029, "Invalid feature specification"),
    ],
)
async def test_rejected_submissions(
    slurm_client: SlurmClient,
    slurm_partition: MakePartition,
    fields: dict[str, Any],
    status: int,
    number: int,
    text: str,
) -> None:
    partition = slurm_partition()
    with pytest.raises(SlurmRejected) as caught:
        await slurm_client.submit_job(external_job(partition.name, **fields))
    assert caught.value.status == status
    assert number in caught.value.error_numbers
    assert text in str(caught.value)
    assert not caught.value.retryable


async def test_unknown_account_is_accepted_without_accounting(
    slurm_client: SlurmClient, slurm_partition: MakePartition
) -> None:
    # accounting_storage/none: slurmctld does not check accounts at all.
    partition = slurm_partition()
    job_id = await slurm_client.submit_job(external_job(partition.name, account="no-such-account"))
    job = await wait_for_job(slurm_client, job_id, in_state("RUNNING"), "RUNNING")
    assert job.account == "no-such-account"


async def test_bad_token_is_an_auth_error(
    slurm_bed: SlurmTestBed, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    bad = f"not-a-jwt-{secrets.token_hex(8)}"
    token_file = tmp_path / "jwt"
    token_file.write_text(bad)
    async with SlurmClient(
        slurm_bed.rest_url, user_name=slurm_bed.user_name, token_file=token_file
    ) as client:
        with pytest.raises(SlurmAuthError, match="Protocol authentication error") as caught:
            await client.list_jobs()
        assert caught.value.status == 511
        assert SLURM_PROTOCOL_AUTHENTICATION_ERROR in caught.value.error_numbers
        assert caught.value.retryable
        for text in (str(caught.value), repr(caught.value), repr(client), caplog.text):
            assert bad not in text


async def test_missing_token_headers_are_an_auth_error(slurm_bed: SlurmTestBed) -> None:
    async with SlurmClient(slurm_bed.rest_url, user_name=None, token_file=None) as client:
        with pytest.raises(SlurmAuthError, match="Authentication failure") as caught:
            await client.list_partitions()
    assert caught.value.status == 401


async def test_token_is_reread_on_every_request(
    slurm_bed: SlurmTestBed, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    good = slurm_bed.token()
    token_file = tmp_path / "jwt"
    async with SlurmClient(
        slurm_bed.rest_url, user_name=slurm_bed.user_name, token_file=token_file
    ) as client:
        token_file.write_text(f"SLURM_JWT={good}\n")  # `scontrol token` output works as is
        assert await client.list_partitions()

        token_file.write_text("expired-or-revoked\n")
        with pytest.raises(SlurmAuthError):
            await client.list_partitions()

        token_file.write_text(good)
        assert await client.list_partitions()
    assert good not in caplog.text


async def test_errors_never_carry_the_token(
    slurm_client: SlurmClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    token = slurm_client.token_file.read_text().strip() if slurm_client.token_file else ""
    assert token
    with pytest.raises(SlurmNotFound) as caught:
        await slurm_client.get_job(UNKNOWN_JOB_ID)
    for text in (str(caught.value), repr(caught.value), repr(slurm_client), caplog.text):
        assert token not in text


@pytest.mark.exclusive  # needs a second in which no test changes a job: none runs beside it
async def test_list_jobs_reports_changes_since_update_time(
    slurm_client: SlurmClient, slurm_partition: MakePartition
) -> None:
    partition = slurm_partition()
    first = await slurm_client.list_jobs()
    quiet = await wait_for_no_change(slurm_client, first.update_time)

    job_id = await slurm_client.submit_job(external_job(partition.name))
    await wait_for_job(slurm_client, job_id, in_state("RUNNING"), "RUNNING")
    changed = await slurm_client.list_jobs(update_time=quiet)
    assert job_states(changed.jobs)[job_id] == ["RUNNING"]
    assert changed.update_time >= quiet

    # The cancel lands right after an answer (usually within the same second as
    # its last_update): the next call must still report it.
    before_cancel = await slurm_client.list_jobs(update_time=changed.update_time)
    await slurm_client.cancel_job(job_id)
    after_cancel = await slurm_client.list_jobs(update_time=before_cancel.update_time)
    assert job_states(after_cancel.jobs)[job_id] == ["CANCELLED"]

    await wait_for_no_change(slurm_client, after_cancel.update_time)


async def wait_for_no_change(client: SlurmClient, update_time: int) -> int:
    """Carry update_time forward until an answer reports no change; return that update_time.

    Other test sessions may share this Slurm, so a quiet second is awaited, not assumed.
    """
    latest = [update_time]

    async def quiet() -> bool:
        answer = await client.list_jobs(update_time=latest[0])
        if not answer.jobs:
            assert answer.update_time == latest[0]  # "no change" keeps the caller's time
            return True
        assert answer.update_time >= latest[0]
        latest[0] = answer.update_time
        return False

    await waiting.until(quiet, "an answer with no change (jobs kept changing)", DEADLINE, interval=0.2)
    return latest[0]


def job_states(jobs: list[JobInfo]) -> dict[int, list[str]]:
    return {job.job_id: list(job.job_state or []) for job in jobs if job.job_id is not None}


async def test_node_lifecycle(slurm_client: SlurmClient, slurm_bed: SlurmTestBed) -> None:
    name = f"sbt-node-{secrets.token_hex(4)}"
    node_conf = (
        f"NodeName={name} Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 CPUs=2 RealMemory=2000"
        f" State=EXTERNAL Features=sbt NodeAddr=127.0.0.1"
    )
    try:
        await slurm_client.create_node(node_conf)
        node = await slurm_client.get_node(name)
        assert node is not None
        assert node.cpus == 2
        assert node.real_memory == 2000
        assert {"IDLE", "EXTERNAL"} <= set(node.state or [])
        assert name in {entry.name for entry in await slurm_client.list_nodes()}

        with pytest.raises(SlurmRejected, match="already exists"):
            await slurm_client.create_node(node_conf)

        await slurm_client.update_node(name, UpdateNodeMsg(state=["DRAIN"], reason="slurm-bridge: test"))
        drained = await slurm_client.get_node(name)
        assert drained is not None
        assert "DRAIN" in (drained.state or [])
        assert drained.reason == "slurm-bridge: test"

        await slurm_client.update_node(name, UpdateNodeMsg(state=["UNDRAIN"]))
        undrained = await slurm_client.get_node(name)
        assert undrained is not None
        assert "DRAIN" not in (undrained.state or [])

        await slurm_client.delete_node(name)
        assert await slurm_client.get_node(name) is None
        with pytest.raises(SlurmNotFound) as caught:
            await slurm_client.delete_node(name)
        assert ESLURM_INVALID_NODE_NAME in caught.value.error_numbers
        with pytest.raises(SlurmNotFound):
            await slurm_client.update_node(name, UpdateNodeMsg(state=["DRAIN"], reason="x"))
    finally:
        slurm_bed.scontrol_quiet("delete", f"NodeName={name}")


async def test_bad_node_conf_is_rejected(slurm_client: SlurmClient) -> None:
    with pytest.raises(SlurmRejected) as caught:
        await slurm_client.create_node("this is not a node line")
    assert caught.value.status == 500  # slurmrestd: "Unspecified error" (-1)


async def test_busy_node_cannot_be_deleted(slurm_client: SlurmClient, slurm_partition: MakePartition) -> None:
    partition = slurm_partition()
    job_id = await slurm_client.submit_job(external_job(partition.name))
    await wait_for_job(slurm_client, job_id, in_state("RUNNING"), "RUNNING")

    with pytest.raises(SlurmRejected, match="busy") as caught:
        await slurm_client.delete_node(partition.node_names[0])
    assert ESLURM_NODES_BUSY in caught.value.error_numbers


async def test_unknown_node_is_none(slurm_client: SlurmClient) -> None:
    assert await slurm_client.get_node(f"no-such-node-{secrets.token_hex(3)}") is None


async def test_partitions(slurm_client: SlurmClient, slurm_partition: MakePartition) -> None:
    partition = slurm_partition(nodes=2)

    info = await slurm_client.get_partition(partition.name)

    assert info is not None
    assert info.nodes is not None
    assert info.nodes.configured == partition.nodes_expression
    assert info.nodes.total == 2
    assert partition.name in {entry.name for entry in await slurm_client.list_partitions()}
    assert await slurm_client.get_partition(f"no-such-partition-{secrets.token_hex(3)}") is None


async def test_slurmctld_counts_a_jobs_start(
    slurm_bed: SlurmTestBed, slurm_client: SlurmClient, slurm_partition: MakePartition
) -> None:
    """What the job watcher's gate stands on: slurmctld's statistics count an external job's start
    once it runs (other tests' jobs count too: at least one more)."""
    partition = slurm_partition()
    job_id = await slurm_client.submit_job(external_job(partition.name, hold=True))
    before = await slurm_client.jobs_started()
    await asyncio.to_thread(slurm_bed.scontrol, "release", str(job_id))
    await wait_for_job(slurm_client, job_id, in_state("RUNNING"), "running")
    assert await slurm_client.jobs_started() > before
    await slurm_client.cancel_job(job_id)


async def test_ping(slurm_client: SlurmClient) -> None:
    [controller] = await slurm_client.ping()
    assert controller.responding is True
    assert controller.primary is True


async def test_slurmctld_unreachable_is_unavailable(slurm_bed: SlurmTestBed) -> None:
    # A slurmrestd of this test's own whose slurmctld never answers: what a stopped slurmctld
    # looks like to a client, while every other test keeps the shared one.
    restd = await asyncio.to_thread(slurm_bed.unreachable_controller_slurmrestd)
    try:
        # slurmrestd gives up on slurmctld after its own retries (usually 10 s, seen up to
        # 30 s on a loaded machine): 502, error 1800. The client waits longer than that.
        async with SlurmClient(
            restd.url, user_name=slurm_bed.user_name, token_file=slurm_bed.jwt_file, timeout=90
        ) as patient:
            with pytest.raises(SlurmUnavailable, match="Unable to contact slurm controller") as caught:
                await patient.list_jobs()
        assert caught.value.status == 502
        assert SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR in caught.value.error_numbers
        assert caught.value.retryable

        # A client that waits less than slurmrestd does times out itself: also unavailable.
        async with SlurmClient(
            restd.url,
            user_name=slurm_bed.user_name,
            token_file=slurm_bed.jwt_file,
            timeout=1,
            listing_timeout=1,  # a listing may wait longer than point requests; not here
        ) as impatient:
            with pytest.raises(SlurmUnavailable, match="no answer from slurmrestd") as timed_out:
                await impatient.list_jobs()
        assert timed_out.value.status is None
        assert timed_out.value.retryable
    finally:
        await asyncio.to_thread(restd.stop)


async def test_job_states_names_each_job_and_leaves_out_unknown_ones(
    slurm_bed: SlurmTestBed, slurm_partition: MakePartition
) -> None:
    partition = slurm_partition()
    requests: list[str] = []
    async with SlurmClient(
        slurm_bed.rest_url,
        user_name=slurm_bed.user_name,
        token_file=slurm_bed.jwt_file,
        observer=lambda operation, outcome, seconds: requests.append(f"{operation} {outcome}"),
    ) as client:
        held = [await client.submit_job(external_job(partition.name, hold=True)) for _ in range(5)]
        running = await client.submit_job(external_job(partition.name))
        await wait_for_job(client, running, in_state("RUNNING"), "RUNNING")
        requests.clear()

        # Chunks of 2: the repeated parameter (the CSV form answers 500) in 4 requests.
        states = await client.job_states([*held, running, UNKNOWN_JOB_ID], chunk_size=2)

        assert states == {**{job_id: ["PENDING"] for job_id in held}, running: ["RUNNING"]}
        assert UNKNOWN_JOB_ID not in states  # Slurm does not know it: left out, no error
        assert requests == ["GET /jobs/state/ ok"] * 4

        await client.cancel_job(running)
        assert await client.job_states([running]) == {running: ["CANCELLED"]}
        assert await client.job_states([UNKNOWN_JOB_ID]) == {}
        requests.clear()
        assert await client.job_states([]) == {}
        assert requests == []  # nothing to ask, nothing asked

        # A listing is counted as an operation of its own.
        await client.list_jobs()
        assert requests == ["GET /jobs/ ok"]
