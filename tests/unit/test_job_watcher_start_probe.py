"""The job watcher's probe of its pending jobs when slurmctld's count of started jobs moved: it
asks them until it found as many starts as the count moved by. At a site's size (5,000 pending
jobs, a start a second) the probe asked all 5,000 on every start, 20 requests of 250 ids, and
slurmctld spent 0.12 s of CPU a second answering the watcher, whose cost grew with the jobs that
wait, not with the jobs that changed."""

from typing import cast

from tests.unit.test_job_watcher_races import PLACEMENT, Clock, Signals, Slurm, watcher_of
from worker.job_watcher import PROBE_GROUP, JobWatcher

NEWEST = 10_000
# Five groups of pending jobs, the newest first: group 0 is [NEWEST - 249 .. NEWEST].
GROUPS = 5


def group_of(job_id: int) -> int:
    return (NEWEST - job_id) // PROBE_GROUP


class CountingSlurm(Slurm):
    """Slurm whose state probes are kept: the ids of each `GET /jobs/state/`, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.states = {job_id: ["PENDING"] for job_id in range(NEWEST - GROUPS * PROBE_GROUP + 1, NEWEST + 1)}
        self.asked: list[list[int]] = []

    async def job_states(self, job_ids: list[int]) -> dict[int, list[str]]:
        self.asked.append(list(job_ids))
        return await super().job_states(job_ids)

    def groups_asked(self) -> list[int]:
        return [group_of(ids[0]) for ids in self.asked]


async def watching() -> tuple[CountingSlurm, Signals, JobWatcher]:
    """A watcher that has read every job and knows slurmctld's count: all pending, none told."""
    slurm, signals = CountingSlurm(), Signals()
    watcher = watcher_of(cast(Slurm, slurm), signals, Clock())
    for _ in range(2):  # the first pass finds them pending, the second takes the count
        await watcher.poll()
        await watcher.wait_idle()
    assert len(slurm.asked) == 2 * GROUPS  # without a count to go by, every job is asked
    slurm.asked.clear()
    return slurm, signals, watcher


async def test_a_start_in_the_newest_group_spares_the_older_pending_jobs() -> None:
    slurm, signals, watcher = await watching()
    slurm.start(NEWEST)

    await watcher.poll()
    await signals.told(NEWEST, "RUNNING")
    assert slurm.groups_asked() == [0]
    assert watcher.state_probes_spared == (GROUPS - 1) * PROBE_GROUP
    await watcher.close()


async def test_after_the_newest_group_the_oldest_jobs_are_asked_first() -> None:
    """Slurm starts waiting jobs in the order of their priority, their submission's by default."""
    slurm, signals, watcher = await watching()
    oldest = NEWEST - GROUPS * PROBE_GROUP + 1
    slurm.start(oldest)

    await watcher.poll()
    await signals.told(oldest, "RUNNING")
    assert slurm.groups_asked() == [0, GROUPS - 1]
    await watcher.close()


async def test_a_start_in_the_middle_is_found_however_many_groups_it_takes() -> None:
    slurm, signals, watcher = await watching()
    in_group_1 = NEWEST - PROBE_GROUP
    slurm.start(in_group_1)

    await watcher.poll()
    await signals.told(in_group_1, "RUNNING")
    assert slurm.groups_asked() == [0, 4, 3, 2, 1]
    assert watcher.state_probes_spared == 0
    await watcher.close()


async def test_a_start_of_a_job_not_followed_makes_the_probe_ask_every_pending_job() -> None:
    slurm, _, watcher = await watching()
    slurm.started += 1  # someone else's job started

    await watcher.poll()
    assert sorted(slurm.groups_asked()) == list(range(GROUPS))
    assert watcher.state_probes_spared == 0
    await watcher.close()


async def test_a_job_first_seen_running_does_not_count_as_a_start_found() -> None:
    """Its start may have been counted before (its pods named it after it started): counting it
    could leave a start among the pending jobs untold until their slow probe."""
    slurm, signals, watcher = await watching()
    newcomer = NEWEST + 1
    slurm.states[newcomer] = ["RUNNING"]
    watcher.jobs.track(newcomer, PLACEMENT)
    slurm.started += 1

    await watcher.poll()
    await signals.told(newcomer, "RUNNING")
    assert sorted(slurm.groups_asked()) == [-1, 0, 1, 2, 3, 4]  # the newcomer alone, then all
    await watcher.close()
