"""Job watcher: the one place that polls Slurm for the bridge's job changes.

What it follows comes from Kubernetes, not from Slurm: `LiveJobs`, fed by the
pod watcher from the pods' job-id label and placement annotation. Each interval:

1. `GET /jobs/state/?job_id=A&job_id=B...` for those of its jobs that are due
   (groups of 250 ids, a few requests at once), so the
   cost follows the bridge's own jobs, never the other jobs in Slurm. A running
   job is due every 2 s. A pending one is due when slurmctld's count of started
   jobs (`GET /diag/`, one answer of constant size) moved since the last probe,
   since a start is what its pods wait for, and otherwise every 10 s (a cancel by
   someone else, a failure): while Slurm starts nothing, following 10,000 pending
   jobs costs one small request per pass, not 33. The jobs that may have started
   are probed first, newest first, and each group's starts told as it answers,
   before the running jobs are probed. The pending jobs probed only because the
   count moved are asked until as many of them were found started as it moved by:
   the newest group first (jobs Slurm may start in the pass after their
   submission), then the others oldest first (Slurm starts waiting jobs in the
   order of their priority, their submission's unless the site weighs it
   otherwise). Only jobs seen pending count; the count covers every job Slurm
   started, so a start of someone else's job, or of a job first seen running,
   makes the probe ask them all, as before; a start found before the count had
   it (between the two) is made up for in the next pass, for which it moved;
2. `GET /job/{id}` for each job whose state changed since the previous pass,
   that Slurm no longer knows, that is new to the watcher, or that is pending
   and due for a refresh (its pending reason is not part of the state answer; at most
   MAX_REFRESHES such re-reads a second, the longest unread first);
   except a job seen pending that now runs: the probe's state is the news, and
   the placement's bind step reads the job (its nodes and comment) anyway, so
   the watcher does not read it first (one Slurm request less on every
   placement's path from RUNNING to bound); and a job new to the watcher that
   is pending: it is first read once it has waited `pending_reason_grace`, since
   a reason read sooner would not be told (Slurm starts most jobs in its next
   pass, and those are never read while pending). The pending reasons' re-reads
   run beside the passes: the next pass, and the starts it finds, do not wait for
   them;
3. a `job_changed` signal to the placement named by the job's comment, only
   when the JobEvent differs from what that placement was last told (and not
   for a first "PENDING, no reason yet": the placement knows it submitted the
   job, and that is all such an answer says).

Only jobs of this installation are followed (`placement/<installation>/...@gen`).

No periodic listing of every job (`GET /jobs/`: ~8 KB per job, 16 MB at 2,000
jobs) is made, and none is needed: the job watcher only serves placements, and
every placement's job is referenced by its pods, which the pod watcher lists
again from Kubernetes whenever its watch breaks, so no job of a running
placement can be missing from LiveJobs for longer than that. A job the probe
does not find is reported gone. Each placement also re-reads its own job on a
slow safety re-check, so a lost signal costs latency, never correctness. Jobs
that no placement references any more are the sweep's business, not this loop's.

The loop survives any exception: it logs it, counts it, backs off
exponentially (tenacity, with jitter, up to `max_backoff`) and goes on; it ends
only when cancelled.

A pass walks every followed job only when one may be due (a probe's time came, slurmctld
started a job, a state changed): at 10,000 followed jobs most passes ask `GET /diag/` alone.

Its size (about 700 lines) is one loop with its pacing and back-off; what it follows is
worker/job_registry.py's.
"""

import asyncio
import heapq
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_never,
    wait_exponential_jitter,
)

from bridge.models import ENDED_JOB_STATES, JobEvent, installation_of, workflow_id_of
from bridge.slurm_api import JobInfo
from bridge.slurm_jobs import is_live, job_event_of, placement_of
from clients.slurm_client import SlurmClient
from clients.slurm_errors import SlurmAuthError, SlurmError, SlurmNotFound, SlurmUnavailable
from clients.slurm_health import SlurmHealth
from worker.delivery import LatestPerKey
from worker.job_registry import LiveJobs
from workflows.placement import PlacementWorkflow

log = logging.getLogger(__name__)

# A pending job's reason (Resources, Priority, PartitionConfig...) changes without its
# state changing: re-read pending jobs, at most MAX_REFRESHES per pass. First after
# PENDING_REFRESH_SECONDS; each re-read that finds the same reason doubles the job's
# interval up to PENDING_REFRESH_MAX_SECONDS, a new reason starts it small again. A job
# pending for a day then costs ~300 reads instead of ~2,900 (and a changed reason
# reaches its pods at most that much later).
PENDING_REFRESH_SECONDS = 30.0
PENDING_REFRESH_MAX_SECONDS = 300.0
MAX_REFRESHES = 20
# The pending jobs due a re-read are chosen at most this often: at most MAX_REFRESHES re-reads a
# second (at 5,000 pending jobs, 80 a second at four passes a second, 16% of the watcher's CPU),
# and no walk over every followed job on the passes between.
REFRESH_CHOICE_SECONDS = 1.0
# Concurrent `GET /job/{id}` of one pass (a restart reads every followed job once).
READ_CONCURRENCY = 8
# A state probe's ids per request (about 16 query characters each: one request of the client's
# chunking), and the requests out at once: slurmctld answers each under its job read lock, which
# many readers share, and a pass at 10,000 jobs was ~40 round trips in a row.
PROBE_GROUP = 250
PROBE_CONCURRENCY = 4
MAX_BACKOFF_SECONDS = 30.0
# A running job is probed this often (its end evicts pods; nothing waits on it to bind).
RUNNING_PROBE_SECONDS = 2.0
# A pending job is probed when slurmctld's count of started jobs moved, and at least this often
# for whatever else ends a pending job (a cancel by someone else, a failure, a deadline).
PENDING_PROBE_SECONDS = 10.0
# A pending reason is told only once the job has waited this long: Slurm's first pass says
# Priority for a moment before it starts most jobs, and each report costs actions and writes.
PENDING_REASON_GRACE_SECONDS = 3.0
# Slurm's pending reason before the scheduler has looked at a job.
_NO_REASON = frozenset({"", "None"})


@dataclass
class _Seen:
    """What the previous passes learnt about one job."""

    states: list[str] | None  # None: Slurm does not know the job
    read_at: float  # monotonic time of the last full read
    reason: str = ""
    refresh_every: float = PENDING_REFRESH_SECONDS  # while pending with an unchanged reason
    restarts: int = 0  # Slurm's restart_cnt at the last full read
    placement: str | None = None  # the placement its comment named at the last full read
    # Probed pending, never read yet (placement: what its pods name, the comment unchecked).
    unread: bool = False


class JobWatcher:
    def __init__(
        self,
        slurm: SlurmClient,
        temporal: Client,
        jobs: LiveJobs,
        *,
        installation: str,
        ready: asyncio.Event,
        interval: float,
        pending_refresh: float = PENDING_REFRESH_SECONDS,
        pending_refresh_max: float = PENDING_REFRESH_MAX_SECONDS,
        max_backoff: float = MAX_BACKOFF_SECONDS,
        pending_reason_grace: float = PENDING_REASON_GRACE_SECONDS,
        pending_probe: float = PENDING_PROBE_SECONDS,
        gate_on_starts: bool = True,
        clock: Callable[[], float] = time.monotonic,
        slurm_health: SlurmHealth | None = None,
    ) -> None:
        self.slurm = slurm
        self.slurm_health = slurm_health
        self.temporal = temporal
        self.jobs = jobs
        self.installation = installation
        self.ready = ready
        self.interval = interval
        self.pending_refresh = pending_refresh
        self.pending_refresh_max = max(pending_refresh_max, pending_refresh)
        self.pending_reason_grace = pending_reason_grace
        self.pending_probe = pending_probe
        self.gate_on_starts = gate_on_starts  # gate pending probes on slurmctld's count of started jobs
        self._clock = clock  # monotonic seconds; a test may drive it
        self.max_backoff = max(max_backoff, interval)
        # Counters, for metrics and the benchmark.
        self.passes = 0  # passes that completed
        self.walks = 0  # passes that walked every followed job for the due ones (not all need to)
        self.state_probes = 0  # job ids whose state was asked (`GET /jobs/state/`, batched)
        self.job_gets = 0  # `GET /job/{id}` answered (a job found or not found)
        self.started_unread = 0  # jobs seen to start, told from the state probe without a read
        self.counter_reads = 0  # `GET /diag/` answered with slurmctld's count of started jobs
        self.signals = 0  # `job_changed` signals delivered
        self.errors = 0  # passes that failed (each followed by a backoff)
        self.failing = 0  # passes failed since the last that completed
        self.last_success: float | None = None  # wall-clock time the last pass completed
        self._delivery: LatestPerKey[JobEvent] = LatestPerKey(self._deliver)
        self._seen: dict[int, _Seen] = {}
        # What each placement was last told about each job ("<workflow id>#<job id>"),
        # and the placements that are closed: signal only what changed (each signal is
        # a billable Temporal action and a workflow task).
        self._told: dict[str, JobEvent] = {}
        self._closed: dict[str, JobEvent] = {}  # key → what found its placement closed
        self._probed_at: dict[int, float] = {}  # job id → when its state was last asked
        self._pending_since: dict[int, float] = {}  # job id → when first seen pending
        self._withheld: set[int] = set()  # pending reasons not yet told: re-read soon
        self._started_at_probe: int | None = None  # slurmctld's count of started jobs at the last probe
        self.state_probes_spared = 0  # job ids not asked: the starts the count told of were found
        self._followed: dict[int, str] = {}  # this installation's live jobs, as of `_followed_version`
        self._followed_version = -1
        self._reading: set[int] = set()  # jobs whose `GET /job/{id}` is out: not asked again meanwhile
        # A pass walks every followed job only when one may be due: the followed jobs changed, a
        # job's state as seen changed (`_dirty`), slurmctld started a job, or a probe's time came.
        self._walked_version = -1
        self._dirty = True
        self._next_due = float("-inf")
        self._next_refresh_choice = float("-inf")
        self._refreshing: asyncio.Task[None] | None = None  # the pending reasons' re-reads, beside the passes
        self._retrying = AsyncRetrying(
            retry=retry_if_exception_type(Exception),
            wait=wait_exponential_jitter(multiplier=interval, max=self.max_backoff, jitter=interval),
            stop=stop_never,
            before_sleep=self._failed,
            sleep=self._back_off,
            reraise=True,
        )

    async def run(self) -> None:
        """Poll until cancelled; a failed pass is retried with backoff, never fatal."""
        # Placements are started and their jobs tracked by the pod watcher; polling
        # before its first list would only follow fewer jobs.
        await self.ready.wait()
        while True:
            await self._retrying.copy()(self.poll)
            self.last_success, self.failing = time.time(), 0
            await asyncio.sleep(self.interval)

    async def poll(self) -> None:
        """One pass: probe the followed jobs' states that are due, read the changed ones, signal.

        The jobs that may have started are probed first and their starts told at once: their
        pods wait on it, while the running jobs' probe only looks for ends. Pending reasons'
        re-reads run beside the passes, never in their way.
        """
        followed = self._followed_now()
        if not followed:
            self.passes += 1
            return
        now = self._clock()
        pending = self._pending_followed()
        started = await self._jobs_started() if pending else None
        moved = started is None or started != self._started_at_probe
        if self._walk_due(now, pending and moved):
            self._walked_version, self._dirty, self._next_due = self.jobs.version, False, float("-inf")
            may_start, on_move, running, next_due = self._due(followed, now, moved)
            self.walks += 1
        else:
            may_start, on_move, running, next_due = [], [], [], self._next_due
        # How many jobs slurmctld started since the last probe: once that many starts are found,
        # the other pending jobs need not be asked. Unknown (no count, a first probe, a count
        # that went back with a restart of slurmctld): every one is asked.
        previous = self._started_at_probe
        starts = started - previous if started is not None and previous is not None else None
        states = await self._probe(
            may_start, now, tell_starts=True, until_found=(on_move, starts if starts and starts > 0 else None)
        )
        if started is not None and (may_start or on_move):
            self._started_at_probe = started
        states.update(await self._probe(running, now, tell_starts=False))
        self._next_due = next_due  # only once the probes answered: a failed pass walks again
        changed = self._changed(followed, states, now)
        refresh = self._refresh_due(followed, now, skip=set(changed))
        # A job not probed this pass is as its last probe found it (read for its pending reason).
        for job_id in refresh:
            seen = self._seen.get(job_id)
            if job_id not in states and seen is not None and seen.states is not None:
                states[job_id] = seen.states
        if refresh:
            self._refreshing = asyncio.create_task(self._refresh(refresh, states), name="pending reasons")
        await self._read_all(changed, states)
        self.passes += 1

    def _walk_due(self, now: float, pending_moved: bool) -> bool:
        """Whether this pass must walk the followed jobs to find the due ones (else none is due)."""
        changed = self._dirty or self.jobs.version != self._walked_version
        return pending_moved or changed or now >= self._next_due

    async def _probe(
        self,
        job_ids: list[int],
        now: float,
        *,
        tell_starts: bool,
        until_found: tuple[list[int], int | None] = ([], None),
    ) -> dict[int, list[str] | None]:
        """The jobs' states (None: Slurm does not know the job), asked in groups of PROBE_GROUP
        ids, PROBE_CONCURRENCY groups at once.

        Newest first: Slurm starts most jobs in the scheduling pass after their submission. With
        `tell_starts`, a group's starts are told as soon as that group answers, not after the
        last of them (at 5,000 pending jobs, 20 groups).

        `until_found` (pending jobs, starts): those jobs are asked after `job_ids`, in the order
        of `_start_order`, until that many starts were found in this probe (None: all of them).
        """
        states: dict[int, list[str] | None] = {}
        slots = asyncio.Semaphore(PROBE_CONCURRENCY)
        optional, starts = until_found
        found = 0
        # The optional groups after the first wait for its answer when a count of starts is to be
        # found: most are found there.
        first_answered = asyncio.Event()

        async def ask(group: list[int], optional_at: int | None = None) -> None:
            nonlocal found
            if optional_at and starts is not None:
                await first_answered.wait()
            try:
                async with slots:
                    if optional_at is not None and starts is not None and found >= starts:
                        self.state_probes_spared += len(group)
                        return
                    self.state_probes += len(group)
                    answered = await self.slurm.job_states(group)
            finally:
                if optional_at == 0:
                    first_answered.set()
            for job_id in group:
                self._probed_at[job_id] = now
                states[job_id] = answered.get(job_id)
            if tell_starts:
                for job_id in self._started(answered):
                    found += 1
                    self._tell_started(job_id, answered[job_id])

        newest_first = sorted(job_ids, reverse=True)
        groups = [newest_first[at : at + PROBE_GROUP] for at in range(0, len(newest_first), PROBE_GROUP)]
        in_turn = self._start_order(optional)
        later = [in_turn[at : at + PROBE_GROUP] for at in range(0, len(in_turn), PROBE_GROUP)]
        results = await asyncio.gather(
            *(ask(group) for group in groups),
            *(ask(group, at) for at, group in enumerate(later)),
            return_exceptions=True,
        )
        failures = [result for result in results if isinstance(result, BaseException)]
        if failures:
            raise failures[0]
        return states

    @staticmethod
    def _start_order(job_ids: list[int]) -> list[int]:
        """The order pending jobs are asked in when only their starts are looked for: the newest
        group (jobs Slurm may start in the pass after their submission), then oldest first (the
        order Slurm starts waiting jobs in, by default)."""
        newest_first = sorted(job_ids, reverse=True)
        return newest_first[:PROBE_GROUP] + newest_first[PROBE_GROUP:][::-1]

    async def _read_all(self, job_ids: list[int], states: Mapping[int, list[str] | None]) -> None:
        if not job_ids:
            return
        slots = asyncio.Semaphore(READ_CONCURRENCY)
        self._reading.update(job_ids)
        try:
            results = await asyncio.gather(
                *(self._read(job_id, states.get(job_id), slots) for job_id in job_ids),
                return_exceptions=True,
            )
        finally:
            self._reading.difference_update(job_ids)
        failures = [result for result in results if isinstance(result, BaseException)]
        if failures:
            raise failures[0]

    async def _refresh(self, job_ids: list[int], states: Mapping[int, list[str] | None]) -> None:
        """Re-read pending jobs for their reasons; a failure leaves them due (logged, not fatal)."""
        try:
            await self._read_all(job_ids, states)
        except SlurmError as error:
            log.warning("re-reading %d pending jobs for their reasons failed: %s", len(job_ids), error)
        except Exception:
            log.exception("re-reading %d pending jobs for their reasons failed", len(job_ids))

    async def wait_idle(self) -> None:
        """Until the pending reasons' re-reads are done and every signal submitted so far was
        delivered (or found its placement closed)."""
        if self._refreshing is not None:
            await asyncio.gather(self._refreshing, return_exceptions=True)
        await self._delivery.wait_idle()

    async def close(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
            await asyncio.gather(self._refreshing, return_exceptions=True)
        await self._delivery.close()

    # -- a pass ----------------------------------------------------------------

    def _followed_now(self) -> dict[int, str]:
        """This installation's jobs among the live ones; derived again only when those changed."""
        if self.jobs.version != self._followed_version:
            self._followed = self.jobs.of_installation(self.installation)
            self._followed_version = self.jobs.version
            self._forget_except(self._followed)
        return self._followed

    def _ours(self, placement_id: str) -> bool:
        try:
            return installation_of(placement_id) == self.installation
        except ValueError:
            return False

    def _forget_except(self, followed: Mapping[int, str]) -> None:
        """Drop what is known about jobs no longer followed: memory follows LiveJobs."""
        for job_id in [job_id for job_id in self._seen if job_id not in followed]:
            del self._seen[job_id]
        for known in (self._probed_at, self._pending_since):
            for job_id in [job_id for job_id in known if job_id not in followed]:
                del known[job_id]
        self._withheld &= set(followed)
        for key in [key for key in self._told if _job_of(key) not in followed]:
            del self._told[key]
        self._closed = {key: seen for key, seen in self._closed.items() if _job_of(key) in followed}

    def _pending_followed(self) -> bool:
        """Whether any followed job was last seen pending (only those are worth the count).

        Newest first: the jobs still pending are mostly the last submitted, and the oldest are
        mostly running, so the walk usually stops within the first few.
        """
        return any(
            seen.states is not None and "PENDING" in seen.states for seen in reversed(self._seen.values())
        )

    async def _jobs_started(self) -> int | None:
        """slurmctld's count of started jobs; None where Slurm does not give it.

        None makes the pass probe every pending job, as it would without the count: an answer
        without it, or a refusal, turns it off for good (said once); Slurm away fails the
        pass, as the probe would.
        """
        if not self.gate_on_starts:
            return None
        try:
            started = await self.slurm.jobs_started()
        except (SlurmUnavailable, SlurmAuthError):
            raise  # Slurm away, or the token refused: the probe would fail alike
        except SlurmError as error:
            # Refused (a slurmrestd that does not serve /diag/ to this user), or no count in it.
            log.warning("no count of started jobs from slurmctld (%s): each pass probes every job", error)
            self.gate_on_starts = False
            return None
        self.counter_reads += 1
        return started

    def _due(
        self, followed: Iterable[int], now: float, moved: bool
    ) -> tuple[list[int], list[int], list[int], float]:
        """The jobs this pass asks Slurm the state of (those that may have started; the pending
        ones due only because slurmctld started some job, asked until its starts are found; the
        running ones), and when the next pass will have one due at the latest, if no state
        changes.

        A job the watcher knows nothing of yet, always. A running one, every RUNNING_PROBE_SECONDS
        (its end evicts pods; nothing waits on it to bind). A pending one when slurmctld's count
        of started jobs moved since the last probe (its start is what its pods wait for), and
        otherwise every `pending_probe` seconds, for what else can end a pending job (a cancel
        by someone else, a failure, a deadline). One loop with its lookups bound once: it runs
        over every followed job whenever one may be due.
        """
        seen_of, probed_at, never = self._seen.get, self._probed_at.get, float("-inf")
        may_start: list[int] = []
        on_move: list[int] = []
        running: list[int] = []
        next_due = float("inf")
        for job_id in followed:
            seen = seen_of(job_id)
            if seen is None or seen.states is None or seen.unread:
                may_start.append(job_id)
                next_due = now
                continue
            last = probed_at(job_id, never)
            if "RUNNING" in seen.states:
                if now - last >= RUNNING_PROBE_SECONDS:
                    running.append(job_id)
                    last = now
                next_due = min(next_due, last + RUNNING_PROBE_SECONDS)
            elif "PENDING" in seen.states:
                if now - last >= self.pending_probe:
                    may_start.append(job_id)
                    last = now
                elif moved:
                    on_move.append(job_id)  # perhaps not asked: due by its last probe's time
                next_due = min(next_due, last + self.pending_probe)
            else:
                may_start.append(job_id)
                next_due = now
        return may_start, on_move, running, next_due

    def _changed(
        self, followed: Mapping[int, str], probed: Mapping[int, list[str] | None], now: float
    ) -> list[int]:
        """The probed jobs to read: their state changed, Slurm no longer knows them, or they are
        new to the watcher (a pending one once it has waited the grace). A job whose read is still
        out (a re-read beside the passes) is left to the next pass.
        """
        changed: list[int] = []
        for job_id, state in probed.items():
            placement_id = followed.get(job_id)
            if placement_id is None:
                continue
            seen = self._seen.get(job_id)
            if self._read_later(job_id, placement_id, seen, state, now):
                continue
            if (seen is None or seen.states != state or seen.unread) and job_id not in self._reading:
                changed.append(job_id)
        return changed

    def _refresh_due(self, followed: Iterable[int], now: float, *, skip: set[int]) -> list[int]:
        """Pending jobs whose reason is due for a re-read: the longest unread first, at most
        MAX_REFRESHES, chosen at most every REFRESH_CHOICE_SECONDS and only once the previous
        re-reads are done (a sort of every pending job never)."""
        if now < self._next_refresh_choice or (self._refreshing is not None and not self._refreshing.done()):
            return []
        self._next_refresh_choice = now + REFRESH_CHOICE_SECONDS
        due: list[tuple[float, int]] = []
        seen_of, reading = self._seen.get, self._reading
        for job_id in followed:
            seen = seen_of(job_id)
            if seen is None or seen.states is None or seen.unread or "PENDING" not in seen.states:
                continue
            if job_id in reading or job_id in skip:
                continue
            # The reason is set by the scheduler's first look at the job: soon.
            soon = seen.reason in _NO_REASON or job_id in self._withheld
            every = self.interval if soon else seen.refresh_every
            if now - seen.read_at >= every:
                due.append((seen.read_at, job_id))
        return [job_id for _, job_id in heapq.nsmallest(MAX_REFRESHES, due)]

    def _read_later(
        self, job_id: int, placement_id: str, seen: _Seen | None, state: list[str] | None, now: float
    ) -> bool:
        """A job new to the watcher that is pending: not read before it has waited the grace.

        Its pending reason would be withheld that long anyway (see `_signal`), and Slurm starts
        most jobs in its next scheduling pass: those are told from the probe alone when they
        start (`_started`), and never read while pending.
        """
        fresh = seen is None or (seen.unread and seen.states == state)
        if not fresh or state is None or "PENDING" not in state:
            return False
        since = self._pending_since.setdefault(job_id, now)
        if now - since >= self.pending_reason_grace:
            return False
        if seen is None:
            self._remember(job_id, _Seen(state, 0.0, placement=placement_id, unread=True))
        return True

    def _remember(self, job_id: int, seen: _Seen) -> None:
        """What a read or a probe learnt of a job; a new state makes the next pass walk every job."""
        before = self._seen.get(job_id)
        if before is None or before.states != seen.states or before.unread != seen.unread:
            self._dirty = True
        self._seen[job_id] = seen

    def _started(self, states: Mapping[int, list[str]]) -> list[int]:
        """Jobs last seen pending that the probe now finds running: told without a read.

        A full read that saw them pending checked that each is the bridge's job (its
        comment) and carried its restart count; a job that started before it was ever read
        is named by its pods, and the bind step, which reads the job for its nodes, checks
        its comment against the placement. Any other change (an end, a requeue, a job new to
        the watcher) is read.
        """
        started = []
        for job_id, state in states.items():
            seen = self._seen.get(job_id)
            if seen is None or seen.states is None or "PENDING" not in seen.states or not state:
                continue
            if seen.placement is None:
                continue
            if "RUNNING" in state and not ENDED_JOB_STATES.intersection(state):
                started.append(job_id)
        return started

    def _tell_started(self, job_id: int, state: list[str]) -> None:
        seen = self._seen[job_id]
        event = JobEvent(job_id=job_id, states=state, restarts=seen.restarts)
        self._remember(job_id, _Seen(state, seen.read_at, restarts=seen.restarts, placement=seen.placement))
        self._pending_since.pop(job_id, None)
        self.started_unread += 1
        if seen.placement is not None and self._ours(seen.placement):
            self._signal(workflow_id_of(seen.placement), event)

    def _next_refresh(self, before: _Seen | None, state: list[str] | None, event: JobEvent) -> float:
        """A pending job whose reason stayed the same is re-read half as often as before."""
        unchanged = before is not None and before.states == state and before.reason == event.reason
        if unchanged and before is not None and event.reason not in _NO_REASON:
            return min(before.refresh_every * 2, self.pending_refresh_max)
        return self.pending_refresh

    async def _read(self, job_id: int, state: list[str] | None, slots: asyncio.Semaphore) -> None:
        before = self._seen.get(job_id)
        async with slots:
            try:
                # Every component of a heterogeneous job, leader first (one for an ordinary job).
                components: list[JobInfo] = await self.slurm.get_job_components(job_id)
            except SlurmNotFound:
                components = []
        self.job_gets += 1
        placement_id = self.jobs.placement_of(job_id)
        if placement_id is None:
            return  # no longer followed: its pods went, or its end was told, while this read was out
        if self._seen.get(job_id) is not before:
            return  # a pass told newer news from its probe (a start) while this re-read was out
        if not components:
            event = JobEvent(job_id=job_id, states=[], gone=True)
            self._remember(job_id, _Seen(None, self._clock()))
        else:
            event = job_event_of(components)
            comment = placement_of(components[0])
            if comment is None:
                # The id names a job that is not the bridge's (Slurm's state was wiped
                # and the id handed out again): the followed job is gone.
                event = JobEvent(job_id=job_id, states=[], gone=True)
            elif comment != placement_id:
                log.warning(
                    "Slurm job %s has comment %s, its pods name placement %s; following the comment",
                    job_id,
                    comment,
                    placement_id,
                    extra={"job_id": job_id},
                )
                placement_id = comment
            # The state as probed, not as read: a change between the two is seen next pass.
            self._remember(
                job_id,
                _Seen(
                    state,
                    self._clock(),
                    event.reason,
                    self._next_refresh(self._seen.get(job_id), state, event),
                    event.restarts,
                    comment,
                ),
            )
        if placement_id is None or not self._ours(placement_id):
            return
        self._signal(workflow_id_of(placement_id), event)

    def _signal(self, workflow_id: str, event: JobEvent) -> None:
        # Keyed by job too: an old job of the same placement must not displace the current one.
        key = f"{workflow_id}#{event.job_id}"
        if self._closed.get(key) == event:
            return  # told to nobody: no placement ran for it, and nothing changed since
        if event.pending and event.reason not in _NO_REASON:
            # Slurm's first scheduling pass often says Priority for a moment before it starts
            # the job: a reason is news only once the job has waited a little (then re-read soon).
            since = self._pending_since.setdefault(event.job_id, self._clock())
            if self._clock() - since < self.pending_reason_grace:
                self._withheld.add(event.job_id)
                return
        self._withheld.discard(event.job_id)
        if not event.pending:
            self._pending_since.pop(event.job_id, None)
        if key not in self._told and _just_submitted(event):
            # The placement knows it submitted the job: "pending, not yet looked at by
            # the scheduler" is no news, and every signal is a billable action.
            return
        if self._told.get(key) == event:
            if not is_live(event):
                self.jobs.finished(event.job_id)
            return
        self._delivery.submit(key, event)

    async def _deliver(self, key: str, event: JobEvent) -> None:
        workflow_id = key.rpartition("#")[0]
        try:
            await self.temporal.get_workflow_handle(workflow_id).signal(PlacementWorkflow.job_changed, event)
        except RPCError as error:
            if error.status != RPCStatusCode.NOT_FOUND:
                raise
            # No placement runs for it now. A new run of the same workflow id may take it over
            # (the sweep's adoption, an operator's retry): the next change is delivered again.
            self._closed[key] = event
            if not is_live(event):
                self.jobs.finished(event.job_id)
            return
        self.signals += 1
        self._told[key] = event
        if not is_live(event):
            self.jobs.finished(event.job_id)  # told it is over: stop asking about it

    async def _back_off(self, seconds: float) -> None:
        """Sleep after a failed pass; while Slurm is away, only until the health gate opens again."""
        health = self.slurm_health
        if health is not None and not health.available:
            await health.wait_available(seconds)
        else:
            await asyncio.sleep(seconds)

    async def _failed(self, retry_state: RetryCallState) -> None:
        self.errors += 1
        self.failing += 1
        error = retry_state.outcome.exception() if retry_state.outcome is not None else None
        delay = retry_state.upcoming_sleep
        if isinstance(error, SlurmError):
            # Slurm's own message says it all (slurmrestd down, slow, token refused).
            log.warning("job watcher pass failed, next try in %.1f s: %s", delay, error)
        else:
            log.error("job watcher pass failed, next try in %.1f s", delay, exc_info=error)


def _just_submitted(event: JobEvent) -> bool:
    return event.states == ["PENDING"] and event.reason in _NO_REASON and not event.nodes


def _job_of(key: str) -> int:
    return int(key.rpartition("#")[2])
