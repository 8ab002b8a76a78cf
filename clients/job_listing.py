"""Every job slurmctld holds, listed at most once at a time and shared by those who wait.

A recovery (activities/slurm.py) looks for a job its placement may have submitted
before it was cut off, and slurmrestd cannot filter jobs by anything a placement
knows: it lists every job, about 8.6 KiB each (258 MB at 30,000 jobs), and holds
gigabytes while it builds that answer. Recoveries come together (Slurm back after an
outage: every placement that was submitting), and a listing whose caller gave up goes
on in slurmrestd all the same; asked again at once, slurmrestd builds two. On the
benchmark machine that took slurmrestd to 15.6 GB.

So one client has at most one listing in flight. Whoever asks while one runs waits
for it to end and shares the next, which begins after each of them asked: a listing
begun before the ask could miss a job submitted just before it. A caller that stops
waiting (its activity attempt timed out) leaves the listing running, for the
callers after it.
"""

import asyncio
import functools
from collections.abc import Awaitable, Callable

from bridge.slurm_api import JobInfo
from clients.slurm_client import JobList

ListJobs = Callable[[int | None], Awaitable[JobList]]


class SharedListing:
    def __init__(self, list_jobs: ListJobs) -> None:
        self._list_jobs = list_jobs
        self._running: asyncio.Future[list[JobInfo]] | None = None
        # The next listing, for the callers that came while one ran; it begins when that ends.
        self._queued: asyncio.Future[list[JobInfo]] | None = None
        self._queued_update_time = 0
        self.begun = 0  # listings sent to slurmrestd

    def jobs_since(self, update_time: int) -> "asyncio.Future[list[JobInfo]]":
        """Every job, or none when no job changed since `update_time` (list_jobs' terms).

        The caller's place is taken before this returns; await the answer.
        """
        if self._running is None:
            wanted = self._begin(update_time, None)
        elif self._queued is None:
            self._queued = asyncio.get_running_loop().create_future()
            self._queued.add_done_callback(_retrieve)
            self._queued_update_time = update_time
            wanted = self._queued
        else:
            # "No change since the earliest" holds for every later time too.
            self._queued_update_time = min(self._queued_update_time, update_time)
            wanted = self._queued
        # Shielded: a caller's cancellation leaves the listing to the others.
        return asyncio.shield(wanted)

    def _begin(
        self, update_time: int, into: asyncio.Future[list[JobInfo]] | None
    ) -> asyncio.Future[list[JobInfo]]:
        self.begun += 1
        task = asyncio.ensure_future(self._list(update_time))
        task.add_done_callback(functools.partial(self._ended, into))
        self._running = task
        return task

    async def _list(self, update_time: int) -> list[JobInfo]:
        return (await self._list_jobs(update_time)).jobs

    def _ended(self, into: asyncio.Future[list[JobInfo]] | None, task: asyncio.Future[list[JobInfo]]) -> None:
        self._running = None
        _retrieve(task)
        if into is not None and not into.done():
            if task.cancelled():
                into.cancel()
            elif (error := task.exception()) is not None:
                into.set_exception(error)
            else:
                into.set_result(task.result())
        if self._queued is not None:
            queued, self._queued = self._queued, None
            self._begin(self._queued_update_time, queued)


def _retrieve(future: asyncio.Future[list[JobInfo]]) -> None:
    # Every caller may have stopped waiting: the failure is theirs to see, not the loop's log's.
    if not future.cancelled():
        future.exception()
