"""The job watcher against the real Slurm (hack/slurm-sid.sh) and a real Temporal dev server.

The placements are stand-ins: workflows started on a task queue no worker
polls, so they stay open and every signal lands in their history, which is
what these tests read (exact, and complete as soon as the signal call returned).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import pytest
from temporalio.client import Client, WorkflowHandle

from bridge.models import JobEvent, admin_comment_for, workflow_id_of
from clients.slurm_client import SlurmClient
from testbed.slurm_bed import SlurmTestBed, TestPartition
from testbed.waiting import until
from tests.slurm.conftest import MakePartition
from tests.slurm.test_slurm_client import UNKNOWN_JOB_ID, external_job, wait_for_job
from worker.job_registry import LiveJobs
from worker.job_watcher import JobWatcher

pytestmark = pytest.mark.slurm

INSTALLATION = "watcher-test"
DEADLINE = 20.0


class Requests:
    """The SlurmClient observer: every request's operation, in order."""

    def __init__(self) -> None:
        self.operations: list[str] = []

    def __call__(self, operation: str, outcome: str, seconds: float) -> None:
        self.operations.append(operation)

    def take(self) -> list[str]:
        taken, self.operations = self.operations, []
        return taken


@pytest.fixture
def requests() -> Requests:
    return Requests()


C = TypeVar("C", bound=SlurmClient)


def observed(kind: type[C], bed: SlurmTestBed, requests: Requests) -> C:
    """A client of the bed's slurmrestd whose every request `requests` records."""
    return kind(bed.rest_url, user_name=bed.user_name, token_file=bed.jwt_file, observer=requests)


@pytest.fixture
async def slurm(slurm_bed: SlurmTestBed, requests: Requests) -> AsyncIterator[SlurmClient]:
    async with observed(SlurmClient, slurm_bed, requests) as client:
        yield client


class Placements:
    """Open stand-in placement workflows; terminated after the test."""

    def __init__(self, temporal: Client, task_queue: str) -> None:
        self.temporal = temporal
        self.task_queue = task_queue
        self.handles: list[WorkflowHandle[object, object]] = []

    def new_id(self, installation: str = INSTALLATION) -> tuple[str, str]:
        """(placement id, pod key) of a new placement."""
        token = secrets.token_hex(4)
        key = f"ns-{token}/pod-{token}"
        return f"placement/{installation}/{key}/uid-{token}@gen-{token}", key

    async def start(self, placement_id: str) -> WorkflowHandle[object, object]:
        handle: WorkflowHandle[object, object] = await self.temporal.start_workflow(
            "StandInPlacement", id=workflow_id_of(placement_id), task_queue=self.task_queue
        )
        self.handles.append(handle)
        return handle

    async def told(self, handle: WorkflowHandle[object, object]) -> list[JobEvent]:
        """The `job_changed` signals this placement received, in order."""
        events = []
        history = await handle.fetch_history()
        for event in history.events:
            if not event.HasField("workflow_execution_signaled_event_attributes"):
                continue
            attributes = event.workflow_execution_signaled_event_attributes
            assert attributes.signal_name == "job_changed"
            [decoded] = await self.temporal.data_converter.decode(attributes.input.payloads, [JobEvent])
            events.append(decoded)
        return events


@pytest.fixture
async def placements(temporal_client: Client, task_queue: str) -> AsyncIterator[Placements]:
    stand_ins = Placements(temporal_client, task_queue)
    yield stand_ins
    for handle in stand_ins.handles:
        await handle.terminate("test over")


def watcher_for(
    slurm: SlurmClient,
    temporal: Client,
    jobs: LiveJobs,
    clock: Callable[[], float] = time.monotonic,
    **kwargs: Any,
) -> JobWatcher:
    ready = asyncio.Event()
    ready.set()
    # Pending reasons are told at once here (grace 0) unless a test says otherwise.
    kwargs.setdefault("pending_reason_grace", 0.0)
    # slurmctld's count of started jobs moves with every other test's jobs in this shared Slurm:
    # these tests check what a pass does with the states it probes, every pass; the gate on that
    # count has tests of its own.
    kwargs.setdefault("gate_on_starts", False)
    return JobWatcher(
        slurm, temporal, jobs, installation=INSTALLATION, ready=ready, interval=0.05, clock=clock, **kwargs
    )


async def bridge_job(
    slurm: SlurmClient, partition: str, placement_id: str, pod: str, **fields: object
) -> int:
    return await slurm.submit_job(
        external_job(partition, comment=placement_id, admin_comment=admin_comment_for([pod]), **fields)
    )


async def one_pass(watcher: JobWatcher) -> None:
    await watcher.poll()
    await watcher.wait_idle()


async def poll_until(watcher: JobWatcher, done: Callable[[], bool], what: str) -> None:
    """Run passes (each one asks Slurm, as the real loop does) until `done()`, within DEADLINE."""

    async def passed() -> bool:
        if done():
            return True
        await one_pass(watcher)
        return False

    await until(passed, what, DEADLINE)


async def test_a_state_change_is_signalled_once_with_the_new_state(
    slurm: SlurmClient,
    slurm_bed: SlurmTestBed,
    slurm_partition: MakePartition,
    temporal_client: Client,
    placements: Placements,
    requests: Requests,
) -> None:
    partition = slurm_partition()
    placement_id, pod = placements.new_id()
    placement = await placements.start(placement_id)
    job_id = await bridge_job(slurm, partition.name, placement_id, pod, hold=True)
    jobs = LiveJobs()
    jobs.track(job_id, placement_id)
    watcher = watcher_for(slurm, temporal_client, jobs)
    requests.take()

    await one_pass(watcher)  # first sight: read and told
    await one_pass(watcher)  # nothing changed: one state probe, no read, no signal
    [pending] = await placements.told(placement)
    assert pending.job_id == job_id
    assert pending.states == ["PENDING"]
    assert pending.reason == "JobHeldUser"
    assert requests.take() == ["GET /jobs/state/", "GET /job/{}", "GET /jobs/state/"]

    await asyncio.to_thread(slurm_bed.scontrol, "release", str(job_id))
    await poll_until(watcher, lambda: watcher.signals == 2, "told RUNNING")
    await one_pass(watcher)
    told = await placements.told(placement)
    assert [event.states for event in told] == [["PENDING"], ["RUNNING"]]
    # Told from the state probe, unread: the bind step reads the job's nodes itself.
    assert told[1].nodes == []
    assert watcher.started_unread == 1
    assert "GET /job/{}" not in requests.take()

    await slurm.cancel_job(job_id)
    await poll_until(watcher, lambda: watcher.signals == 3, "told CANCELLED")
    told = await placements.told(placement)
    assert [event.states for event in told] == [["PENDING"], ["RUNNING"], ["CANCELLED"]]

    # Told it is over: no longer followed, so the next passes ask Slurm nothing.
    assert jobs.items() == []
    requests.take()
    await one_pass(watcher)
    assert requests.take() == []

    # Steady path: state probes and reads of changed jobs only, never a listing of all jobs.
    assert watcher.errors == 0
    assert watcher.signals == 3
    assert watcher.job_gets == 2  # first sight, CANCELLED (RUNNING came from the probe)
    assert "GET /jobs/" not in requests.operations


async def test_a_pending_reason_is_signalled_once_the_scheduler_set_it(
    slurm: SlurmClient,
    slurm_partition: MakePartition,
    temporal_client: Client,
    placements: Placements,
) -> None:
    # More CPUs than any node has: accepted, PENDING, reason PartitionConfig once the
    # scheduler looked at it. Its state never changes; only the refresh sees the reason.
    partition = slurm_partition(cpus=2)
    placement_id, pod = placements.new_id()
    placement = await placements.start(placement_id)
    job_id = await bridge_job(slurm, partition.name, placement_id, pod, cpus_per_task=64)
    jobs = LiveJobs()
    jobs.track(job_id, placement_id)
    watcher = watcher_for(slurm, temporal_client, jobs)

    await poll_until(watcher, lambda: watcher.signals >= 1, "told the pending reason")
    for _ in range(3):
        await one_pass(watcher)

    # Never the "PENDING, no reason yet" the placement read itself when it submitted.
    [told] = await placements.told(placement)
    assert (told.states, told.reason) == (["PENDING"], "PartitionConfig")
    await slurm.cancel_job(job_id)


async def test_a_job_of_another_installation_is_left_alone(
    slurm: SlurmClient,
    slurm_partition: MakePartition,
    temporal_client: Client,
    placements: Placements,
    requests: Requests,
) -> None:
    partition = slurm_partition()
    theirs, pod = placements.new_id(installation="other-bridge")
    their_placement = await placements.start(theirs)
    job_id = await bridge_job(slurm, partition.name, theirs, pod)
    jobs = LiveJobs()
    jobs.track(job_id, theirs)
    watcher = watcher_for(slurm, temporal_client, jobs)
    requests.take()

    await one_pass(watcher)

    assert requests.take() == []  # not even its state is asked
    assert watcher.state_probes == 0

    # Followed under one of our placement ids, its comment still decides: not ours.
    ours, _ = placements.new_id()
    our_placement = await placements.start(ours)
    jobs.track(job_id, ours)
    await one_pass(watcher)

    assert requests.take() == ["GET /jobs/state/", "GET /job/{}"]
    assert await placements.told(their_placement) == []
    assert await placements.told(our_placement) == []
    assert watcher.signals == 0
    await slurm.cancel_job(job_id)


async def test_a_job_slurm_does_not_know_is_gone(
    slurm: SlurmClient, temporal_client: Client, placements: Placements, requests: Requests
) -> None:
    placement_id, _ = placements.new_id()
    placement = await placements.start(placement_id)
    jobs = LiveJobs()
    jobs.track(UNKNOWN_JOB_ID, placement_id)  # purged after MinJobAge, or never known
    watcher = watcher_for(slurm, temporal_client, jobs)
    requests.take()

    await one_pass(watcher)

    assert await placements.told(placement) == [JobEvent(job_id=UNKNOWN_JOB_ID, states=[], gone=True)]
    assert requests.take() == ["GET /jobs/state/", "GET /job/{}"]  # the read confirms: 404
    assert jobs.items() == []  # told: followed no more
    await one_pass(watcher)
    assert requests.take() == []
    assert len(await placements.told(placement)) == 1


async def test_a_closed_placement_stops_the_following(
    slurm: SlurmClient, temporal_client: Client, placements: Placements, requests: Requests
) -> None:
    placement_id, _ = placements.new_id()  # no workflow: the signal answers NOT_FOUND
    jobs = LiveJobs()
    jobs.track(UNKNOWN_JOB_ID, placement_id)
    watcher = watcher_for(slurm, temporal_client, jobs)

    await one_pass(watcher)

    assert watcher.signals == 0
    assert watcher.errors == 0
    assert jobs.items() == []


class FlakyJobs(LiveJobs):
    """LiveJobs that fails its first `failures` reads and reports when a job was told over."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.told_over = asyncio.Event()

    def of_installation(self, installation: str) -> dict[int, str]:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("a bug anywhere in a pass")
        return super().of_installation(installation)

    def finished(self, job_id: int) -> None:
        super().finished(job_id)
        self.told_over.set()


async def stopped(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled()  # ended by the cancellation, not by an error


async def test_the_loop_survives_any_exception_and_ends_only_when_cancelled(
    slurm: SlurmClient, temporal_client: Client, placements: Placements
) -> None:
    placement_id, _ = placements.new_id()
    placement = await placements.start(placement_id)
    jobs = FlakyJobs(failures=2)
    jobs.track(UNKNOWN_JOB_ID, placement_id)
    watcher = watcher_for(slurm, temporal_client, jobs)

    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(jobs.told_over.wait(), DEADLINE)
    finally:
        await stopped(task)

    assert watcher.errors == 2
    assert watcher.signals == 1
    assert [event.gone for event in await placements.told(placement)] == [True]


async def test_failed_passes_back_off_exponentially(temporal_client: Client) -> None:
    unreachable = SlurmClient("http://127.0.0.1:9", user_name="slurm", token_file=None)
    jobs = LiveJobs()
    jobs.track(1, f"placement/{INSTALLATION}/ns/p/u@g")
    watcher = watcher_for(unreachable, temporal_client, jobs, max_backoff=0.4)

    started = time.monotonic()
    task = asyncio.create_task(watcher.run())
    try:
        # Its own loop's failures: a counter nothing announces.
        await until(lambda: watcher.errors >= 5, "five failed passes", DEADLINE, interval=0.01)
    finally:
        await stopped(task)
        await unreachable.close()

    # Waits of at least 0.05, 0.1, 0.2 and 0.4 s (interval 0.05, doubling, capped) came
    # between the five failures: no tight loop against a Slurm that does not answer.
    assert time.monotonic() - started >= 0.75
    assert watcher.passes == 0


async def test_a_pending_reason_is_told_only_once_the_job_has_waited_a_little(
    slurm: SlurmClient,
    slurm_partition: MakePartition,
    temporal_client: Client,
    placements: Placements,
) -> None:
    """Slurm's first pass often says Priority for a moment: not worth a signal, a condition and an Event."""
    partition = slurm_partition()
    placement_id, pod = placements.new_id()
    placement = await placements.start(placement_id)
    job_id = await bridge_job(slurm, partition.name, placement_id, pod, hold=True)
    jobs = LiveJobs()
    jobs.track(job_id, placement_id)
    watcher = watcher_for(slurm, temporal_client, jobs, pending_reason_grace=1.0)

    await one_pass(watcher)
    assert await placements.told(placement) == []  # JobHeldUser, but only just
    await poll_until(watcher, lambda: watcher.signals == 1, "told JobHeldUser after the grace")
    [pending] = await placements.told(placement)
    assert pending.reason == "JobHeldUser"


class Clock:
    """The watcher's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def watched_held_job(
    slurm: SlurmClient,
    partition: TestPartition,
    temporal_client: Client,
    placements: Placements,
    **watcher_settings: Any,
) -> tuple[WorkflowHandle[object, object], int, JobWatcher, Clock]:
    """A held job of a new stand-in placement, followed by a watcher on a clock the test moves."""
    placement_id, pod = placements.new_id()
    placement = await placements.start(placement_id)
    job_id = await bridge_job(slurm, partition.name, placement_id, pod, hold=True)
    jobs = LiveJobs()
    jobs.track(job_id, placement_id)
    clock = Clock()
    return placement, job_id, watcher_for(slurm, temporal_client, jobs, clock, **watcher_settings), clock


async def test_a_pending_job_whose_reason_stays_the_same_is_re_read_less_and_less_often(
    slurm: SlurmClient,
    slurm_bed: SlurmTestBed,
    slurm_partition: MakePartition,
    temporal_client: Client,
    placements: Placements,
    requests: Requests,
) -> None:
    """Each re-read that finds the same reason doubles the job's interval, up to the maximum."""
    placement, job_id, watcher, clock = await watched_held_job(
        slurm, slurm_partition(), temporal_client, placements, pending_refresh=10.0, pending_refresh_max=40.0
    )
    read = "GET /job/{}"  # the observer sees operation templates

    await poll_until(watcher, lambda: watcher.signals == 1, "told JobHeldUser")
    reads_at: list[float] = []
    requests.take()
    for _ in range(200):  # 200 s of watcher time, a pass each second
        clock.now += 1.0
        await one_pass(watcher)
        if read in requests.take():
            reads_at.append(clock.now)
    gaps = [later - earlier for earlier, later in itertools.pairwise(reads_at)]
    assert gaps[:3] == [20.0, 40.0, 40.0]  # 10 → 20 → 40, capped at 40
    assert all(gap == 40.0 for gap in gaps[3:])

    # A new reason is seen at the next due re-read, and starts the interval small again.
    await asyncio.to_thread(slurm_bed.scontrol, "hold", str(job_id))  # an admin's hold: JobHeldAdmin
    reads_at = []
    for _ in range(60):
        clock.now += 1.0
        await one_pass(watcher)
        if read in requests.take():
            reads_at.append(clock.now)
    assert [told.reason for told in await placements.told(placement)] == ["JobHeldUser", "JobHeldAdmin"]
    assert reads_at[1] - reads_at[0] == 10.0  # the first interval again, not the 40 s reached before
    await slurm.cancel_job(job_id)


async def test_a_job_that_starts_within_the_grace_is_told_from_the_probe_and_never_read(
    slurm: SlurmClient,
    slurm_bed: SlurmTestBed,
    slurm_partition: MakePartition,
    temporal_client: Client,
    placements: Placements,
    requests: Requests,
) -> None:
    """Most jobs start in Slurm's next pass: reading them while pending would tell nobody anything."""
    placement, job_id, watcher, clock = await watched_held_job(
        slurm, slurm_partition(), temporal_client, placements, pending_reason_grace=3.0
    )
    requests.take()

    await one_pass(watcher)
    clock.now += 2.9
    await one_pass(watcher)
    assert requests.take() == ["GET /jobs/state/", "GET /jobs/state/"]  # probed, not read
    assert await placements.told(placement) == []

    await asyncio.to_thread(slurm_bed.scontrol, "release", str(job_id))
    await poll_until(watcher, lambda: watcher.signals == 1, "told RUNNING")
    [running] = await placements.told(placement)
    assert (running.job_id, running.states) == (job_id, ["RUNNING"])
    assert (watcher.job_gets, watcher.started_unread) == (0, 1)
    await slurm.cancel_job(job_id)


async def test_a_job_pending_past_the_grace_is_read_once_and_its_reason_told_at_once(
    slurm: SlurmClient,
    slurm_partition: MakePartition,
    temporal_client: Client,
    placements: Placements,
    requests: Requests,
) -> None:
    placement, job_id, watcher, clock = await watched_held_job(
        slurm, slurm_partition(), temporal_client, placements, pending_reason_grace=3.0
    )
    requests.take()

    await one_pass(watcher)  # first sight, pending: the grace starts
    clock.now += 3.0
    await one_pass(watcher)  # waited the grace: read, and the reason is news at once
    assert requests.take() == ["GET /jobs/state/", "GET /jobs/state/", "GET /job/{}"]
    [pending] = await placements.told(placement)
    assert (pending.states, pending.reason) == (["PENDING"], "JobHeldUser")
    await slurm.cancel_job(job_id)


class CountedStarts(SlurmClient):
    """The real Slurm, but slurmctld's count of started jobs as the test sets it."""

    started = 100

    async def jobs_started(self) -> int:
        return self.started


@pytest.fixture
async def counted_starts(slurm_bed: SlurmTestBed, requests: Requests) -> AsyncIterator[CountedStarts]:
    async with observed(CountedStarts, slurm_bed, requests) as client:
        yield client


async def test_pending_jobs_are_probed_when_slurmctld_counted_a_start(
    slurm_bed: SlurmTestBed,
    counted_starts: CountedStarts,
    slurm_partition: MakePartition,
    temporal_client: Client,
    placements: Placements,
    requests: Requests,
) -> None:
    """While slurmctld counts no start, no pending job started: the pass asks for the count and
    probes nothing (what else can end a pending job, the slow cadence catches)."""
    slurm = counted_starts
    placement, job_id, watcher, clock = await watched_held_job(
        slurm, slurm_partition(), temporal_client, placements, gate_on_starts=True, pending_probe=30.0
    )
    requests.take()
    await one_pass(watcher)  # first sight: probed and read (nothing known, no count asked)
    await one_pass(watcher)  # pending now: the count, first seen, and the probe
    assert requests.take() == ["GET /jobs/state/", "GET /job/{}", "GET /jobs/state/"]
    assert watcher.counter_reads == 1

    await asyncio.to_thread(slurm_bed.scontrol, "release", str(job_id))
    await wait_for_job(slurm, job_id, lambda job: "RUNNING" in (job.job_state or []), "job running")
    requests.take()
    clock.now += 29.0
    await one_pass(watcher)  # count unchanged, cadence not due: not probed, so not told
    assert requests.take() == []
    assert [event.states for event in await placements.told(placement)] == [["PENDING"]]

    slurm.started = 101  # slurmctld counted a start
    await one_pass(watcher)
    assert requests.take() == ["GET /jobs/state/"]
    assert [event.states for event in await placements.told(placement)] == [["PENDING"], ["RUNNING"]]
    await slurm.cancel_job(job_id)


async def test_a_start_found_in_the_newest_group_spares_asking_the_older_pending_jobs(
    slurm_bed: SlurmTestBed,
    counted_starts: CountedStarts,
    slurm_partition: MakePartition,
    temporal_client: Client,
    placements: Placements,
    requests: Requests,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """slurmctld counted one start: the pending jobs are asked until one start is found, the
    newest first (groups of two here, of 250 in the bridge)."""
    monkeypatch.setattr("worker.job_watcher.PROBE_GROUP", 2)
    slurm, partition = counted_starts, slurm_partition()
    placement_id, pod = placements.new_id()
    placement = await placements.start(placement_id)
    oldest, older, newest = [
        await bridge_job(slurm, partition.name, placement_id, pod, hold=True) for _ in range(3)
    ]
    jobs = LiveJobs()
    for job_id in (oldest, older, newest):
        jobs.track(job_id, placement_id)
    watcher = watcher_for(slurm, temporal_client, jobs, Clock(), gate_on_starts=True, pending_probe=30.0)
    await one_pass(watcher)  # first sight: probed and read
    await one_pass(watcher)  # pending now: the count, first seen, and every job probed
    assert requests.take().count("GET /jobs/state/") == 4

    await asyncio.to_thread(slurm_bed.scontrol, "release", str(newest))
    await wait_for_job(slurm, newest, lambda job: "RUNNING" in (job.job_state or []), "job running")
    requests.take()
    slurm.started += 1
    await one_pass(watcher)
    assert requests.take() == ["GET /jobs/state/"]  # [newest, older]; oldest not asked
    told = {event.job_id: event.states for event in await placements.told(placement)}
    assert told[newest] == ["RUNNING"]
    assert watcher.state_probes_spared == 1
    for job_id in (oldest, older, newest):
        await slurm.cancel_job(job_id)


async def test_a_pending_job_is_probed_at_the_slow_cadence_while_slurmctld_counts_no_start(
    counted_starts: CountedStarts,
    slurm_partition: MakePartition,
    temporal_client: Client,
    placements: Placements,
    requests: Requests,
) -> None:
    """A pending job ended by something that starts nothing: here a cancel by someone else."""
    slurm = counted_starts
    placement, job_id, watcher, clock = await watched_held_job(
        slurm, slurm_partition(), temporal_client, placements, gate_on_starts=True, pending_probe=30.0
    )
    await one_pass(watcher)
    await one_pass(watcher)
    await slurm.cancel_job(job_id)
    requests.take()
    clock.now += 29.0
    await one_pass(watcher)
    assert requests.take() == []
    clock.now += 1.0
    await one_pass(watcher)  # 30 s since the last probe
    assert requests.take() == ["GET /jobs/state/", "GET /job/{}"]
    assert [event.states for event in await placements.told(placement)] == [["PENDING"], ["CANCELLED"]]
