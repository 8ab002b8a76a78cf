"""SlurmActivities.submit_once against the real Slurm: no listing unless recovering."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import pytest

from activities.slurm import SlurmActivities
from clients.slurm_client import SlurmClient
from testbed.placement_jobs import one_pod_job, placement_id
from testbed.slurm_bed import SlurmTestBed
from tests.slurm.conftest import MakePartition

pytestmark = pytest.mark.slurm


@pytest.fixture
async def observed(slurm_bed: SlurmTestBed) -> AsyncIterator[tuple[SlurmClient, list[str]]]:
    operations: list[str] = []
    async with SlurmClient(
        slurm_bed.rest_url,
        user_name=slurm_bed.user_name,
        token_file=slurm_bed.jwt_file,
        observer=lambda operation, outcome, seconds: operations.append(operation),
    ) as client:
        yield client, operations


async def test_first_attempt_submits_without_listing_and_recovery_adopts(
    observed: tuple[SlurmClient, list[str]], slurm_partition: MakePartition
) -> None:
    client, operations = observed
    partition = slurm_partition()
    activities = SlurmActivities(client)
    token = secrets.token_hex(4)
    pod = f"ns-{token}/pod"
    placement = placement_id("submit-test", pod, token)
    job = one_pod_job(partition.name, pod)
    since = 0

    first = await activities.submit_once(job, placement, since=since, recovery=False)

    assert first.created
    assert operations == ["POST /job/submit"]  # no listing on the normal path
    assert activities.recovery_listings == 0
    submitted = await client.get_job(first.job_id)
    assert submitted.comment == placement

    # A retried attempt (or a reset, an operator retry) finds the job instead of submitting again.
    operations.clear()
    again = await activities.submit_once(job, placement, since=since, recovery=True)

    assert (again.job_id, again.created) == (first.job_id, False)
    assert operations == ["GET /jobs/"]
    assert activities.recovery_listings == 1

    # Recovering when nothing was submitted (or the job is over): submits.
    await client.cancel_job(first.job_id)
    operations.clear()
    fresh = await activities.submit_once(job, placement, since=since, recovery=True)

    assert fresh.created
    assert fresh.job_id != first.job_id
    assert operations == ["GET /jobs/", "POST /job/submit"]
    assert activities.recovery_listings == 2
    await client.cancel_job(fresh.job_id)


async def test_recoveries_at_once_share_their_listings_and_each_finds_its_job(
    observed: tuple[SlurmClient, list[str]], slurm_partition: MakePartition
) -> None:
    # Slurm back after an outage: every placement that was submitting recovers at once.
    client, operations = observed
    partition = slurm_partition()
    activities = SlurmActivities(client)
    token = secrets.token_hex(4)
    pods = [f"ns-{token}/pod-{i}" for i in range(6)]
    placements = {placement_id("submit-test", pod, token): one_pod_job(partition.name, pod) for pod in pods}
    # Their submissions reached Slurm, but the answers were lost.
    submitted = {
        placement: (await activities.submit_once(job, placement, since=0, recovery=False)).job_id
        for placement, job in placements.items()
    }
    operations.clear()

    recovered = await asyncio.gather(
        *(
            activities.submit_once(job, placement, since=0, recovery=True)
            for placement, job in placements.items()
        )
    )

    found = {placement: r.job_id for placement, r in zip(placements, recovered, strict=True)}
    assert found == submitted
    assert not any(r.created for r in recovered)
    # The first listing, and one for all who asked while it ran: never one per recovery.
    assert operations == ["GET /jobs/", "GET /jobs/"]
    assert activities.listing.begun == 2
    for job_id in submitted.values():
        await client.cancel_job(job_id)
