"""SharedListing: one listing of every job in flight at a time, shared by those who wait (no Slurm)."""

import asyncio

import pytest

from bridge.slurm_api import JobInfo
from clients.job_listing import SharedListing
from clients.slurm_client import JobList
from clients.slurm_errors import SlurmUnavailable


class Slurmrestd:
    """`list_jobs` as a test drives it: each call waits for the answer the test gives."""

    def __init__(self) -> None:
        self.asked: list[int | None] = []  # the update_time of each listing, in order
        self.answers: list[asyncio.Future[JobList]] = []
        self._calls = asyncio.Condition()

    async def list_jobs(self, update_time: int | None) -> JobList:
        answer: asyncio.Future[JobList] = asyncio.get_running_loop().create_future()
        async with self._calls:
            self.asked.append(update_time)
            self.answers.append(answer)
            self._calls.notify_all()
        return await answer

    async def listing(self, number: int) -> asyncio.Future[JobList]:
        """The n-th listing (from 1), once it was sent."""
        async with self._calls:
            await self._calls.wait_for(lambda: len(self.answers) >= number)
        return self.answers[number - 1]


def jobs(*ids: int) -> list[JobInfo]:
    return [JobInfo(job_id=job_id) for job_id in ids]


@pytest.fixture
def slurmrestd() -> Slurmrestd:
    return Slurmrestd()


async def test_callers_during_a_listing_share_the_next_one(slurmrestd: Slurmrestd) -> None:
    listing = SharedListing(slurmrestd.list_jobs)
    first = listing.jobs_since(100)
    # Asked while the first listing is in flight: it may have begun before their job was
    # submitted, so they wait for one that begins after they asked, and share it.
    second = listing.jobs_since(80)
    third = listing.jobs_since(90)

    (await slurmrestd.listing(1)).set_result(JobList(jobs(1), 0))
    assert await first == jobs(1)
    (await slurmrestd.listing(2)).set_result(JobList(jobs(1, 2), 0))
    assert await second == jobs(1, 2)
    assert await third == jobs(1, 2)
    # The shared listing asks from the earliest time any of its callers needs.
    assert slurmrestd.asked == [100, 80]
    assert listing.begun == 2


async def test_a_finished_listing_is_never_handed_to_a_later_caller(slurmrestd: Slurmrestd) -> None:
    listing = SharedListing(slurmrestd.list_jobs)
    first = listing.jobs_since(1)
    (await slurmrestd.listing(1)).set_result(JobList(jobs(1), 0))
    await first

    later = listing.jobs_since(1)
    (await slurmrestd.listing(2)).set_result(JobList(jobs(1, 2), 0))
    assert await later == jobs(1, 2)
    assert listing.begun == 2


async def test_a_caller_that_gives_up_leaves_the_listing_to_the_next(slurmrestd: Slurmrestd) -> None:
    listing = SharedListing(slurmrestd.list_jobs)
    impatient = listing.jobs_since(1)
    sent = await slurmrestd.listing(1)
    impatient.cancel()  # its activity attempt timed out

    # slurmrestd goes on building the answer: nothing is asked again until it is in.
    patient = listing.jobs_since(1)
    assert not sent.cancelled()
    assert slurmrestd.asked == [1]
    sent.set_result(JobList(jobs(1), 0))
    (await slurmrestd.listing(2)).set_result(JobList(jobs(1, 2), 0))
    assert await patient == jobs(1, 2)
    with pytest.raises(asyncio.CancelledError):
        await impatient


async def test_a_failed_listing_fails_its_callers_and_the_next_caller_asks_again(
    slurmrestd: Slurmrestd,
) -> None:
    listing = SharedListing(slurmrestd.list_jobs)
    first = listing.jobs_since(1)
    waiting = [listing.jobs_since(1), listing.jobs_since(1)]
    (await slurmrestd.listing(1)).set_result(JobList([], 0))
    await first
    (await slurmrestd.listing(2)).set_exception(SlurmUnavailable("no answer", operation="GET /jobs/"))
    for caller in waiting:
        with pytest.raises(SlurmUnavailable):
            await caller

    again = listing.jobs_since(1)
    (await slurmrestd.listing(3)).set_result(JobList(jobs(3), 0))
    assert await again == jobs(3)
