"""The job watcher at a site's size: one watcher following 100, 1,000 and 10,000 live bridge jobs.

    python -m bench.watcher [--live 100,1000,10000] [--running 5000] [--foreign 20000]
                            [--seconds 20] [--probes 20] [--turnover 20] [--json FILE]

The job watcher (worker/job_watcher.py) is the one loop whose Slurm cost grows with the bridge's
own jobs: each pass asks Slurm about the jobs it follows. This runs the watcher itself against
the real Slurm bed, with `--foreign` held jobs of another user in Slurm (a shared cluster's
queue) and the largest `--live` count of external jobs carrying a placement's comment, submitted
as the bridge submits them into a partition of `--running` CPUs (nodes of 50): the first
`--running` jobs run, the others wait on Resources, and slurmctld schedules that queue as it
would a site's (with the defaults, 5,000 running and 5,000 pending at 10,000, as the placement
benchmark's site scenario). A level follows the first jobs submitted. Temporal is a stub: the
signals are counted and timed, not sent.

For each count of followed jobs, after the watcher has read every job once (what a leader's
restart costs, printed too), for `--seconds`:
- passes per second and a pass's mean and p99 time;
- Slurm requests per pass, their query-string characters and answer bytes;
- slurmctld's and slurmrestd's CPU per second, with what they spend idle (measured first, for
  the same time, with no watcher) subtracted; and the watcher's own CPU per second;
- slurmctld's main and backfill scheduling cycles (`GET /diag/`): the share of the time they
  held its job lock, which every job query waits out, and their mean length;
- then `--probes` jobs, one a second, in a partition of their own with free CPUs, followed as
  they are submitted (as the pod watcher follows a placement's job once its pods carry the id):
  from slurmctld's start (its log, ms) to the watcher's `job_changed` signal saying RUNNING, p50
  and p99: the job watcher's share of a pod's time from Slurm RUNNING to bound. Beside it, each
  probe's own reader asks for that job alone every 20 ms: from the start logged to the first
  answer saying RUNNING, what Slurm itself takes to show a start to anyone (its scheduling pass
  holds the job lock meanwhile), which no watcher can beat;
- then `--turnover` of the followed running jobs, one a second, cancelled as a finished pod's
  placement cancels its job: slurmctld starts a waiting job in each one's place, a job the
  watcher has seen pending, as at a full site. From slurmctld's start to the watcher's signal,
  p50 and p99, and the watcher's requests and Slurm's CPU a second meanwhile (beside the same
  while the probes start, jobs the watcher never saw pending).

Figures are printed, never asserted. Every job it submitted is cancelled at the end.
"""

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, cast

import httpx
from temporalio.client import Client

from bench.placement.driver import remove_partition
from bench.placement.environment import connect_slurm, say
from bench.probes import CountingTransport, cpu_seconds, percentile, pids_by_comm
from bench.slurm import running_times
from bridge.models import JobEvent, admin_comment_for
from clients.slurm_client import SlurmClient
from testbed.slurm_bed import SlurmBedError, SlurmTestBed, TestPartition, wait_until
from worker.job_registry import LiveJobs
from worker.job_watcher import JobWatcher

INSTALLATION = "bench-watcher"
PLACEMENT = f"placement/{INSTALLATION}/bench/pods@1"
BRIDGE_JOB_NAME = "bench-watcher-live"
FOREIGN_JOB_NAME = "bench-watcher-foreign"
CPUS_PER_NODE = 50
JOB_MEMORY_MB = 100  # each job's; without it a job would take its node's whole memory
PROBE_RATE = 1.0  # probe jobs submitted per second
POLL_SECONDS = 0.02  # a probe's own reader: when Slurm first answers RUNNING, to anyone


class _Signals:
    """Temporal as the watcher sees it: `get_workflow_handle(id).signal(...)`, counted and timed."""

    def __init__(self) -> None:
        self.sent = 0
        self.told_running: dict[int, float] = {}  # job id → first signal saying RUNNING (Unix time)
        self.told = asyncio.Condition()

    def get_workflow_handle(self, workflow_id: str) -> "_Signals":
        return self

    async def signal(self, _signal: object, event: JobEvent) -> None:
        self.sent += 1
        if "RUNNING" in event.states:
            self.told_running.setdefault(event.job_id, time.time())
            async with self.told:
                self.told.notify_all()


class _QueryCounting(CountingTransport):
    """Also counts the characters of every request's query string."""

    def __init__(self) -> None:
        super().__init__()
        self.query_chars = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.query_chars += len(request.url.query)
        return await super().handle_async_request(request)


class Probes:
    """Jobs submitted one a second into a partition with free CPUs, each followed at once."""

    def __init__(self, bed: SlurmTestBed, partition: TestPartition, count: int) -> None:
        self.bed, self.partition, self.count = bed, partition, count

    async def run(self, jobs: LiveJobs, signals: _Signals) -> dict[str, float | None]:
        """From slurmctld's start (its log) to the watcher's signal, and to the first answer that
        says RUNNING to a reader asking for that job alone every POLL_SECONDS, ms: p50, p99, n."""
        submitted: list[int] = []
        visible: dict[int, float] = {}
        body = _bridge_job(self.partition.name, hold=False)
        headers = {"X-SLURM-USER-NAME": self.bed.user_name, "X-SLURM-USER-TOKEN": self.bed.token()}
        async with httpx.AsyncClient(
            base_url=f"{self.bed.rest_url}/slurm/v0.0.44", headers=headers, timeout=60
        ) as client:

            async def until_visible(job_id: int) -> None:
                while True:
                    answer = await client.get("/jobs/state/", params={"job_id": str(job_id)})
                    if any("RUNNING" in (job.get("state") or ()) for job in answer.json().get("jobs") or []):
                        visible[job_id] = time.time()
                        return
                    await asyncio.sleep(POLL_SECONDS)

            readers = []
            for _ in range(self.count):
                response = await client.post("/job/submit", json=body)
                if response.status_code != 200:
                    raise SlurmBedError(f"a probe: HTTP {response.status_code} {response.text[:300]}")
                job_id = int(response.json()["job_id"])
                jobs.track(job_id, PLACEMENT)
                submitted.append(job_id)
                readers.append(asyncio.create_task(until_visible(job_id)))
                await asyncio.sleep(1 / PROBE_RATE)
            async with signals.told:
                with contextlib.suppress(TimeoutError):  # the untold are left out of the figures
                    told_all = signals.told_running.keys()
                    await asyncio.wait_for(signals.told.wait_for(lambda: told_all >= set(submitted)), 60)
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
            for job_id in submitted:  # freed for the next level's probes
                await client.delete(f"/job/{job_id}")
        started = await asyncio.to_thread(running_times, self.bed, submitted)

        def since_start(at: dict[int, float]) -> list[float]:
            return [1000 * (at[job] - started[job]) for job in submitted if job in started and job in at]

        told, seen = since_start(signals.told_running), since_start(visible)
        return {
            "p50": _ms(percentile(told, 50)),
            "p99": _ms(percentile(told, 99)),
            "n": len(told),
            "visible_p50": _ms(percentile(seen, 50)),
            "visible_p99": _ms(percentile(seen, 99)),
        }


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


class _TimedWatcher(JobWatcher):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pass_seconds: list[float] = []
        self._passed = asyncio.Condition()

    async def poll(self) -> None:
        started = time.perf_counter()
        await super().poll()
        self.pass_seconds.append(time.perf_counter() - started)
        async with self._passed:
            self._passed.notify_all()

    async def pass_where(self, done: Callable[[], bool], timeout: float = 900.0) -> None:
        """Until a pass ends with `done()` true."""
        async with self._passed:
            await asyncio.wait_for(self._passed.wait_for(done), timeout)


@dataclass
class Level:
    followed: int
    first_read_seconds: float  # until every followed job was read once (a leader's restart)
    passes_per_second: float
    pass_mean_ms: float
    pass_p99_ms: float
    requests_per_pass: dict[str, float]
    query_chars_per_pass: float
    answer_bytes_per_pass: float
    slurmctld_cpu_per_second: float | None  # idle cost subtracted
    slurmrestd_cpu_per_second: float | None  # idle cost subtracted
    watcher_cpu_per_second: float
    followed_running: int = 0  # of the followed jobs, those Slurm runs (the rest pending)
    # slurmctld's scheduling over the window: {"main"|"backfill": (share of the time, mean cycle ms)}
    scheduling: dict[str, tuple[float, float | None]] | None = None
    started_to_told_ms: dict[str, float | None] | None = None  # probes: p50, p99, n
    # While the probes run (a start a second, which moves slurmctld's count of started jobs):
    # the watcher's requests by kind and Slurm's CPU, per second.
    while_starting: dict[str, float | None] | None = None
    # Running jobs cancelled one a second, waiting ones started in their place: the same, and
    # slurmctld's start -> the watcher's signal, ms (p50, p99, n started, n told).
    while_turning_over: dict[str, float | None] | None = None


class SlurmCpu:
    def __init__(self, bed: SlurmTestBed) -> None:
        chroot = bed.jwt_file.parent / "root"
        self.slurmctld = next(iter(pids_by_comm("slurmctld", chroot)), None)
        self.slurmrestd = next(iter(pids_by_comm("slurmrestd", chroot)), None)

    def sample(self) -> tuple[float | None, float | None]:
        return cpu_seconds(self.slurmctld), cpu_seconds(self.slurmrestd)


def _delta(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


async def idle_cost(cpu: SlurmCpu, seconds: float) -> tuple[float | None, float | None]:
    """slurmctld's and slurmrestd's CPU per second with nobody asking them anything."""
    before = cpu.sample()
    await asyncio.sleep(seconds)
    after = cpu.sample()
    ctld, restd = (_delta(a, b) for a, b in zip(after, before, strict=True))
    return (None if ctld is None else ctld / seconds, None if restd is None else restd / seconds)


async def measure(
    bed: SlurmTestBed,
    job_ids: Sequence[int],
    seconds: float,
    interval: float,
    idle: tuple[float | None, float | None],
    probes: "Probes",
    turnover_count: int,
) -> Level:
    cpu = SlurmCpu(bed)
    transport = _QueryCounting()
    slurm = SlurmClient(bed.rest_url, user_name=bed.user_name, token_file=bed.jwt_file, transport=transport)
    jobs = LiveJobs()
    for job_id in job_ids:
        jobs.track(job_id, PLACEMENT)
    ready = asyncio.Event()
    ready.set()
    signals = _Signals()
    watcher = _TimedWatcher(
        slurm,
        cast(Client, signals),
        jobs,
        installation=INSTALLATION,
        ready=ready,
        interval=interval,
    )
    started = time.monotonic()
    loop = asyncio.create_task(watcher.run(), name="job watcher")
    try:
        # Every job read once, or the watcher's own end (its error) if it stops first.
        passed = asyncio.create_task(watcher.pass_where(lambda: watcher.job_gets >= len(job_ids)))
        await asyncio.wait({passed, loop}, return_when=asyncio.FIRST_COMPLETED)
        if not passed.done():
            passed.cancel()
            loop.result()
            raise RuntimeError("the job watcher stopped before it had read every job")
        passed.result()
        first_read = time.monotonic() - started
        passes = len(watcher.pass_seconds)
        transport.stats.reset()
        transport.query_chars = 0
        cycles_before = await asyncio.to_thread(scheduler_cycles, bed)
        cpu_before, mine_before, at = cpu.sample(), cpu_seconds(os.getpid()) or 0.0, time.monotonic()
        await asyncio.sleep(seconds)
        cpu_after, mine_after, wall = cpu.sample(), cpu_seconds(os.getpid()) or 0.0, time.monotonic() - at
        cycles_after = await asyncio.to_thread(scheduler_cycles, bed)
        timed = watcher.pass_seconds[passes:]
        stats = transport.stats.snapshot()
        query_chars = transport.query_chars
        running = sum(1 for state in (await slurm.job_states(job_ids)).values() if "RUNNING" in state)
        transport.stats.reset()
        probing = sample(cpu)
        started_to_told = await probes.run(jobs, signals)
        while_starting = phase_costs(transport, cpu, idle, probing)
        transport.stats.reset()
        turning = sample(cpu)
        turned_over = await turnover(bed, job_ids, turnover_count, signals)
        while_turning_over = {**phase_costs(transport, cpu, idle, turning), **turned_over}
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        await watcher.close()
        await slurm.close()
    count = max(len(timed), 1)

    return Level(
        followed=len(job_ids),
        first_read_seconds=round(first_read, 2),
        passes_per_second=round(len(timed) / wall, 2),
        pass_mean_ms=round(1000 * sum(timed) / count, 2),
        pass_p99_ms=round(1000 * (percentile(timed, 99) or 0.0), 2),
        requests_per_pass={op: round(n / count, 2) for op, n in sorted(stats.count.items())},
        query_chars_per_pass=round(query_chars / count),
        answer_bytes_per_pass=round(sum(stats.bytes_in.values()) / count),
        slurmctld_cpu_per_second=_round(_rate(cpu_after[0], cpu_before[0], wall, idle[0])),
        slurmrestd_cpu_per_second=_round(_rate(cpu_after[1], cpu_before[1], wall, idle[1])),
        watcher_cpu_per_second=round((mine_after - mine_before) / wall, 4),
        followed_running=running,
        scheduling=scheduling_share(cycles_before, cycles_after, wall),
        started_to_told_ms=started_to_told,
        while_starting=while_starting,
        while_turning_over=while_turning_over,
    )


Sample = tuple[tuple[float | None, float | None], float, float]  # Slurm's CPU, the watcher's, when


def sample(cpu: SlurmCpu) -> Sample:
    """Slurm's CPU so far, this process's (the watcher's), and the time: a phase's start."""
    return cpu.sample(), cpu_seconds(os.getpid()) or 0.0, time.monotonic()


def phase_costs(
    transport: "_QueryCounting", cpu: SlurmCpu, idle: tuple[float | None, float | None], since: Sample
) -> dict[str, float | None]:
    """The watcher's requests by kind, the KiB answered, and Slurm's and the watcher's CPU, a
    second since `since` (the transport's counts reset then)."""
    (ctld, restd), mine, at = since
    (ctld_after, restd_after), mine_after, now = sample(cpu)
    wall = now - at
    stats = transport.stats.snapshot()
    return {
        **{f"{op} /s": round(n / wall, 2) for op, n in sorted(stats.count.items())},
        "KiB answered /s": round(sum(stats.bytes_in.values()) / 1024 / wall, 1),
        "slurmctld CPU s/s (idle subtracted)": _round(_rate(ctld_after, ctld, wall, idle[0])),
        "slurmrestd CPU s/s (idle subtracted)": _round(_rate(restd_after, restd, wall, idle[1])),
        "watcher CPU s/s": round((mine_after - mine) / wall, 4),
    }


async def turnover(
    bed: SlurmTestBed, job_ids: Sequence[int], count: int, signals: _Signals
) -> dict[str, float | None]:
    """`count` of the running jobs cancelled, one a second; slurmctld starts waiting ones in their
    place. From each start (slurmctld's log) to the watcher's signal saying RUNNING, ms."""
    states = await asyncio.to_thread(bed.job_states, job_ids)
    running = sorted(job_id for job_id, state in states.items() if "RUNNING" in state)
    waiting = {job_id for job_id, state in states.items() if "PENDING" in state}
    if not waiting:
        return {"jobs started": 0}
    for job_id in running[:count]:
        await asyncio.to_thread(bed.rest, "DELETE", f"/job/{job_id}")
        await asyncio.sleep(1.0)
    # As many waiting jobs start as ran ended; the watcher's signals say when it has told them.
    expected, told_all = min(count, len(running)), signals.told_running.keys()
    async with signals.told:
        with contextlib.suppress(TimeoutError):  # the untold are left out of the figures
            await asyncio.wait_for(signals.told.wait_for(lambda: len(told_all & waiting) >= expected), 60)
    started = await asyncio.to_thread(running_times, bed, waiting)
    told = [
        1000 * (signals.told_running[job] - at) for job, at in started.items() if job in signals.told_running
    ]
    return {
        "jobs started": len(started),
        "jobs told": len(told),
        "started -> told RUNNING, p50 ms": _ms(percentile(told, 50)),
        "started -> told RUNNING, p99 ms": _ms(percentile(told, 99)),
    }


def _rate(after: float | None, before: float | None, wall: float, idle_rate: float | None) -> float | None:
    """CPU seconds a second between two samples, with the idle rate subtracted."""
    spent = _delta(after, before)
    return None if spent is None or idle_rate is None else spent / wall - idle_rate


def scheduler_cycles(bed: SlurmTestBed) -> dict[str, tuple[int, int]]:
    """slurmctld's scheduling cycles so far (`GET /diag/`, as `sdiag`): {scheduler: (count, µs)}.

    A cycle holds slurmctld's job lock (backfill lets go for `bf_yield_sleep` every
    `bf_yield_interval`, 2 s by default): a job query (the watcher's probe, `squeue`) waits for
    it, so the cycles' share of the time is how often a reader has to wait one out."""
    stats = bed.rest("GET", "/diag/").json().get("statistics") or {}
    return {
        "main": (int(stats.get("schedule_cycle_total") or 0), int(stats.get("schedule_cycle_sum") or 0)),
        "backfill": (int(stats.get("bf_cycle_counter") or 0), int(stats.get("bf_cycle_sum") or 0)),
    }


def scheduling_share(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], wall: float
) -> dict[str, tuple[float, float | None]]:
    """Per scheduler: the share of `wall` its cycles took, and their mean length in ms."""
    shares: dict[str, tuple[float, float | None]] = {}
    for scheduler, (count, spent) in after.items():
        cycles, micros = count - before[scheduler][0], spent - before[scheduler][1]
        if cycles < 0 or micros < 0:  # the statistics were reset meanwhile (midnight, a restart)
            cycles, micros = count, spent
        mean = round(micros / 1000 / cycles, 1) if cycles else None
        shares[scheduler] = (round(micros / 1e6 / wall, 3), mean)
    return shares


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def print_levels(levels: Sequence[Level], foreign: int) -> None:
    def row(label: str, values: Sequence[object]) -> None:
        print(f"| {label} | " + " | ".join(str(value) for value in values) + " |")

    print(f"\nJob watcher; {foreign:,} foreign jobs in Slurm\n")
    row("followed jobs", [f"{level.followed:,}" for level in levels])
    print("|---|" + "---|" * len(levels))
    row("of them running (the rest pending)", [f"{level.followed_running:,}" for level in levels])
    row("first read of every job, s", [level.first_read_seconds for level in levels])
    row("passes/s", [level.passes_per_second for level in levels])
    row("pass mean / p99, ms", [f"{level.pass_mean_ms} / {level.pass_p99_ms}" for level in levels])
    operations = sorted({op for level in levels for op in level.requests_per_pass})
    for op in operations:
        row(f"{op} per pass", [level.requests_per_pass.get(op, 0) for level in levels])
    row("query characters per pass", [f"{level.query_chars_per_pass:,}" for level in levels])
    row("answer bytes per pass", [f"{level.answer_bytes_per_pass:,}" for level in levels])
    row("slurmctld CPU s/s (idle subtracted)", [level.slurmctld_cpu_per_second for level in levels])
    row("slurmrestd CPU s/s (idle subtracted)", [level.slurmrestd_cpu_per_second for level in levels])
    row("watcher CPU s/s", [level.watcher_cpu_per_second for level in levels])
    for scheduler in ("main", "backfill"):
        shares = [(level.scheduling or {}).get(scheduler) for level in levels]
        row(
            f"slurmctld {scheduler} scheduler: share of the time / mean cycle, ms",
            [f"{share[0]:.0%} / {share[1]}" if share else None for share in shares],
        )
    told = [level.started_to_told_ms or {} for level in levels]
    row("probe started -> told RUNNING, p50 ms", [figures.get("p50") for figures in told])
    row("probe started -> told RUNNING, p99 ms", [figures.get("p99") for figures in told])
    row("probe started -> RUNNING answered at all, p50 ms", [figures.get("visible_p50") for figures in told])
    row("probe started -> RUNNING answered at all, p99 ms", [figures.get("visible_p99") for figures in told])
    phases = (("while_starting", "while the probes start"), ("while_turning_over", "while jobs turn over"))
    for phase, label in phases:
        figures_of = [getattr(level, phase) or {} for level in levels]
        for name in sorted({name for figures in figures_of for name in figures}):
            row(f"{label}: {name}", [figures.get(name) for figures in figures_of])


def _bridge_job(partition: str, *, hold: bool) -> dict[str, Any]:
    """An external job as the bridge's user submits it: the placement's id as comment and the
    pods in admin_comment (which only an operator may set), so the watcher follows it."""
    return {
        "job": {
            "name": BRIDGE_JOB_NAME,
            "flags": ["EXTERNAL_JOB"],
            "hold": hold,
            "nodes": "1",
            "minimum_cpus": 1,
            "memory_per_node": {"set": True, "number": JOB_MEMORY_MB},
            "partition": partition,
            "current_working_directory": "/tmp",
            "comment": PLACEMENT,
            "admin_comment": admin_comment_for(["bench/pods"]),
        }
    }


def submit_bridge_jobs(bed: SlurmTestBed, n: int, partition: str, concurrency: int = 8) -> list[int]:
    """`n` jobs as the bridge submits them, in order: those that fit run, the others wait."""
    body = _bridge_job(partition, hold=False)
    headers = {"X-SLURM-USER-NAME": bed.user_name, "X-SLURM-USER-TOKEN": bed.token()}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    with (
        httpx.Client(
            base_url=f"{bed.rest_url}/slurm/v0.0.44", headers=headers, limits=limits, timeout=60
        ) as client,
        ThreadPoolExecutor(concurrency) as pool,
    ):

        def submit(_: int) -> int:
            response = client.post("/job/submit", json=body)
            if response.status_code != 200:
                raise SlurmBedError(f"submitting a job: HTTP {response.status_code} {response.text[:300]}")
            return int(response.json()["job_id"])

        return sorted(pool.map(submit, range(n)))  # by id: the order Slurm starts them in


def wait_for_running(bed: SlurmTestBed, job_ids: Sequence[int], running: int) -> None:
    """Until Slurm runs `running` of the jobs (it starts a long queue over several passes)."""
    counted = [0]

    def enough() -> bool:
        counted[0] = sum(1 for state in bed.job_states(job_ids).values() if "RUNNING" in state)
        return counted[0] >= running

    wait_until(enough, lambda: f"Slurm running {running:,} of the jobs (runs {counted[0]:,})", 900, 5)


async def amain(options: argparse.Namespace) -> list[Level]:
    bed = await asyncio.to_thread(connect_slurm)
    counts = sorted({int(count) for count in options.live.split(",")})
    running = min(options.running, counts[-1])
    nodes = -(-running // CPUS_PER_NODE)
    foreign: list[int] = []
    partitions: list[TestPartition] = []
    try:
        say(f"a partition of {nodes} nodes x {CPUS_PER_NODE} CPUs, and one for the probes")
        memory = CPUS_PER_NODE * JOB_MEMORY_MB
        partitions.append(await asyncio.to_thread(bed.make_partition, nodes, CPUS_PER_NODE, memory))
        spare = await asyncio.to_thread(bed.make_partition, 1, options.probes, options.probes * JOB_MEMORY_MB)
        partitions.append(spare)
        if options.foreign:
            say(f"submitting {options.foreign:,} held foreign jobs")
            foreign = await asyncio.to_thread(bed.submit_foreign_jobs, options.foreign, name=FOREIGN_JOB_NAME)
        say(f"submitting {counts[-1]:,} jobs as the bridge submits them ({running:,} fit)")
        live = await asyncio.to_thread(submit_bridge_jobs, bed, counts[-1], partitions[0].name)
        await asyncio.to_thread(wait_for_running, bed, live, running)
        cpu = SlurmCpu(bed)
        say(f"Slurm's idle cost over {options.seconds:g} s")
        idle = await idle_cost(cpu, options.seconds)
        probes = Probes(bed, spare, options.probes)
        levels = []
        for count in counts:
            say(f"following {count:,} jobs")
            levels.append(
                await measure(
                    bed, live[:count], options.seconds, options.interval, idle, probes, options.turnover
                )
            )
        return levels
    finally:
        say("cancelling the jobs submitted")
        await asyncio.to_thread(bed.cancel_jobs, name=BRIDGE_JOB_NAME)
        if foreign:
            await asyncio.to_thread(bed.cancel_foreign_jobs, name=FOREIGN_JOB_NAME)
        for partition in partitions:  # its jobs were cancelled above, in bulk
            await asyncio.to_thread(remove_partition, bed, partition, (), 0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.watcher", description=__doc__.split("\n\n")[0])
    parser.add_argument("--live", default="100,1000,10000", help="followed jobs, comma-separated")
    parser.add_argument("--running", type=int, default=5_000, help="of the bridge's jobs, those that run")
    parser.add_argument("--foreign", type=int, default=20_000, help="held jobs of another user in Slurm")
    parser.add_argument("--probes", type=int, default=20, help="probe jobs a level, one a second")
    parser.add_argument(
        "--turnover", type=int, default=20, help="running jobs cancelled a level, one a second"
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="measured steady state per count")
    parser.add_argument("--interval", type=float, default=0.25, help="the watcher's JOB_WATCH_INTERVAL")
    parser.add_argument("--json", help="also write the figures here")
    options = parser.parse_args(argv)
    levels = asyncio.run(amain(options))
    print_levels(levels, options.foreign)
    if options.json:
        with open(options.json, "w") as out:
            figures = {"foreign": options.foreign, "levels": [asdict(level) for level in levels]}
            json.dump(figures, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
