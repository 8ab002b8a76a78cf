"""Placement benchmark: the whole bridge on real Temporal and real Slurm, figures printed.

    .venv/bin/python -m bench.placement [--scenario batch|pending] [--pods N] [--foreign-jobs F] ...

Assembles what the end-to-end tests assemble (tests/e2e/harness.py): a real
Temporal dev server with the bridge's search attributes, real Slurm partitions
of the run's own (`SlurmTestBed.make_partition`, removed at the end), the fake
Kubernetes API in its own process with nodes named like the Slurm nodes, and
one in-process `Bridge` (worker and its watchers; node sync's Schedule is not
created) with the production defaults. The benchmark plays the kubelet.

Scenario `batch` (default), all in one batch on one server:

1. warm-up: a few placements, start to finish, not counted;
2. burst: N pods created, at most C at a time waiting to be bound (closed
   loop): throughput, and what each placement costs;
3. hold: all N pods bound and running for --hold seconds: memory with N
   placements in flight, and what waiting costs (with --recheck S the
   placements are told to re-check Slurm every S s, doubling, to measure it);
4. finish: pods turn Succeeded, paced at the measured placement rate;
5. paced: P more pods created at a fixed rate (open loop, 40 % of the burst
   rate): latency below saturation;
6. reference: N trivial workflows (3 no-op activities + 1 signal) at the same
   concurrency, for the ratio that survives a noisy machine.

Scenario `pending`: N pods wait in Slurm for capacity (a partition of one
1-CPU node, held by one running pod): memory and the watcher's cost with N
placements in flight; then probe pods that Slurm can start at once (a
partition of their own) show whether the waiting ones starve them.

--foreign-jobs F fills Slurm with F held jobs of another user before the run
and removes them after, for either scenario.

Costs are counted, not estimated: history events and billable actions from
each workflow's history, next to the dev server's `action` counter; Slurm
requests by a counting httpx transport (a listing of every job, `GET /jobs/`,
counted on its own); the bridge's Kubernetes requests by its client; CPU from
/proc; RUNNING from slurmctld's log (milliseconds). Timings are printed, never
asserted. The run is bounded (--timeout), stops when another test restarts
slurmctld under it, and always removes its partitions and foreign jobs.
"""

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from bench.kube import CountingKube, KubeDriver, KubeProcess, PodObserver, PodTimes, pod_manifest
from bench.probes import (
    STEP_ROWS,
    CountingTransport,
    CpuSample,
    HistoryCost,
    RequestStats,
    Samples,
    child_pid,
    free_port,
    memory_kb,
    metric_by,
    percentile,
    pids_by_comm,
    recheck_times,
    scrape,
    split_history,
    step_durations,
)
from bench.reference import ReferenceRun, run_reference
from bench.slurm import LISTING, ActivitySlurm, SchedulerPass, WatcherSlurm, running_times, start_passes
from bridge import keys
from bridge import search_attributes as sa
from bridge.models import PodRef
from clients.kube_client import load_configuration
from tests.slurm_bed import ENDED_STATES as ENDED
from tests.slurm_bed import SLURM_SID, SlurmBedError, SlurmTestBed, TestPartition, wait_until
from worker.main import Bridge
from worker.pod_watcher import workflow_id
from worker.settings import WorkerSettings, load_settings
from workflows.placement import DEFAULT_RECHECK, MAX_RECHECK, WORKFLOW_TYPE, PlacementWorkflow

log = logging.getLogger("bench")
TEMPORAL_CLI = Path(sys.executable).with_name("temporal")
# The dev server's counters reach /metrics up to about a second late.
METRICS_FLUSH = 2.0
SLURM_SID_DIR = Path(os.environ.get("SLURM_SID_DIR", "/var/cache/slurm-bridge/slurm-sid"))
DEFAULT_WATCH_INTERVAL: float = WorkerSettings.model_fields["job_watch_interval"].default
# The per-placement budget (docs/performance.md): one pod, start to finish, no pending reason.
BUDGET_ACTIONS = 8
BUDGET_EVENTS = 40
DAY = 86_400.0


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def connect_slurm() -> SlurmTestBed:
    """The running Slurm bed, never restarted: `up` only when it is not running at all.

    (`slurm-sid.sh up` restarts slurmctld when slurm.conf changed; the bed is
    shared with other test runs, so a running one is used as it is.)
    """
    env_file = SLURM_SID_DIR / "env"
    status = subprocess.run([str(SLURM_SID), "status"], capture_output=True, timeout=60, check=False)
    if status.returncode != 0 or not env_file.exists():
        log.info("Slurm is not running; starting it with %s up", SLURM_SID)
        return SlurmTestBed.up()
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    return SlurmTestBed(env["SLURM_REST_URL"], env["SLURM_USER_NAME"], Path(env["SLURM_JWT_FILE"]))


@dataclass
class Options:
    scenario: str
    pods: int
    nodes: int
    cpus: int
    memory_mb: int
    concurrency: int
    watch_interval: float
    warmup: int
    reference: int
    finish_rate: float | None
    hold: float
    recheck: float
    paced: int
    paced_load: float
    probes: int
    foreign_jobs: int
    max_cached_workflows: int | None
    timeout: float
    json_path: str | None


@dataclass
class Phase:
    """One measured stretch of the run: its pods, wall clock and CPU."""

    pods: list[PodTimes] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0
    cpu: dict[str, float | None] = field(default_factory=dict)

    @property
    def rate(self) -> float | None:
        return placement_rate(self.pods)


@dataclass
class Results:
    options: Options
    started: str = ""
    environment: dict[str, str] = field(default_factory=dict)
    slurm_jobs_at_start: int | None = None
    foreign_submitted: int = 0
    burst: Phase = field(default_factory=Phase)
    whole: Phase = field(default_factory=Phase)  # burst + hold + finish
    paced: Phase = field(default_factory=Phase)
    paced_rate: float = 0.0
    idle: Phase = field(default_factory=Phase)  # bridge running, no placement: the background
    hold: Phase = field(default_factory=Phase)
    reference: ReferenceRun | None = None
    # The same reference run before the burst too: the machine's speed drifts within a run
    # (a 2 vCPU VM's reference rate moved 44-60/s between runs, its CPU per workflow with it),
    # and the ratio is taken against the mean of both sides of the placements.
    reference_before: ReferenceRun | None = None

    @property
    def reference_rate(self) -> float | None:
        rates = [run.rate for run in (self.reference_before, self.reference) if run is not None and run.rate]
        return sum(rates) / len(rates) if rates else None

    @property
    def ratio(self) -> float | None:
        reference = self.reference_rate
        return (self.burst.rate or 0.0) / reference if reference else None

    reference_cpu: dict[str, float | None] = field(default_factory=dict)
    costs: list[HistoryCost] = field(default_factory=list)  # per placement, hold window left out
    paced_costs: list[HistoryCost] = field(default_factory=list)
    waiting_costs: list[HistoryCost] = field(default_factory=list)  # per placement, hold window only
    reference_costs: list[HistoryCost] = field(default_factory=list)
    # phase → each placement's step durations from its history (bench/probes.py: STEP_ROWS)
    steps: dict[str, list[dict[str, float]]] = field(default_factory=lambda: {"burst": [], "paced": []})
    failures: list[str] = field(default_factory=list)
    rss_kb: dict[str, int | None] = field(default_factory=dict)
    in_flight: int | None = None
    cache_size: int | None = None  # the worker's max_cached_workflows
    rss_curve: list[tuple[int, int | None]] = field(default_factory=list)  # (submitted, worker RSS)
    paused: Phase = field(default_factory=Phase)  # the job watcher paused: the Slurm daemons without it
    slurm_activities: RequestStats = field(default_factory=RequestStats)
    slurm_watcher: RequestStats = field(default_factory=RequestStats)
    slurm_hold: RequestStats = field(default_factory=RequestStats)  # the watcher while holding
    watcher_passes_hold: int = 0
    kube_requests: Counter[str] = field(default_factory=Counter)
    kube_seconds: dict[str, float] = field(default_factory=dict)  # by operation, summed
    server_actions: dict[str, float] = field(default_factory=dict)
    server_requests: dict[str, float] = field(default_factory=dict)
    server_not_found: dict[str, float] = field(default_factory=dict)
    server_actions_reference: dict[str, float] = field(default_factory=dict)
    hold_actions: dict[str, float] = field(default_factory=dict)
    latencies: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # phase → figure → s
    running_from_log: dict[str, tuple[int, int]] = field(default_factory=dict)  # phase → (found, jobs)
    passes: dict[str, list[SchedulerPass]] = field(default_factory=dict)  # phase → slurmctld's passes
    # phase → jobs first seen RUNNING by the watcher
    via_watcher: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, Counter[str]] = field(default_factory=dict)  # phase → pending reasons read, by job
    probes: list[dict[str, float | None]] = field(default_factory=list)  # pending scenario
    pending_reasons: Counter[str] = field(default_factory=Counter)
    observer: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class Bench:
    def __init__(
        self, options: Options, bed: SlurmTestBed, partition: TestPartition, spare: TestPartition | None
    ):
        self.o = options
        self.bed = bed
        self.partition = partition  # the bridge's partition
        self.spare = spare  # pending scenario: the probes' own partition
        self.namespace = partition.name
        self.pods: dict[str, PodTimes] = {}
        self.bound_events: dict[str, asyncio.Event] = {}
        self.labelled_events: dict[str, asyncio.Event] = {}
        self.running_events: dict[str, asyncio.Event] = {}
        self.results = Results(options)
        self.placing = False  # placements in flight: a slurmctld restart now ruins the run
        self.slurm_restarted = False
        self.run_after: dict[str, float] = {}  # pod → seconds after bound to turn Succeeded
        self.started = False  # the Slurm clients exist

    # -- the kubelet's and the user's part ---------------------------------

    def _notify(self, name: str, what: str) -> None:  # on the observer's thread
        self.loop.call_soon_threadsafe(self._seen, name, what)

    def _seen(self, name: str, what: str) -> None:
        events = {"labelled": self.labelled_events, "running": self.running_events}.get(
            what, self.bound_events
        )
        event = events.get(name)
        if event is not None:
            event.set()
        if what != "bound":
            return
        after = self.run_after.pop(name, None)
        if after is not None:
            asyncio.get_running_loop().call_later(after, self._succeed_soon, name)

    def _succeed_soon(self, name: str) -> None:
        task = asyncio.ensure_future(self.succeed(self.pods[name]))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def create(self, name: str, annotations: dict[str, str] | None = None) -> PodTimes:
        times = self.pods[name] = PodTimes(name)
        self.bound_events[name] = asyncio.Event()
        self.labelled_events[name] = asyncio.Event()
        self.running_events[name] = asyncio.Event()
        manifest = pod_manifest(self.namespace, name, annotations=annotations)
        times.created = time.time()
        pod = await asyncio.to_thread(self.kube.create_pod, manifest)
        times.uid = pod["metadata"]["uid"]
        return times

    async def succeed(self, times: PodTimes) -> None:
        if times.bound is not None:  # after the kubelet's "Running", never before it
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.running_events[times.name].wait(), 30)
        await asyncio.to_thread(self.kube.set_phase, self.namespace, times.name, "Succeeded")
        times.succeeded = time.time()

    async def place(self, prefix: str, count: int, concurrency: int, **kw: Any) -> list[PodTimes]:
        """Create `count` pods, at most `concurrency` waiting to be bound at any time (closed loop)."""
        slots = asyncio.Semaphore(concurrency)
        placed: list[PodTimes] = []

        async def one(index: int) -> None:
            async with slots:
                name = f"{prefix}-{index:05d}"
                times = await self.create(name, **kw)
                placed.append(times)
                await self.until_bound(times)

        await asyncio.gather(*(one(i) for i in range(count)))
        return placed

    async def until_bound(self, times: PodTimes) -> None:
        """Until the pod is bound, or its placement ended without binding it (then noted as failed)."""
        bound = self.bound_events[times.name]
        while not bound.is_set():
            try:
                await asyncio.wait_for(bound.wait(), 5.0)
            except TimeoutError:
                closed = await self.closed(times)
                if closed is not None and not bound.is_set():
                    times.failure = f"placement ended unbound: {closed}"
                    self.results.failures.append(f"{times.name}: {times.failure}")
                    return

    async def closed(self, times: PodTimes) -> str | None:
        """How the placement ended; None while it runs or is not started yet."""
        try:
            described = await self.temporal.get_workflow_handle(self.workflow_id(times)).describe()
        except RPCError as error:
            if error.status != RPCStatusCode.NOT_FOUND:
                raise
            return None
        status = described.status
        if status is None or status == WorkflowExecutionStatus.RUNNING:
            return None
        return status.name

    async def paced(self, prefix: str, count: int, rate: float, run_for: float) -> list[PodTimes]:
        """Create `count` pods at `rate` per second whatever happens (open loop); each runs `run_for` s."""
        start = time.monotonic()
        tasks = []
        for index in range(count):
            delay = start + index / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            name = f"{prefix}-{index:05d}"
            self.run_after[name] = run_for
            tasks.append(asyncio.create_task(self.create(name)))
        placed = list(await asyncio.gather(*tasks))
        await asyncio.gather(*(self.until_bound(t) for t in placed))
        return placed

    async def finish(self, placed: Sequence[PodTimes], rate: float) -> None:
        """The pods' containers exit 0, in the order they were bound, `rate` per second (open loop)."""
        start = time.monotonic()
        tasks = []
        for index, times in enumerate(sorted(placed, key=lambda t: t.bound or 0.0)):
            delay = start + index / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self.succeed(times)))
        await asyncio.gather(*tasks)

    def workflow_id(self, times: PodTimes) -> str:
        return workflow_id(
            PodRef(namespace=self.namespace, name=times.name, uid=times.uid), self.installation
        )

    async def wait_closed(self, placed: Sequence[PodTimes]) -> None:
        slots = asyncio.Semaphore(50)

        async def one(times: PodTimes) -> None:
            async with slots:
                try:
                    await self.temporal.get_workflow_handle(self.workflow_id(times)).result()
                except WorkflowFailureError as error:
                    times.failure = str(error.cause or error)
                    self.results.failures.append(f"{times.name}: {times.failure}")

        await asyncio.gather(*(one(t) for t in placed))

    async def histories(
        self,
        workflow_ids: Sequence[str],
        window: tuple[float, float],
        steps: list[dict[str, float]] | None = None,
    ) -> list[tuple[HistoryCost, HistoryCost]]:
        """Each history's cost outside and inside `window`; with `steps`, also its step durations."""
        slots = asyncio.Semaphore(20)

        async def one(wid: str) -> tuple[HistoryCost, HistoryCost]:
            async with slots:
                history = await self.temporal.get_workflow_handle(wid).fetch_history()
                if steps is not None:
                    steps.append(step_durations(history.events))
                return split_history(history.events, *window)

        return list(await asyncio.gather(*(one(w) for w in workflow_ids)))

    def progress(self) -> str:
        """How far the placements got (for a run that could not finish)."""
        pods = [t for t in self.pods.values() if not t.name.startswith("warm-")]
        counts = {
            "created": sum(1 for t in pods if t.created),
            "submitted (labelled)": sum(1 for t in pods if t.labelled),
            "bound": sum(1 for t in pods if t.bound),
            "succeeded": sum(1 for t in pods if t.succeeded),
            "released": sum(1 for t in pods if t.released),
        }
        return ", ".join(f"{value} {key}" for key, value in counts.items())

    def cpu(self) -> CpuSample:
        return CpuSample.take(self.server_pid, self.kube_process.pid, self.slurmctld_pid, self.slurmrestd_pid)

    def metrics(self) -> Samples:
        return scrape(self.metrics_url)

    # -- the stack ----------------------------------------------------------

    async def run(self) -> Results:
        o, r = self.o, self.results
        self.loop = asyncio.get_running_loop()
        self._background: set[asyncio.Future[Any]] = set()
        r.started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        r.environment = environment(self.bed)
        metrics_port = free_port()
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        async with contextlib.AsyncExitStack() as stack:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
            kubeconfig = tmp / "kubeconfig"
            self.kube_process = KubeProcess(kubeconfig, tmp / "kube_fake.log")
            await asyncio.to_thread(self.kube_process.start)
            stack.callback(self.kube_process.stop)
            self.kube = KubeDriver(self.kube_process.url)
            nodes = [(n, self.partition.cpus, self.partition.memory_mb) for n in self.partition.node_names]
            if self.spare is not None:
                nodes += [(n, self.spare.cpus, self.spare.memory_mb) for n in self.spare.node_names]
            for name, cpus, memory in nodes:
                await asyncio.to_thread(self.kube.create_node, name, cpus, memory)
            env = await WorkflowEnvironment.start_local(
                dev_server_existing_path=str(TEMPORAL_CLI),
                data_converter=pydantic_data_converter,
                search_attributes=sa.ALL,
                dev_server_log_level="error",
                dev_server_extra_args=["--metrics-port", str(metrics_port)],
            )
            await stack.enter_async_context(env)
            self.temporal: Client = env.client
            self.server_pid = child_pid("temporal")
            chroot = self.bed.jwt_file.parent / "root"
            self.slurmctld_pid = next(iter(pids_by_comm("slurmctld", chroot)), None)
            self.slurmrestd_pid = next(iter(pids_by_comm("slurmrestd", chroot)), None)

            run_id = uuid.uuid4().hex[:8]
            self.task_queue = f"bench-{run_id}"
            # An installation of its own: other sessions' bridges (and sweeps) on this shared Slurm
            # act only on their installation's jobs, so they never touch the run's jobs.
            self.installation = f"bench-{run_id}"
            settings = load_settings(
                temporal_task_queue=self.task_queue,
                slurm_rest_url=self.bed.rest_url,
                slurm_user_name=self.bed.user_name,
                slurm_jwt_file=self.bed.jwt_file,
                kubeconfig=str(kubeconfig),
                partition=self.partition.name,
                job_watch_interval=o.watch_interval,
                installation_id=self.installation,
                metrics_port=0,
                **(
                    {"temporal_max_cached_workflows": o.max_cached_workflows}
                    if o.max_cached_workflows is not None
                    else {}
                ),
            )
            r.cache_size = settings.temporal_max_cached_workflows
            slurm_kwargs: dict[str, Any] = {"user_name": self.bed.user_name, "token_file": self.bed.jwt_file}
            self.activity_slurm = ActivitySlurm(
                self.bed.rest_url, counter=CountingTransport(), **slurm_kwargs
            )
            self.watcher_slurm = WatcherSlurm(self.bed.rest_url, counter=CountingTransport(), **slurm_kwargs)
            self.started = True
            stack.push_async_callback(self.activity_slurm.close)
            stack.push_async_callback(self.watcher_slurm.close)
            self.kube_client = CountingKube(await load_configuration(str(kubeconfig)))
            stack.push_async_callback(self.kube_client.close)
            bridge = Bridge(self.temporal, self.kube_client, self.activity_slurm, settings)
            bridge.job_watcher.slurm = self.watcher_slurm  # its own connection and counters
            observer = PodObserver(self.kube, self.namespace, self.pods, self._notify)
            observer.start()
            stack.callback(observer.stop)
            bridge_task = asyncio.create_task(bridge.run(), name="bridge")

            async def stop_bridge() -> None:
                bridge_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await bridge_task
                for task in list(self._background):
                    task.cancel()

            stack.push_async_callback(stop_bridge)
            await asyncio.wait_for(bridge.pod_watcher.synced.wait(), 30)
            r.slurm_jobs_at_start = await asyncio.to_thread(count_slurm_jobs, self.bed)

            if o.scenario == "pending":
                await self.run_pending()
            else:
                await self.run_batch()
            r.observer = {"lost": observer.lost, **observer.errors}
        return r

    async def warm_up(self, **kw: Any) -> None:
        o = self.o
        say(f"warm-up: {o.warmup} placements")
        self.placing = True
        if kw:  # one at a time, each finished before the next (the probes' partition has one CPU)
            for index in range(o.warmup):
                warm = await self.place(f"warm-{index}", 1, 1, **kw)
                await self.finish(warm, rate=100)
                await self.wait_closed(warm)
        else:
            warm = await self.place("warm", o.warmup, o.warmup)
            await self.finish(warm, rate=100)
            await self.wait_closed(warm)
        self.results.failures.clear()
        await asyncio.sleep(max(2.0, 2 * o.watch_interval))

    async def idle(self, seconds: float) -> None:
        """The bridge up, nothing to place: what slurmrestd and slurmctld spend without us (others' load)."""
        r = self.results
        r.idle.start = time.time()
        before = self.cpu()
        await asyncio.sleep(seconds)
        r.idle.cpu = self.cpu().since(before)
        r.idle.end = time.time()

    def reset_counters(self) -> None:
        self.kube_client.requests.clear()
        self.activity_slurm.counter.stats.reset()
        self.watcher_slurm.counter.stats.reset()
        self.watcher_slurm.passes.clear()

    # -- scenario: batch ------------------------------------------------------

    async def run_batch(self) -> None:
        o, r = self.o, self.results
        await self.warm_up()
        if o.reference:
            say(f"reference before the burst: {o.reference} workflows")
            r.reference_before = await run_reference(
                self.temporal, f"{self.task_queue}-reference-before", o.reference, o.concurrency
            )
        await self.idle(5.0)

        say(f"burst: {o.pods} pods, at most {o.concurrency} waiting to be bound")
        pid = os.getpid()
        gc.collect()
        r.rss_kb["worker_baseline"] = memory_kb(pid)
        r.rss_kb["server_baseline"] = memory_kb(self.server_pid)
        self.reset_counters()
        metrics_before = self.metrics()
        cpu_start = self.cpu()
        r.burst.start = r.whole.start = time.time()
        placed = await self.place("pod", o.pods, o.concurrency)
        r.burst.end = time.time()
        r.burst.pods = r.whole.pods = placed
        r.burst.cpu = self.cpu().since(cpu_start)

        # hold: every placement waits for its pods to end. What does waiting cost?
        await asyncio.sleep(max(METRICS_FLUSH, 4 * o.watch_interval))  # the last binds settle
        say(f"hold: {o.pods} placements in flight for {o.hold:g} s")
        metrics_hold = self.metrics()
        hold_stats = self.watcher_slurm.counter.stats.snapshot()
        passes_hold = len(self.watcher_slurm.passes)
        cpu_hold = self.cpu()
        r.hold.start = time.time()
        if o.recheck:
            say(f"telling {len(placed)} placements to re-check Slurm every {o.recheck:g} s (doubling)")
            await self.signal_all(placed, o.recheck)
        await asyncio.sleep(max(r.hold.start + o.hold - time.time(), 0.0))
        r.hold.end = time.time()
        r.hold.cpu = self.cpu().since(cpu_hold)
        r.hold_actions = metric_delta(self.metrics(), metrics_hold, "action", "action_type")
        r.slurm_hold = stats_delta(self.watcher_slurm.counter.stats, hold_stats)
        r.watcher_passes_hold = len(self.watcher_slurm.passes) - passes_hold
        gc.collect()
        r.rss_kb["worker_in_flight"] = memory_kb(pid)
        r.rss_kb["server_in_flight"] = memory_kb(self.server_pid)
        await self.pause_watcher(min(o.hold, 15.0))
        r.in_flight = await self.count_open()

        rate = o.finish_rate or r.burst.rate or 1.0
        say(f"finish: pods Succeeded at {rate:.1f}/s")
        await self.finish(placed, rate)
        await self.wait_closed(placed)
        r.whole.end = time.time()
        r.whole.cpu = self.cpu().since(cpu_start)
        await asyncio.sleep(METRICS_FLUSH)
        metrics_after = self.metrics()
        gc.collect()
        r.rss_kb["worker_after"] = memory_kb(pid)
        r.rss_kb["worker_peak"] = memory_kb(pid, "VmHWM")
        r.rss_kb["server_after"] = memory_kb(self.server_pid)
        r.slurm_activities = self.activity_slurm.counter.stats.snapshot()
        r.slurm_watcher = self.watcher_slurm.counter.stats.snapshot()
        r.kube_requests = Counter(self.kube_client.requests)
        r.kube_seconds = dict(self.kube_client.seconds)
        r.server_actions = metric_delta(metrics_after, metrics_before, "action", "action_type")
        r.server_requests = metric_delta(
            metrics_after, metrics_before, "service_requests", "operation", service_name="frontend"
        )
        r.server_not_found = metric_delta(
            metrics_after,
            metrics_before,
            "service_error_with_type",
            "operation",
            service_name="frontend",
            error_type="serviceerror_NotFound",
        )

        if o.paced:
            r.paced_rate = max(o.paced_load * (r.burst.rate or 1.0), 0.2)
            say(f"paced: {o.paced} pods at {r.paced_rate:.2f}/s (open loop), each running 2 s")
            cpu_paced = self.cpu()
            r.paced.start = time.time()
            r.paced.pods = await self.paced("paced", o.paced, r.paced_rate, run_for=2.0)
            await self.wait_closed(r.paced.pods)
            r.paced.end = time.time()
            r.paced.cpu = self.cpu().since(cpu_paced)
        self.placing = False

        if o.reference:
            say(f"reference: {o.reference} workflows (3 no-op activities + 1 signal)")
            cpu_ref = self.cpu()
            metrics_ref = self.metrics()
            r.reference = await run_reference(
                self.temporal, f"{self.task_queue}-reference", o.reference, o.concurrency
            )
            r.reference_cpu = self.cpu().since(cpu_ref)
            await asyncio.sleep(METRICS_FLUSH)
            r.server_actions_reference = metric_delta(self.metrics(), metrics_ref, "action", "action_type")
            costs = await self.histories(r.reference.workflow_ids, (0.0, 0.0))
            r.reference_costs = [whole for whole, _ in costs]

        say("reading histories and slurmctld's log")
        costs = await self.histories(
            [self.workflow_id(t) for t in placed], (r.hold.start, r.hold.end), r.steps["burst"]
        )
        r.costs = [own for own, _ in costs]
        r.waiting_costs = [waiting for _, waiting in costs]
        self.latencies("burst", placed)
        if r.paced.pods:
            costs = await self.histories(
                [self.workflow_id(t) for t in r.paced.pods], (0.0, 0.0), r.steps["paced"]
            )
            r.paced_costs = [own for own, _ in costs]
            self.latencies("paced", r.paced.pods)

    async def pause_watcher(self, seconds: float) -> None:
        """A control window: the job watcher held back, so the Slurm daemons' CPU is everyone else's."""
        r = self.results
        self.watcher_slurm.running.clear()
        try:
            await asyncio.sleep(self.o.watch_interval * 2)  # a pass in flight finishes
            before = self.cpu()
            r.paused.start = time.time()
            await asyncio.sleep(seconds)
            r.paused.end = time.time()
            r.paused.cpu = self.cpu().since(before)
        finally:
            self.watcher_slurm.running.set()

    async def signal_all(self, placed: Sequence[PodTimes], seconds: float) -> None:
        slots = asyncio.Semaphore(50)

        async def one(times: PodTimes) -> None:
            async with slots:
                handle = self.temporal.get_workflow_handle(self.workflow_id(times))
                await handle.signal(PlacementWorkflow.set_recheck_interval, seconds)

        await asyncio.gather(*(one(t) for t in placed))

    async def count_open(self) -> int | None:
        with contextlib.suppress(Exception):
            counted = await self.temporal.count_workflows(
                f"TaskQueue = '{self.task_queue}' AND ExecutionStatus = 'Running' "
                f"AND WorkflowType = '{WORKFLOW_TYPE}'"
            )
            return counted.count
        return None

    # -- scenario: pending (memory in flight, starvation) ---------------------

    async def run_pending(self) -> None:
        o, r = self.o, self.results
        assert self.spare is not None
        spare = {keys.SLURMJOB_PREFIX + "partition": self.spare.name}
        await self.warm_up(annotations=spare)
        await self.idle(5.0)

        pid = os.getpid()
        gc.collect()
        r.rss_kb["worker_baseline"] = memory_kb(pid)
        r.rss_kb["server_baseline"] = memory_kb(self.server_pid)
        self.reset_counters()
        metrics_before = self.metrics()
        cpu_start = self.cpu()
        r.burst.start = r.whole.start = time.time()
        say("filling the bridge's partition: 1 pod that runs")
        r.burst.pods = await self.place("fill", 1, 1)
        say(f"pending: {o.pods} pods Slurm cannot start (<= {o.concurrency} waiting to be submitted)")
        slots = asyncio.Semaphore(o.concurrency)

        async def one(index: int) -> None:
            async with slots:
                times = await self.create(f"pod-{index:05d}")
                r.whole.pods.append(times)
                await self.labelled_events[times.name].wait()  # submitted

        step = max(o.pods // 4, 1)
        for first in range(0, o.pods, step):
            await asyncio.gather(*(one(i) for i in range(first, min(first + step, o.pods))))
            gc.collect()
            r.rss_curve.append((len(r.whole.pods), memory_kb(pid)))
        r.burst.end = time.time()
        r.burst.cpu = self.cpu().since(cpu_start)
        took = r.burst.end - r.burst.start
        say(f"{o.pods} jobs submitted in {took:.0f} s; waiting for the placements to settle")
        await self.settle(timeout=120)
        r.in_flight = await self.count_open()

        say(f"hold: {r.in_flight} placements in flight for {o.hold:g} s")
        metrics_hold = self.metrics()
        hold_stats = self.watcher_slurm.counter.stats.snapshot()
        passes_hold = len(self.watcher_slurm.passes)
        cpu_hold = self.cpu()
        r.hold.start = time.time()
        await asyncio.sleep(o.hold)
        r.hold.end = time.time()
        r.hold.cpu = self.cpu().since(cpu_hold)
        r.hold_actions = metric_delta(self.metrics(), metrics_hold, "action", "action_type")
        r.slurm_hold = stats_delta(self.watcher_slurm.counter.stats, hold_stats)
        r.watcher_passes_hold = len(self.watcher_slurm.passes) - passes_hold
        gc.collect()
        r.rss_kb["worker_in_flight"] = memory_kb(pid)
        r.rss_kb["server_in_flight"] = memory_kb(self.server_pid)
        await self.pause_watcher(min(o.hold, 15.0))

        for index in range(o.probes):
            say(f"probe {index + 1} of {o.probes}: one pod Slurm can start at once")
            probe = await self.create(f"probe-{index:02d}", annotations=spare)
            try:
                await asyncio.wait_for(self.until_bound(probe), 60)
            except TimeoutError:
                r.notes.append(f"probe {probe.name} not bound within 60 s")
            r.paced.pods.append(probe)
            await self.succeed(probe)
            await self.wait_closed([probe])
            await asyncio.sleep(1.0)
        r.whole.end = time.time()
        r.whole.cpu = self.cpu().since(cpu_start)
        await asyncio.sleep(METRICS_FLUSH)
        r.server_actions = metric_delta(self.metrics(), metrics_before, "action", "action_type")
        r.slurm_activities = self.activity_slurm.counter.stats.snapshot()
        r.slurm_watcher = self.watcher_slurm.counter.stats.snapshot()
        r.kube_requests = Counter(self.kube_client.requests)
        r.kube_seconds = dict(self.kube_client.seconds)
        self.placing = False
        r.pending_reasons = await self.pending_reasons([t for t in r.whole.pods])
        starts = running_times(self.bed, [t.job_id for t in r.paced.pods if t.job_id])
        for probe in r.paced.pods:
            running = starts.get(probe.job_id or -1)
            r.probes.append(
                {
                    "created_to_bound": delta(probe.created, probe.bound),
                    "created_to_submitted": delta(
                        probe.created, self.activity_slurm.submitted.get(probe.job_id or -1)
                    ),
                    "running_to_bound": delta(running, probe.bound),
                    "submitted_to_running": delta(
                        self.activity_slurm.submitted.get(probe.job_id or -1), running
                    ),
                }
            )

    async def settle(self, timeout: float) -> None:
        """Until the dev server's action counter stands still for 3 s (the placements wait)."""
        deadline = time.monotonic() + timeout
        last = -1.0
        while time.monotonic() < deadline:
            now = sum(metric_by(self.metrics(), "action", "action_type").values())
            if now == last:
                return
            last = now
            await asyncio.sleep(3.0)
        self.results.notes.append(f"placements still busy {timeout:g} s after the last submission")

    async def pending_reasons(self, pods: Sequence[PodTimes]) -> Counter[str]:
        states = await asyncio.to_thread(self.bed.job_states, [t.job_id for t in pods if t.job_id])
        return Counter("+".join(state) for state in states.values())

    # -- figures --------------------------------------------------------------

    def latencies(self, phase: str, placed: Sequence[PodTimes]) -> None:
        r = self.results
        a, w = self.activity_slurm, self.watcher_slurm
        ids = [t.job_id for t in placed if t.job_id is not None]
        started = running_times(self.bed, ids)
        r.running_from_log[phase] = (len(started), len(ids))
        r.passes[phase] = start_passes(self.bed, ids)
        lat: dict[str, list[float]] = {key: [] for _, key in LATENCY_ROWS}
        via_watcher = 0

        def add(key: str, since: float | None, until: float | None) -> None:
            if since is not None and until is not None:
                lat[key].append(until - since)

        for t in placed:
            add("created_to_bound", t.created, t.bound)
            if t.job_id is None:
                continue
            submitted = a.submitted.get(t.job_id)
            running = started.get(t.job_id)
            seen_by = [x for x in (w.probed_running.get(t.job_id), a.read_running.get(t.job_id)) if x]
            seen = min(seen_by) if seen_by else None
            if seen is not None and seen == w.probed_running.get(t.job_id):
                via_watcher += 1
            add("created_to_submitted", t.created, submitted)
            add("submitted_to_running", submitted, running)
            add("running_to_bound", running, t.bound)
            add("running_to_seen", running, seen)
            add("seen_to_bound", seen, t.bound)
            add("succeeded_to_cancelled", t.succeeded, a.cancelled.get(t.job_id))
            add("succeeded_to_released", t.succeeded, t.released)
        r.latencies[phase] = lat
        r.via_watcher[phase] = via_watcher
        reasons: Counter[str] = Counter()
        for job_id in ids:
            read = {*a.reasons.get(job_id, []), *w.reasons.get(job_id, [])} - {"", "None"}
            reasons.update(read or {"none"})
        r.reasons[phase] = reasons


def delta(since: float | None, until: float | None) -> float | None:
    return None if since is None or until is None else until - since


def count_slurm_jobs(bed: SlurmTestBed) -> int | None:
    """Every job slurmctld holds (any user, ended ones kept for MinJobAge), from the cheap state listing."""
    with contextlib.suppress(Exception):
        response = bed.rest("GET", "/jobs/state/")
        if response.status_code == 200:
            return len(response.json().get("jobs") or [])
    return None


def placement_rate(placed: Sequence[PodTimes]) -> float | None:
    created = [t.created for t in placed if t.created]
    bound = [t.bound for t in placed if t.bound]
    if not created or not bound or max(bound) <= min(created):
        return None
    return len(bound) / (max(bound) - min(created))


def metric_delta(after: Samples, before: Samples, name: str, label: str, **where: str) -> dict[str, float]:
    """How much a server counter grew, by one label."""
    now, then = metric_by(after, name, label, **where), metric_by(before, name, label, **where)
    return {key: value - then.get(key, 0.0) for key, value in now.items() if value - then.get(key, 0.0)}


def stats_delta(now: RequestStats, then: RequestStats) -> RequestStats:
    out = RequestStats()
    for op, count in now.count.items():
        if count - then.count.get(op, 0):
            out.count[op] = count - then.count.get(op, 0)
            out.bytes_in[op] = now.bytes_in.get(op, 0) - then.bytes_in.get(op, 0)
            out.seconds[op] = now.seconds.get(op, 0.0) - then.seconds.get(op, 0.0)
    return out


def environment(bed: SlurmTestBed) -> dict[str, str]:
    def run(*command: str) -> str:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return "?"
        return (done.stdout or done.stderr).strip().splitlines()[0] if (done.stdout or done.stderr) else "?"

    cpu_model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    try:
        slurm = bed.scontrol("--version").strip()
    except SlurmBedError:
        slurm = "?"
    mem_total = "?"
    with contextlib.suppress(OSError):
        mem_total = Path("/proc/meminfo").read_text().splitlines()[0].split(":", 1)[1].strip()
    commit = run("git", "-C", str(Path(__file__).resolve().parent.parent), "describe", "--always", "--dirty")
    return {
        "machine": f"{os.cpu_count()} vCPU ({cpu_model}), {mem_total} RAM, {platform.system()} "
        f"{platform.release()}",
        "load": "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg()),
        "python": platform.python_version(),
        "temporalio": metadata.version("temporalio"),
        "temporal": run(str(TEMPORAL_CLI), "--version"),
        "slurm": slurm,
        "bridge": commit,
    }


# -- the report -----------------------------------------------------------------

LATENCY_ROWS = (
    ("pod created -> bound", "created_to_bound"),
    ("pod created -> Slurm job submitted", "created_to_submitted"),
    ("Slurm job submitted -> RUNNING (Slurm)", "submitted_to_running"),
    ("Slurm RUNNING -> pod bound", "running_to_bound"),
    ("  RUNNING -> first read by the bridge", "running_to_seen"),
    ("  first read -> bound", "seen_to_bound"),
    ("pod Succeeded -> Slurm job cancelled", "succeeded_to_cancelled"),
    ("pod Succeeded -> finalizer removed", "succeeded_to_released"),
)
CPU_ROWS = (
    ("this process (the bridge)", "process"),
    ("  asyncio thread (bridge)", "main_thread"),
    ("  Temporal SDK core threads", "sdk_core"),
    ("  other threads (bench driver)", "other_threads"),
    ("Temporal dev server", "server"),
    ("fake Kubernetes API (own process)", "kube"),
    ("slurmctld (shared with others)", "slurmctld"),
    ("slurmrestd (shared with others)", "slurmrestd"),
)


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.0f}"


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def kib(value: int | None) -> str:
    return "?" if value is None else f"{value / 1024:.0f} MiB"


def recheck_day(per_recheck_actions: float = 2.0, per_recheck_events: float = 11.0) -> dict[str, float]:
    """Safety re-checks of a bound pod in its first day and in each later day, and what they cost."""
    first = recheck_times(DEFAULT_RECHECK.total_seconds(), MAX_RECHECK.total_seconds(), DAY)
    later = DAY / MAX_RECHECK.total_seconds()
    return {
        "rechecks_first_day": float(len(first)),
        "rechecks_later_day": later,
        "actions_first_day": len(first) * per_recheck_actions + 1,  # + the timer left running at midnight
        "actions_later_day": later * per_recheck_actions,
        "events_first_day": len(first) * per_recheck_events,
        "events_later_day": later * per_recheck_events,
    }


def report(r: Results) -> str:
    o = r.options
    lines: list[str] = []
    add = lines.append
    add(f"slurm-bridge placement benchmark ({o.scenario}), {r.started}")
    for key, value in r.environment.items():
        add(f"  {key:<11} {value}")
    if o.scenario == "pending":
        setup = (
            f"{o.pods} 1-CPU pods pending on a partition of one 1-CPU node (held by 1 running pod); "
            f"{o.probes} probe pods in a partition of their own"
        )
    else:
        setup = (
            f"{o.pods} pods x 1 CPU (exclusive=false), {o.nodes} nodes x {o.cpus} CPUs; "
            f"<= {o.concurrency} pods waiting to be bound"
        )
    add(f"  set-up      {setup}; job watch interval {o.watch_interval:g} s")
    add(
        f"              one worker (placement unsandboxed as in production, reference sandboxed; "
        f"SDK defaults, {r.cache_size} cached workflows); "
        "dev server with in-memory SQLite;"
    )
    add("              fake Kubernetes API in its own process")
    add(
        f"  Slurm       {r.slurm_jobs_at_start if r.slurm_jobs_at_start is not None else '?'} jobs in "
        f"slurmctld at the start, {o.foreign_jobs} of them the run's foreign jobs (another user's, held)"
    )
    if r.failures:
        add(f"  FAILED placements: {len(r.failures)}: {r.failures[:3]}")
    for note in r.notes:
        add(f"  note: {note}")
    add("")
    if o.scenario == "pending":
        report_pending(r, add)
    else:
        report_batch(r, add)
    return "\n".join(lines)


def latency_table(r: Results, add: Callable[[str], None], phase: str, title: str) -> None:
    add(f"{title:<44} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7} {'n':>5}")
    lat = r.latencies.get(phase, {})
    for label, key in LATENCY_ROWS:
        values = lat.get(key, [])
        cells = [percentile(values, 50), percentile(values, 90), percentile(values, 99)]
        cells.append(max(values) if values else None)
        add(f"  {label:<42} " + " ".join(f"{fmt_ms(v):>7}" for v in cells) + f" {len(values):>5}")
    found, jobs = r.running_from_log.get(phase, (0, 0))
    add(
        f"  (RUNNING: slurmctld's log, ms, for {found} of {jobs} jobs; first read RUNNING by the job "
        f"watcher's probe for {r.via_watcher.get(phase, 0)}, by an activity for the others)"
    )
    reasons = r.reasons.get(phase, Counter())
    add(
        "  (pending reasons the bridge read, jobs: "
        + ", ".join(f"{k} {v}" for k, v in reasons.most_common())
        + ")"
    )
    steps = r.steps.get(phase, [])
    if steps:
        add("  steps, from the histories (server's clock):")
        for label, key in STEP_ROWS:
            values = [step[key] for step in steps if key in step]
            cells = [percentile(values, 50), percentile(values, 90), percentile(values, 99)]
            cells.append(max(values) if values else None)
            add(f"    {label:<40} " + " ".join(f"{fmt_ms(v):>7}" for v in cells) + f" {len(values):>5}")


def pass_summary(passes: Sequence[SchedulerPass], concurrency: int) -> dict[str, Any] | None:
    """How often slurmctld's passes started the run's jobs, and the rate that allows a closed loop.

    A pod waiting to be bound is started by one pass, and its slot's next pod only after it is
    bound: at most one start per slot per pass. `None` for fewer than two passes (no interval).
    """
    if len(passes) < 2:
        return None
    per_second = (len(passes) - 1) / (passes[-1].at - passes[0].at)
    jobs = sum(p.jobs for p in passes)
    return {
        "passes": len(passes),
        "main": sum(p.scheduler == "main" for p in passes),
        "backfill": sum(p.scheduler == "backfill" for p in passes),
        "jobs_per_pass": jobs / len(passes),
        "per_second": per_second,
        "ceiling": concurrency * per_second,
        "fill": jobs / len(passes) / concurrency,
    }


def report_batch(r: Results, add: Callable[[str], None]) -> None:
    o = r.options
    n = len(r.burst.pods) or 1
    rate = r.burst.rate or 0.0
    add("Throughput")
    add(f"  {'placements/s (first pod created -> last pod bound)':<56} {rate:7.2f}")
    if r.reference:
        before = f"before {r.reference_before.rate:.2f}, " if r.reference_before else ""
        add(
            f"  {'reference workflows/s (3 no-op activities + 1 signal)':<56} {r.reference_rate or 0.0:7.2f}"
            f"  ({before}after {r.reference.rate:.2f})"
        )
        add(f"  {'ratio placement / reference (same server, same batch)':<56} {r.ratio or 0.0:7.2f}")
    if summary := pass_summary(r.passes.get("burst", []), o.concurrency):
        add(
            f"  slurmctld started the burst's jobs in {summary['passes']} scheduling passes "
            f"(main {summary['main']}, backfill {summary['backfill']}), "
            f"{summary['jobs_per_pass']:.1f} jobs per pass, {summary['per_second']:.2f} passes/s"
        )
        add(
            f"  closed loop: a pass starts at most the {o.concurrency} pods waiting, so at most "
            f"{summary['ceiling']:.1f} placements/s at these passes; they were {summary['fill']:.0%} full"
        )
    add("")
    latency_table(r, add, "burst", f"Latency at saturation (<= {o.concurrency} waiting), ms")
    if r.reference:
        values = r.reference.latencies
        cells = [percentile(values, 50), percentile(values, 90), percentile(values, 99), max(values or [0.0])]
        add(f"  {'reference: start -> completed':<42} " + " ".join(f"{fmt_ms(v):>7}" for v in cells))
    add("")
    if r.paced.pods:
        latency_table(r, add, "paced", f"Latency paced, {r.paced_rate:.2f} pods/s open loop, ms")
        add("")

    add(f"{'Temporal, per placement (its history)':<40} {'mean':>7} {'min':>7} {'max':>7}  {'reference':>9}")

    def cost_row(label: str, get: Callable[[HistoryCost], float], digits: int = 1) -> None:
        values = [get(c) for c in r.costs] or [0.0]
        refs = [get(c) for c in r.reference_costs]
        ref = f"{mean(refs):9.{digits}f}" if refs else f"{'-':>9}"
        add(f"  {label:<38} {mean(values):7.{digits}f} {min(values):7.0f} {max(values):7.0f}  {ref}")

    cost_row("history events", lambda c: c.events)
    cost_row("history bytes", lambda c: c.bytes, 0)
    cost_row("workflow tasks", lambda c: c.workflow_tasks)
    cost_row("billable actions", lambda c: c.billable_actions)
    for kind in ("start", "activity", "activity retry", "signal", "upsert", "timer"):
        cost_row(f"  {kind}", lambda c, k=kind: c.actions[k])  # type: ignore[misc]
    for name in sorted({name for c in r.costs for name in c.signals}):
        cost_row(f"    signal {name}", lambda c, s=name: c.signals[s])  # type: ignore[misc]
    activities: Counter[str] = Counter()
    for c in r.costs:
        activities.update(c.activities)
    add("  activities: " + ", ".join(f"{name} {count / n:.2f}" for name, count in activities.most_common()))
    for label, costs in (("burst", r.costs), ("paced", r.paced_costs)):
        budget_line(label, costs, add)
    if o.recheck:
        add("  (the hold window is left out: its re-checks are under Waiting)")
    if r.server_actions:
        by_kind = sorted(r.server_actions.items(), key=lambda kv: -kv[1])
        add(
            f"  dev server 'action' counter: {sum(r.server_actions.values()) / n:.2f} per placement, "
            "burst to finish ("
            + ", ".join(f"{k.removeprefix('command_').removeprefix('grpc_')} {v / n:.2f}" for k, v in by_kind)
            + ")"
        )
    signals = r.server_requests.get("SignalWorkflowExecution", 0.0)
    if signals:
        missed = r.server_not_found.get("SignalWorkflowExecution", 0.0)
        add(
            f"  SignalWorkflowExecution RPCs: {signals / n:.2f} per placement, "
            f"{missed / n:.2f} of them NotFound"
        )
    add("")

    window = r.whole.end - r.whole.start
    add(f"Slurm REST, per placement (burst + hold + finish = {window:.0f} s)")
    slurm_rows(r.slurm_activities, "activities", n, add)
    slurm_rows(r.slurm_watcher, "job watcher", n, add)
    listings = r.slurm_activities.count.get(LISTING, 0) + r.slurm_watcher.count.get(LISTING, 0)
    total = sum(r.slurm_activities.count.values()) + sum(r.slurm_watcher.count.values())
    kib_total = (sum(r.slurm_activities.bytes_in.values()) + sum(r.slurm_watcher.bytes_in.values())) / 1024
    add(f"  all         {total / n:.2f} requests, {kib_total / n:.1f} KiB received per placement")
    add(f"  listings of every job (GET /jobs/): {listings} in the whole run")
    restd = r.whole.cpu.get("slurmrestd")
    ctld = r.whole.cpu.get("slurmctld")
    add(
        f"  slurmrestd CPU {fmt_ms(restd / n if restd is not None else None)} ms, slurmctld CPU "
        f"{fmt_ms(ctld / n if ctld is not None else None)} ms per placement "
        "(shared daemons: others' load included)"
    )
    watcher_second(r, add)
    add("")

    kube_rows(r, n, add)
    cpu_rows(r, n, add)

    if r.hold.end:
        hold = r.hold.end - r.hold.start
        actions = sum(r.hold_actions.values())
        by_kind = sorted(r.hold_actions.items(), key=lambda kv: -kv[1])
        add(f"Waiting: {r.in_flight or n} placements in flight (pods running) for {hold:.0f} s")
        add(
            f"  dev server actions: {actions:.0f} = {actions / n / hold * 3600:.2f} per placement per hour"
            + (
                " (" + ", ".join(f"{k.split('_', 1)[-1]} {v:.0f}" for k, v in by_kind) + ")"
                if by_kind
                else ""
            )
        )
        wait_actions = mean([c.billable_actions for c in r.waiting_costs])
        wait_events = mean([c.events for c in r.waiting_costs])
        rechecks = mean([c.activities.get("check_job", 0) for c in r.waiting_costs])
        add(
            f"  from the histories: {wait_actions:.2f} actions, {wait_events:.1f} events, "
            f"{rechecks:.2f} re-checks (check_job) per placement in the window"
        )
        per_actions, per_events = recheck_cost(r)
        if o.recheck and rechecks:
            add(
                f"  re-check every {o.recheck:g} s, doubling (set_recheck_interval): "
                f"{per_actions:.2f} actions and {per_events:.1f} events per re-check "
                "(the signal and its timer restart taken out: 2 actions, 6 events)"
            )
        day = recheck_day(per_actions, per_events)
        add(
            f"  a bound pod's safety re-check ({DEFAULT_RECHECK.total_seconds() / 60:.0f} min doubling to "
            f"{MAX_RECHECK.total_seconds() / 3600:.0f} h): {day['rechecks_first_day']:.0f} re-checks and "
            f"{day['actions_first_day']:.0f} actions on its first day, {day['rechecks_later_day']:.0f} and "
            f"{day['actions_later_day']:.0f} on each later day"
        )
        add("")

    add("Memory (RSS)")
    base, held = r.rss_kb.get("worker_baseline"), r.rss_kb.get("worker_in_flight")
    add(
        f"  this process: {kib(base)} before, {kib(held)} with {r.in_flight or n} placements in flight, "
        f"{kib(r.rss_kb.get('worker_after'))} after (peak {kib(r.rss_kb.get('worker_peak'))})"
    )
    if base and held:
        add(
            f"    {(held - base) / n:.0f} KiB per in-flight placement = "
            f"{(held - base) / n * 1000 / 1024:.0f} MiB per 1,000"
        )
    server_base, server_held = r.rss_kb.get("server_baseline"), r.rss_kb.get("server_in_flight")
    add(f"  Temporal dev server: {kib(server_base)} before, {kib(server_held)} in flight")
    if r.observer.get("lost"):
        add(f"  (the pod observer's watch expired {r.observer['lost']} times: some timestamps may be late)")


def recheck_cost(r: Results) -> tuple[float, float]:
    """Actions and events of one safety re-check: measured with --recheck, else from the code path."""
    rechecks = mean([c.activities.get("check_job", 0) for c in r.waiting_costs])
    if not (r.options.recheck and rechecks):
        return 2.0, 11.0  # timer started + check_job; fired, 2 x 3 workflow-task events, 3 activity events
    # The signal itself: 1 signal + 1 new timer (2 actions); signaled, 3 workflow-task events,
    # timer cancelled, timer started (6 events). The rest is the re-checks.
    actions = mean([c.billable_actions for c in r.waiting_costs])
    events = mean([c.events for c in r.waiting_costs])
    return (actions - 2) / rechecks, (events - 6) / rechecks


def budget_line(label: str, costs: Sequence[HistoryCost], add: Callable[[str], None]) -> None:
    """The per-placement budget, over the placements whose job never showed a pending reason."""
    plain = [c for c in costs if not c.activities.get("report_pending")]
    if not plain:
        return
    add(
        f"  {label}: all {len(costs)} placements: actions {mean([c.billable_actions for c in costs]):.2f}, "
        f"events {mean([c.events for c in costs]):.1f}"
    )
    actions = [float(c.billable_actions) for c in plain]
    events = [float(c.events) for c in plain]
    verdict = "within" if max(actions) <= BUDGET_ACTIONS and max(events) <= BUDGET_EVENTS else "OVER"
    add(
        f"  budget ({label}, {len(plain)} of {len(costs)} placements without a pending reason): actions "
        f"{mean(actions):.2f} (max {max(actions):.0f}), events {mean(events):.1f} (max {max(events):.0f}); "
        f"<= {BUDGET_ACTIONS} / <= {BUDGET_EVENTS}: {verdict}"
    )


def slurm_rows(stats: RequestStats, who: str, n: int, add: Callable[[str], None]) -> None:
    for operation, count in sorted(stats.count.items(), key=lambda kv: -kv[1]):
        received = stats.bytes_in[operation] / count / 1024
        took = stats.seconds[operation] / count * 1000
        add(
            f"  {who:<11} {operation:<18} {count / n:6.2f}  {received:8.2f} KiB  {took:6.1f} ms"
            "  (per request)"
        )


def watcher_second(r: Results, add: Callable[[str], None]) -> None:
    """What the job watcher costs Slurm per second while placements wait (the hold window)."""
    hold = r.hold.end - r.hold.start
    if hold <= 0:
        return
    requests = sum(r.slurm_hold.count.values())
    received = sum(r.slurm_hold.bytes_in.values()) / 1024
    restd, idle_restd = r.hold.cpu.get("slurmrestd"), r.paused.cpu.get("slurmrestd")
    ctld, idle_ctld = r.hold.cpu.get("slurmctld"), r.paused.cpu.get("slurmctld")
    idle = (r.paused.end - r.paused.start) or 1.0
    ops = ", ".join(f"{op} {count / hold:.1f}/s" for op, count in r.slurm_hold.count.most_common())
    add(
        f"  job watcher while {r.in_flight or len(r.burst.pods)} placements wait: "
        f"{r.watcher_passes_hold / hold:.2f} passes/s, {requests / hold:.2f} requests/s ({ops}), "
        f"{received / hold:.1f} KiB/s"
    )
    if restd is not None and idle_restd is not None and ctld is not None and idle_ctld is not None:
        add(
            f"    slurmrestd CPU {restd / hold * 1000:.1f} ms/s "
            f"(watcher paused: {idle_restd / idle * 1000:.1f}), "
            f"slurmctld {ctld / hold * 1000:.1f} ms/s (watcher paused: {idle_ctld / idle * 1000:.1f}); "
            "shared daemons, others' load included"
        )


def kube_rows(r: Results, n: int, add: Callable[[str], None]) -> None:
    add("Kubernetes API, the bridge's requests per placement (watches left out), mean time per request")
    rows = [(op, count) for op, count in r.kube_requests.most_common() if not op.endswith("(watch)")]
    for operation, count in rows:
        mean_ms = r.kube_seconds.get(operation, 0.0) / count * 1000
        add(f"  {operation:<56} {count / n:6.2f}  {mean_ms:7.1f} ms")
    add(f"  {'total':<56} {sum(count for _, count in rows) / n:6.2f}")
    add("")


def cpu_rows(r: Results, n: int, add: Callable[[str], None]) -> None:
    add(f"{'CPU, ms per placement':<38} {'burst':>8} {'+hold+finish':>13} {'paced':>8} {'reference':>10}")
    n_ref = len(r.reference.latencies) if r.reference else 0
    n_paced = len(r.paced.pods)
    for label, key in CPU_ROWS:
        cells = [
            (r.burst.cpu.get(key), n),
            (r.whole.cpu.get(key), n),
            (r.paced.cpu.get(key), n_paced),
            (r.reference_cpu.get(key), n_ref),
        ]
        text = [fmt_ms(v / count if v is not None and count else None) for v, count in cells]
        add(f"  {label:<36} {text[0]:>8} {text[1]:>13} {text[2]:>8} {text[3]:>10}")
    wall = r.burst.cpu.get("wall") or 0.0
    busy = sum(r.burst.cpu.get(k) or 0.0 for k in ("process", "server", "kube", "slurmctld", "slurmrestd"))
    machine = r.burst.cpu.get("machine") or 0.0
    add(
        f"  burst: {wall:.1f} s wall; these processes kept {busy / wall if wall else 0:.2f} of "
        f"{os.cpu_count()} cores busy, the whole machine {machine / wall if wall else 0:.2f}"
    )
    add("")


def report_pending(r: Results, add: Callable[[str], None]) -> None:
    o = r.options
    n = len(r.whole.pods) or 1
    fill = r.burst.end - r.burst.start
    add(f"Filling: {n} pending placements submitted in {fill:.0f} s ({n / fill if fill else 0:.1f}/s)")
    add(
        "  Slurm's answer for them at the end: "
        + ", ".join(f"{k} {v}" for k, v in r.pending_reasons.most_common())
    )
    add("")
    add(f"Starvation: {len(r.probes)} probe pods, each in a partition Slurm can start it in at once, ms")
    for key, label in (
        ("created_to_bound", "pod created -> bound"),
        ("created_to_submitted", "pod created -> Slurm job submitted"),
        ("submitted_to_running", "submitted -> RUNNING (Slurm, its log)"),
        ("running_to_bound", "Slurm RUNNING -> pod bound"),
    ):
        values = [p[key] for p in r.probes]
        add(f"  {label:<42} " + " ".join(f"{fmt_ms(v):>7}" for v in values))
    add("")
    hold = r.hold.end - r.hold.start
    if hold > 0:
        actions = sum(r.hold_actions.values())
        by_kind = sorted(r.hold_actions.items(), key=lambda kv: -kv[1])
        add(f"Waiting: {r.in_flight} placements in flight (pending in Slurm) for {hold:.0f} s")
        add(
            f"  dev server actions: {actions:.0f} = {actions / n / hold * 3600:.2f} per placement per hour"
            + (
                " (" + ", ".join(f"{k.split('_', 1)[-1]} {v:.0f}" for k, v in by_kind) + ")"
                if by_kind
                else ""
            )
        )
        watcher_second(r, add)
        add("")
    add(f"Slurm REST, per pending placement (fill + hold + probes = {r.whole.end - r.whole.start:.0f} s)")
    slurm_rows(r.slurm_activities, "activities", n, add)
    slurm_rows(r.slurm_watcher, "job watcher", n, add)
    listings = r.slurm_activities.count.get(LISTING, 0) + r.slurm_watcher.count.get(LISTING, 0)
    add(f"  listings of every job (GET /jobs/): {listings} in the whole run")
    add(f"  dev server actions per pending placement (fill to end): {sum(r.server_actions.values()) / n:.2f}")
    add("")
    kube_rows(r, n, add)
    add("Memory (RSS)")
    base, held = r.rss_kb.get("worker_baseline"), r.rss_kb.get("worker_in_flight")
    add(f"  this process: {kib(base)} idle, {kib(held)} with {r.in_flight} placements in flight")
    if base and held and r.in_flight:
        add(f"    {(held - base) / r.in_flight * 1000 / 1024:.0f} MiB per 1,000 in flight (over idle)")
    curve = [(count, rss) for count, rss in r.rss_curve if rss is not None]
    if curve:
        add(
            "    while filling: "
            + ", ".join(f"{count} submitted {rss / 1024:.0f} MiB" for count, rss in curve)
        )
    if len(curve) >= 2 and curve[-1][0] > curve[0][0]:
        slope = (curve[-1][1] - curve[0][1]) / (curve[-1][0] - curve[0][0])
        add(f"    marginal: {slope * 1000 / 1024:.0f} MiB per 1,000 (from {curve[0][0]} to {curve[-1][0]})")
    server_base, server_held = r.rss_kb.get("server_baseline"), r.rss_kb.get("server_in_flight")
    add(f"  Temporal dev server: {kib(server_base)} idle, {kib(server_held)} in flight")
    del o


def to_json(r: Results) -> dict[str, Any]:
    def quantiles(values: Sequence[float]) -> dict[str, float | None]:
        return {f"p{q}": None if (v := percentile(values, q)) is None else v * 1000 for q in (50, 90, 99)} | {
            "n": float(len(values))
        }

    def per(stats: RequestStats, n: int) -> dict[str, dict[str, float]]:
        return {
            op: {
                "per_placement": count / n,
                "kib_per_request": stats.bytes_in[op] / count / 1024,
                "ms_per_request": stats.seconds[op] / count * 1000,
            }
            for op, count in stats.count.items()
        }

    n = len(r.whole.pods) or 1
    hold = (r.hold.end - r.hold.start) or 0.0
    slurm_total = sum(r.slurm_activities.count.values()) + sum(r.slurm_watcher.count.values())
    slurm_kib = (sum(r.slurm_activities.bytes_in.values()) + sum(r.slurm_watcher.bytes_in.values())) / 1024
    restd = r.whole.cpu.get("slurmrestd")
    return {
        "options": asdict(r.options),
        "started": r.started,
        "environment": r.environment,
        "slurm_jobs_at_start": r.slurm_jobs_at_start,
        "placement_rate": r.burst.rate,
        "reference_rate": r.reference_rate,
        "reference_rate_before": r.reference_before.rate if r.reference_before else None,
        "reference_rate_after": r.reference.rate if r.reference else None,
        "ratio": r.ratio,
        "paced_rate": r.paced_rate,
        "latencies_ms": {
            phase: {key: quantiles(values) for key, values in lat.items()}
            for phase, lat in r.latencies.items()
        },
        "steps_ms": {
            phase: {key: quantiles([step[key] for step in steps if key in step]) for _, key in STEP_ROWS}
            for phase, steps in r.steps.items()
        },
        "running_from_log": r.running_from_log,
        "slurm_passes": {
            phase: pass_summary(passes, r.options.concurrency) for phase, passes in r.passes.items()
        },
        "via_watcher": r.via_watcher,
        "pending_reasons_read": {phase: dict(c) for phase, c in r.reasons.items()},
        "budget": {
            phase: {
                "placements": len(plain),
                "actions_mean": mean([c.billable_actions for c in plain]),
                "actions_max": max([c.billable_actions for c in plain] or [0]),
                "events_mean": mean([c.events for c in plain]),
                "events_max": max([c.events for c in plain] or [0]),
            }
            for phase, costs in (("burst", r.costs), ("paced", r.paced_costs))
            for plain in [[c for c in costs if not c.activities.get("report_pending")]]
        },
        "history": {
            "events": mean([c.events for c in r.costs]),
            "bytes": mean([c.bytes for c in r.costs]),
            "actions": mean([c.billable_actions for c in r.costs]),
            "actions_by_kind": {
                kind: mean([c.actions.get(kind, 0) for c in r.costs])
                for kind in sorted({k for c in r.costs for k in c.actions})
            },
        },
        "server_actions_per_placement": sum(r.server_actions.values()) / n,
        "server_actions": r.server_actions,
        "server_requests": r.server_requests,
        "server_not_found": r.server_not_found,
        "slurm": {
            "activities": per(r.slurm_activities, n),
            "watcher": per(r.slurm_watcher, n),
            "requests_per_placement": slurm_total / n,
            "kib_per_placement": slurm_kib / n,
            "listings": r.slurm_activities.count.get(LISTING, 0) + r.slurm_watcher.count.get(LISTING, 0),
            "slurmrestd_cpu_ms_per_placement": None if restd is None else restd / n * 1000,
            "watcher_hold": {
                "seconds": hold,
                "passes_per_s": r.watcher_passes_hold / hold if hold else None,
                "requests_per_s": sum(r.slurm_hold.count.values()) / hold if hold else None,
                "kib_per_s": sum(r.slurm_hold.bytes_in.values()) / 1024 / hold if hold else None,
                "by_operation": dict(r.slurm_hold.count),
            },
        },
        "kube_requests_per_placement": {
            op: count / n for op, count in r.kube_requests.items() if not op.endswith("(watch)")
        },
        "kube_ms_per_request": {
            op: r.kube_seconds.get(op, 0.0) / count * 1000
            for op, count in r.kube_requests.items()
            if not op.endswith("(watch)")
        },
        "cpu": {
            "idle": r.idle.cpu,
            "watcher_paused": r.paused.cpu,
            "burst": r.burst.cpu,
            "whole": r.whole.cpu,
            "hold": r.hold.cpu,
            "paced": r.paced.cpu,
            "reference": r.reference_cpu,
        },
        "rss_kb": r.rss_kb,
        "rss_curve_kb": r.rss_curve,
        "in_flight": r.in_flight,
        "max_cached_workflows": r.cache_size,
        "hold_actions": r.hold_actions,
        "waiting_per_placement": {
            "actions": mean([c.billable_actions for c in r.waiting_costs]),
            "events": mean([c.events for c in r.waiting_costs]),
            "rechecks": mean([c.activities.get("check_job", 0) for c in r.waiting_costs]),
        },
        "recheck_day": recheck_day(*recheck_cost(r)),
        "probes_ms": [{k: None if v is None else v * 1000 for k, v in p.items()} for p in r.probes],
        "pending_reasons": dict(r.pending_reasons),
        "failures": r.failures,
        "notes": r.notes,
    }


# -- entry point ----------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> Options:
    p = argparse.ArgumentParser(prog="python -m bench.placement", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--scenario", choices=("batch", "pending"), default="batch", help="what to run (default batch)"
    )
    p.add_argument(
        "--pods", type=int, default=None, help="placements to measure (default 100; pending: 1000)"
    )
    p.add_argument(
        "--nodes", type=int, default=50, help="Slurm external nodes = Kubernetes nodes (default 50)"
    )
    p.add_argument("--cpus", type=int, default=4, help="CPUs per node (default 4)")
    p.add_argument("--memory-mb", type=int, default=8000, help="memory per node (default 8000)")
    p.add_argument(
        "--concurrency", type=int, default=20, help="pods waiting to be bound at most (default 20)"
    )
    p.add_argument(
        "--watch-interval",
        type=float,
        default=DEFAULT_WATCH_INTERVAL,
        help=f"JOB_WATCH_INTERVAL, s (default: the bridge's, {DEFAULT_WATCH_INTERVAL:g})",
    )
    p.add_argument("--warmup", type=int, default=3, help="uncounted placements first (default 3)")
    p.add_argument(
        "--reference", type=int, default=None, help="reference workflows (default: --pods; 0: none)"
    )
    p.add_argument(
        "--finish-rate", type=float, default=None, help="pods/s turned Succeeded (default: measured)"
    )
    p.add_argument("--hold", type=float, default=10, help="s the placements wait in flight (default 10)")
    p.add_argument(
        "--recheck",
        type=float,
        default=0,
        help="tell placements to re-check every S s while holding (default: no)",
    )
    p.add_argument(
        "--paced",
        type=int,
        default=None,
        help="pods placed open loop after the burst (default: min(pods, 100))",
    )
    p.add_argument("--paced-load", type=float, default=0.4, help="paced rate / burst rate (default 0.4)")
    p.add_argument("--probes", type=int, default=3, help="pending: pods Slurm can start at once (default 3)")
    p.add_argument(
        "--foreign-jobs", type=int, default=0, help="another user's held jobs in Slurm during the run"
    )
    p.add_argument(
        "--max-cached-workflows",
        type=int,
        default=None,
        help="the worker's workflow cache (default: the bridge's); to attribute memory",
    )
    p.add_argument("--timeout", type=float, default=None, help="the whole run, s (default 300; pending: 900)")
    p.add_argument("--json", dest="json_path", help="also write the figures to this file")
    a = p.parse_args(argv)
    pending = a.scenario == "pending"
    pods = a.pods if a.pods is not None else (1000 if pending else 100)
    if pods < 1 or a.concurrency < 1 or a.nodes < 1:
        p.error("--pods, --nodes and --concurrency must be at least 1")
    if not pending and pods > a.nodes * a.cpus:
        p.error(f"{pods} 1-CPU pods do not fit on {a.nodes} x {a.cpus} CPUs: the benchmark holds them all")
    return Options(
        scenario=a.scenario,
        pods=pods,
        nodes=1 if pending else a.nodes,
        cpus=1 if pending else a.cpus,
        memory_mb=a.memory_mb,
        concurrency=a.concurrency,
        watch_interval=a.watch_interval,
        warmup=max(a.warmup, 1),
        reference=0 if pending else (pods if a.reference is None else a.reference),
        finish_rate=a.finish_rate,
        hold=a.hold,
        recheck=a.recheck,
        paced=0 if pending else (min(pods, 100) if a.paced is None else a.paced),
        paced_load=a.paced_load,
        probes=a.probes,
        foreign_jobs=max(a.foreign_jobs, 0),
        max_cached_workflows=a.max_cached_workflows,
        timeout=a.timeout if a.timeout is not None else (900 if pending else 300),
        json_path=a.json_path,
    )


class Aborted(Exception):
    """The run could not finish: timed out, or Slurm was restarted under it."""


async def slurmctld_restarted(bed: SlurmTestBed, bench: Bench) -> str:
    """Returns when slurmctld restarts while placements are in flight (it forgets our partitions and
    kills their jobs, so they cannot finish); a restart at any other time is only noted."""
    chroot = bed.jwt_file.parent / "root"
    pid = next(iter(pids_by_comm("slurmctld", chroot)), None)
    while True:
        await asyncio.sleep(1)
        now = next(iter(pids_by_comm("slurmctld", chroot)), None)
        if now == pid:
            continue
        bench.slurm_restarted = True
        why = f"slurmctld was restarted (pid {pid} -> {now}; by another test run?)"
        if bench.placing:
            return why
        bench.results.notes.append(f"{why} outside the placement phases")
        pid = now


async def amain(o: Options) -> Results:
    bed = await asyncio.to_thread(connect_slurm)
    partitions: list[TestPartition] = []
    foreign: list[int] = []
    bench: Bench | None = None
    try:
        say(f"Slurm partition: {o.nodes} external nodes x {o.cpus} CPUs")
        partition = await asyncio.to_thread(
            bed.make_partition, nodes=o.nodes, cpus=o.cpus, memory_mb=o.memory_mb
        )
        partitions.append(partition)
        spare = None
        if o.scenario == "pending":
            spare = await asyncio.to_thread(bed.make_partition, nodes=1, cpus=1, memory_mb=o.memory_mb)
            partitions.append(spare)
        if o.foreign_jobs:
            say(f"submitting {o.foreign_jobs} foreign jobs (held, another user's)")
            started = time.monotonic()
            foreign = await asyncio.to_thread(bed.submit_foreign_jobs, o.foreign_jobs)
            say(f"{len(foreign)} foreign jobs submitted in {time.monotonic() - started:.1f} s")
        bench = Bench(o, bed, partition, spare)
        return await run_bounded(bench, bed, o.timeout)
    finally:
        # Synchronous on purpose: nothing can cancel it, after a timeout or ^C the clean-up still runs.
        if foreign:
            say(f"cancelling {len(foreign)} foreign jobs")
            try:
                bed.cancel_foreign_jobs(foreign)
            except SlurmBedError as error:
                say(f"WARNING: foreign jobs not all cancelled: {error}")
        for made in partitions:
            say(f"removing Slurm partition {made.name}")
            jobs = list(bench.activity_slurm.submitted) if bench is not None and bench.started else []
            restarted = bench is not None and bench.slurm_restarted
            remove_partition(bed, made, jobs, watch=90.0 if restarted else 0.0)


async def run_bounded(bench: Bench, bed: SlurmTestBed, timeout: float) -> Results:
    run = asyncio.create_task(bench.run(), name="bench")
    guard = asyncio.create_task(slurmctld_restarted(bed, bench), name="slurmctld guard")
    try:
        done, _ = await asyncio.wait({run, guard}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if run in done:
            return run.result()
        why = guard.result() if guard in done else f"timed out after --timeout {timeout:g} s"
        raise Aborted(f"{why}; progress: {bench.progress()}")
    finally:
        for task in (run, guard):
            task.cancel()
        await asyncio.gather(run, guard, return_exceptions=True)  # the bench's own clean-up runs here


def remove_partition(bed: SlurmTestBed, partition: TestPartition, jobs: Sequence[int], watch: float) -> None:
    """Cancel the partition's jobs, delete it and its nodes; then, for `watch` seconds, delete it again
    whenever it comes back (a test that restarts slurmctld re-creates the dynamic partitions it saw
    before the restart, ours included).

    The run's own jobs (`jobs`) are cancelled first by id: `TestPartition.cleanup` lists every job
    in Slurm (`scontrol show job`), which takes minutes with tens of thousands of foreign jobs.
    """
    with contextlib.suppress(SlurmBedError):
        live = [job_id for job_id, state in bed.job_states(jobs).items() if not ENDED.intersection(state)]
        for job_id in live:
            with contextlib.suppress(SlurmBedError):
                bed.cancel_job(job_id)
        wait_until(
            lambda: not any(not ENDED.intersection(s) for s in bed.job_states(live).values()),
            "the run's jobs ended",
            timeout=30,
        )
    deadline = time.monotonic() + watch
    while True:
        try:
            bed.scontrol_quiet("delete", f"PartitionName={partition.name}")
            bed.delete_nodes(partition.node_names)
        except SlurmBedError:
            try:
                partition.cleanup()  # a job the run did not know of keeps a node busy
            except SlurmBedError as error:
                say(f"WARNING: partition {partition.name} not fully removed yet: {error}")
        while time.monotonic() < deadline:
            time.sleep(5)
            try:
                bed.scontrol("show", "partition", partition.name)
            except SlurmBedError:
                continue  # not there (or slurmctld is down): keep looking until the deadline
            say(f"partition {partition.name} came back; removing it again")
            break
        else:
            return


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    options = parse(argv)
    try:
        results = asyncio.run(amain(options))
    except Aborted as error:
        say(f"ABORTED: {error}")
        return 1
    print(report(results))
    if options.json_path:
        Path(options.json_path).write_text(json.dumps(to_json(results), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
