"""Placement benchmark: the whole bridge on real Temporal and real Slurm, N pods, figures printed.

    .venv/bin/python -m bench.placement [--pods N] [--nodes M] [--concurrency C]

Assembles what the end-to-end tests assemble (tests/e2e/harness.py): a real
Temporal dev server with the bridge's search attributes, a real Slurm partition
of its own (`SlurmTestBed.make_partition`, removed at the end), the fake
Kubernetes API with nodes named like the Slurm nodes, and one in-process
`Bridge` (worker and its watchers; node sync's Schedule is not created). The benchmark plays the
kubelet: a bound pod turns Running at once and Succeeded later.

Phases, all in one batch on one server:

1. warm-up: a few placements, start to finish, not counted;
2. placement: N pods created, at most C at a time waiting to be bound (closed
   loop): throughput and create → bound latency at saturation;
3. hold: all N pods bound and running for --hold seconds; worker memory with N
   placements in flight, and what waiting costs Temporal;
4. finish: pods turn Succeeded, paced at the measured placement rate (open
   loop, so cleanup is measured below saturation); every placement completes;
5. reference: N trivial workflows (3 no-op activities + 1 signal) at the same
   concurrency, for the ratio that survives a noisy machine (perf.md).

Costs are counted, not estimated: history events, bytes and billable actions
from each workflow's history; Slurm REST requests by a counting httpx
transport; Kubernetes requests from the fake API's request log; CPU from
/proc. Timings are printed, never asserted. The run is bounded (--timeout),
stops when another test restarts slurmctld under it (a restart kills the jobs
of dynamic partitions), and always removes its Slurm partition.
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
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
from temporalio.client import Client, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.kube_client import KubeClient, load_configuration
from activities.slurm import job_event, placement_of
from activities.slurm_client import JobList, SlurmClient
from bench.probes import (
    CountingTransport,
    CpuSample,
    HistoryCost,
    RequestStats,
    Samples,
    child_pid,
    free_port,
    history_cost,
    kube_operation,
    memory_kb,
    metric_by,
    percentile,
    pids_by_comm,
    scrape,
)
from bench.reference import ReferenceRun, run_reference
from bridge import keys
from bridge import search_attributes as sa
from bridge.models import PodRef
from bridge.slurm_api import API_VERSION
from bridge.slurm_api.v0044 import V0044JobDescMsg, V0044OpenapiJobInfoResp
from tests.kube_fake import ApiError, FakeKubeServer
from tests.slurm_bed import SLURM_SID, SlurmBedError, SlurmTestBed, TestPartition
from worker.main import Bridge
from worker.pod_watcher import workflow_id
from worker.settings import load_settings

log = logging.getLogger("bench")
REPO = Path(__file__).resolve().parent.parent
TEMPORAL_CLI = Path(sys.executable).with_name("temporal")
# The dev server's counters reach /metrics up to about a second late.
METRICS_FLUSH = 2.0
SLURM_SID_DIR = Path(os.environ.get("SLURM_SID_DIR", "/var/cache/slurm-bridge/slurm-sid"))

# -- timings of one pod, all on this process's clock (time.time()) -------------


@dataclass
class PodTimes:
    name: str
    uid: str = ""
    created: float | None = None
    finalizer_added: float | None = None
    labelled: float | None = None
    bound: float | None = None
    succeeded: float | None = None
    finalizer_removed: float | None = None
    job_id: int | None = None
    node: str | None = None
    failure: str | None = None
    bound_event: asyncio.Event = field(default_factory=asyncio.Event, repr=False)


class PodObserver:
    """Every committed change of our pods in the fake API's store, seen on one thread as it happens.

    Reads the store's watch event log (what a watch stream would send) under its
    lock, without HTTP, so observing costs the system under test next to nothing
    and every timestamp is on this process's clock.
    """

    def __init__(
        self,
        kube: FakeKubeServer,
        namespace: str,
        pods: dict[str, PodTimes],
        on_bound: Callable[[str], None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.pods = pods
        self.on_bound = on_bound
        self.loop = loop
        self.lost = 0  # event-log compactions we fell behind (timestamps may then be late)
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="bench-pod-observer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self.kube.store.cond:
            self._stop = True
            self.kube.store.cond.notify_all()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        store = self.kube.store
        with store.cond:
            cursor = store.rv
            while not (self._stop or store.closing):
                try:
                    events = store.events_after(cursor)
                except ApiError:  # compacted past us: skip ahead
                    self.lost += 1
                    cursor = store.rv
                    continue
                now = time.time()
                for event in events:
                    cursor = event.rv
                    if event.rkey == ("", "pods") and event.namespace == self.namespace:
                        self._see(event.type, event.obj, now)
                # Commits need the lock, which we hold until wait() releases it: nothing is missed.
                store.cond.wait(0.5)

    def _see(self, kind: str, pod: dict[str, Any], now: float) -> None:
        meta = pod.get("metadata") or {}
        times = self.pods.get(meta.get("name", ""))
        if times is None or kind == "DELETED":
            return
        finalizers = meta.get("finalizers") or []
        if keys.FINALIZER in finalizers:
            times.finalizer_added = times.finalizer_added or now
        elif times.finalizer_added and not times.finalizer_removed:
            times.finalizer_removed = now
        label = (meta.get("labels") or {}).get(keys.LABEL_SLURM_JOB_ID)
        if label and times.labelled is None:
            times.labelled = now
            times.job_id = int(label)
        node = (pod.get("spec") or {}).get("nodeName")
        if node and times.bound is None:
            times.bound = now
            times.node = node
            self.loop.call_soon_threadsafe(self.on_bound, times.name)


# -- Slurm clients that keep timestamps -----------------------------------------


class ActivitySlurm(SlurmClient):
    """The activities' Slurm client: when each job was submitted and cancelled."""

    def __init__(self, *args: Any, counter: CountingTransport, **kwargs: Any) -> None:
        super().__init__(*args, transport=counter, **kwargs)
        self.counter = counter
        self.submitted: dict[int, float] = {}  # job id → submit answered
        self.cancelled: dict[int, float] = {}  # job id → cancel answered

    async def submit_job(self, job: V0044JobDescMsg) -> int:
        job_id = await super().submit_job(job)
        self.submitted[job_id] = time.time()
        return job_id

    async def cancel_job(self, job_id: int) -> None:
        await super().cancel_job(job_id)
        self.cancelled.setdefault(job_id, time.time())


class WatcherSlurm(SlurmClient):
    """The job watcher's Slurm client: when each job was first seen RUNNING, and Slurm's start time."""

    def __init__(self, *args: Any, counter: CountingTransport, **kwargs: Any) -> None:
        super().__init__(*args, transport=counter, **kwargs)
        self.counter = counter
        self.running_seen: dict[int, float] = {}
        self.start_time: dict[int, int] = {}  # Slurm's own, whole seconds
        self.passes: list[tuple[float, int]] = []  # (answered at, jobs listed)

    async def list_jobs(self, update_time: int | None = None) -> JobList:
        answer = await super().list_jobs(update_time)
        now = time.time()
        self.passes.append((now, len(answer.jobs)))
        for job in answer.jobs:
            if (
                job.job_id is None
                or job.job_id in self.running_seen
                or "RUNNING" not in (job.job_state or [])
            ):
                continue
            self.running_seen[job.job_id] = now
            if job.start_time is not None and job.start_time.set and job.start_time.number:
                self.start_time[job.job_id] = job.start_time.number
        return answer


# -- the stack ------------------------------------------------------------------


def pod_manifest(namespace: str, name: str, cpu: str, memory: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": namespace,
            "name": name,
            # Shared nodes: several 1-CPU pods per node.
            "annotations": {keys.SLURMJOB_PREFIX + "exclusive": "false"},
        },
        "spec": {
            "schedulerName": keys.DEFAULT_SCHEDULER_NAME,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"requests": {"cpu": cpu, "memory": memory}},
                }
            ],
        },
    }


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
    timeout: float
    json_path: str | None


@dataclass
class Results:
    options: Options
    started: str = ""
    environment: dict[str, str] = field(default_factory=dict)
    placements: list[PodTimes] = field(default_factory=list)
    costs: list[HistoryCost] = field(default_factory=list)
    reference_costs: list[HistoryCost] = field(default_factory=list)
    reference: ReferenceRun | None = None
    failures: list[str] = field(default_factory=list)
    cpu_place: dict[str, float | None] = field(default_factory=dict)  # placement phase (create → all bound)
    cpu_total: dict[str, float | None] = field(default_factory=dict)  # placement + hold + finish
    cpu_reference: dict[str, float | None] = field(default_factory=dict)
    rss_kb: dict[str, int | None] = field(default_factory=dict)
    open_at_hold: int | None = None
    slurm_activities: RequestStats = field(default_factory=RequestStats)
    slurm_watcher: RequestStats = field(default_factory=RequestStats)
    watcher_passes: list[tuple[float, int]] = field(default_factory=list)
    kube_requests: Counter[str] = field(default_factory=Counter)
    server_actions: dict[str, float] = field(default_factory=dict)  # the dev server's own counters
    server_requests: dict[str, float] = field(default_factory=dict)  # frontend RPCs by operation
    server_not_found: dict[str, float] = field(default_factory=dict)  # of which NotFound
    server_actions_reference: dict[str, float] = field(default_factory=dict)
    running_at_submit: int = 0
    latencies: dict[str, list[float]] = field(default_factory=dict)
    window: tuple[float, float] = (0.0, 0.0)  # placement + hold + finish, wall clock
    observer_lost: int = 0
    listing: dict[str, float] = field(default_factory=dict)
    hold_seconds: float = 0.0
    hold_actions: dict[str, float] = field(default_factory=dict)  # dev server counter while holding
    hold_passes: list[tuple[float, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Bench:
    def __init__(self, options: Options, bed: SlurmTestBed, partition: TestPartition) -> None:
        self.o = options
        self.bed = bed
        self.partition = partition
        self.namespace = partition.name
        self.pods: dict[str, PodTimes] = {}
        self.results = Results(options)
        self.placing = False  # placements in flight: a slurmctld restart now ruins the run
        self.slurm_restarted = False

    # -- kubelet role ------------------------------------------------------

    def _on_bound(self, name: str) -> None:
        times = self.pods[name]
        self.kube.set_pod_phase(self.namespace, name, "Running")  # what the kubelet does next
        times.bound_event.set()

    async def place(self, prefix: str, count: int, concurrency: int) -> list[PodTimes]:
        """Create `count` pods, at most `concurrency` waiting to be bound at any time."""
        slots = asyncio.Semaphore(concurrency)
        placed: list[PodTimes] = []

        async def one(index: int) -> None:
            async with slots:
                name = f"{prefix}-{index:05d}"
                times = self.pods[name] = PodTimes(name)
                placed.append(times)
                times.created = time.time()
                pod = self.kube.create_object("pods", pod_manifest(self.namespace, name, "1", "256Mi"))
                times.uid = pod["metadata"]["uid"]
                await times.bound_event.wait()

        await asyncio.gather(*(one(i) for i in range(count)))
        return placed

    async def finish(self, placed: Sequence[PodTimes], rate: float) -> None:
        """The pods' containers exit 0, in the order they were bound, `rate` per second."""
        start = time.monotonic()
        for index, times in enumerate(sorted(placed, key=lambda t: t.bound or 0.0)):
            delay = start + index / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self.kube.set_pod_phase(self.namespace, times.name, "Succeeded")
            times.succeeded = time.time()

    def workflow_id(self, times: PodTimes) -> str:
        return workflow_id(PodRef(namespace=self.namespace, name=times.name, uid=times.uid))

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

    async def histories(self, workflow_ids: Sequence[str]) -> list[HistoryCost]:
        slots = asyncio.Semaphore(20)

        async def one(wid: str) -> HistoryCost:
            async with slots:
                history = await self.temporal.get_workflow_handle(wid).fetch_history()
                return history_cost(history.events)

        return list(await asyncio.gather(*(one(w) for w in workflow_ids)))

    def progress(self) -> str:
        """How far the placements got (for a run that could not finish)."""
        pods = [t for t in self.pods.values() if not t.name.startswith("warm-")]
        counts = {
            "created": sum(1 for t in pods if t.created),
            "submitted (labelled)": sum(1 for t in pods if t.labelled),
            "bound": sum(1 for t in pods if t.bound),
            "succeeded": sum(1 for t in pods if t.succeeded),
            "finalizer removed": sum(1 for t in pods if t.finalizer_removed),
        }
        text = ", ".join(f"{value} {key}" for key, value in counts.items())
        return text

    def cpu(self) -> CpuSample:
        return CpuSample.take(self.server_pid, self.slurmctld_pid, self.slurmrestd_pid)

    # -- the run -----------------------------------------------------------

    async def run(self) -> Results:
        o, r = self.o, self.results
        r.started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        r.environment = environment(self.bed)
        metrics_port = free_port()
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        self.kube = FakeKubeServer().start()
        loop = asyncio.get_running_loop()
        observer = PodObserver(self.kube, self.namespace, self.pods, self._on_bound, loop)
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(self.kube.stop)
            for name in self.partition.node_names:
                self.kube.create_node(name, cpu=str(o.cpus), memory=f"{o.memory_mb}Mi")
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

            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
            kubeconfig = self.kube.kubeconfig(tmp / "kubeconfig")
            task_queue = f"bench-{uuid.uuid4().hex[:8]}"
            settings = load_settings(
                temporal_task_queue=task_queue,
                slurm_rest_url=self.bed.rest_url,
                slurm_user_name=self.bed.user_name,
                slurm_jwt_file=self.bed.jwt_file,
                kubeconfig=str(kubeconfig),
                partition=self.partition.name,
                job_watch_interval=o.watch_interval,
                metrics_port=0,
            )
            slurm_args = (self.bed.rest_url,)
            slurm_kwargs: dict[str, Any] = {"user_name": self.bed.user_name, "token_file": self.bed.jwt_file}
            activity_slurm = ActivitySlurm(*slurm_args, counter=CountingTransport(), **slurm_kwargs)
            watcher_slurm = WatcherSlurm(*slurm_args, counter=CountingTransport(), **slurm_kwargs)
            stack.push_async_callback(activity_slurm.close)
            stack.push_async_callback(watcher_slurm.close)
            kube_client = KubeClient(await load_configuration(str(kubeconfig)))
            stack.push_async_callback(kube_client.close)
            bridge = Bridge(self.temporal, kube_client, activity_slurm, settings)
            bridge.job_watcher.slurm = watcher_slurm  # its own connection and counters
            observer.start()
            stack.callback(observer.stop)
            bridge_task = asyncio.create_task(bridge.run(), name="bridge")

            async def stop_bridge() -> None:
                bridge_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await bridge_task

            stack.push_async_callback(stop_bridge)
            await asyncio.wait_for(bridge.pod_watcher.synced.wait(), 30)

            # 1. warm-up (imports, sandbox, connections), not counted
            say(f"warm-up: {o.warmup} placements")
            self.placing = True
            warm = await self.place("warm", o.warmup, o.warmup)
            await self.finish(warm, rate=100)
            await self.wait_closed(warm)
            r.failures.clear()
            await asyncio.sleep(max(2.0, 2 * o.watch_interval))

            # 2. placement
            say(f"placement: {o.pods} pods, at most {o.concurrency} waiting to be bound")
            pid = os.getpid()
            gc.collect()
            r.rss_kb["worker_baseline"] = memory_kb(pid)
            r.rss_kb["server_baseline"] = memory_kb(self.server_pid)
            self.kube.clear_requests()
            activity_slurm.counter.stats.reset()
            watcher_slurm.counter.stats.reset()
            watcher_slurm.passes.clear()
            metrics_before = scrape(self.metrics_url)
            cpu_start = self.cpu()
            window_start = time.time()
            placed = await self.place("pod", o.pods, o.concurrency)
            cpu_bound = self.cpu()
            r.cpu_place = cpu_bound.since(cpu_start)

            # 3. hold: every placement waits for its pods to end; what does waiting cost?
            await asyncio.sleep(max(METRICS_FLUSH, 2 * o.watch_interval))  # the last binds settle
            say(f"hold: {o.pods} placements in flight for {o.hold:g} s")
            metrics_hold = scrape(self.metrics_url)
            passes_hold = len(watcher_slurm.passes)
            hold_start = time.monotonic()
            await asyncio.sleep(o.hold)
            r.hold_seconds = time.monotonic() - hold_start
            r.hold_actions = metric_delta(scrape(self.metrics_url), metrics_hold, "action", "action_type")
            r.hold_passes = list(watcher_slurm.passes[passes_hold:])
            gc.collect()
            r.rss_kb["worker_in_flight"] = memory_kb(pid)
            r.rss_kb["server_in_flight"] = memory_kb(self.server_pid)
            with contextlib.suppress(Exception):
                counted = await self.temporal.count_workflows(
                    f"TaskQueue = '{task_queue}' AND ExecutionStatus = 'Running' "
                    "AND WorkflowType = 'PlacementWorkflow'"
                )
                r.open_at_hold = counted.count

            # 4. finish, below saturation
            rate = o.finish_rate or placement_rate(placed) or 1.0
            say(f"finish: pods Succeeded at {rate:.1f}/s")
            await self.finish(placed, rate)
            await self.wait_closed(placed)
            self.placing = False
            cpu_done = self.cpu()
            r.cpu_total = cpu_done.since(cpu_start)
            await asyncio.sleep(METRICS_FLUSH)
            r.window = (window_start, time.time())
            metrics_after = scrape(self.metrics_url)
            gc.collect()
            r.rss_kb["worker_after"] = memory_kb(pid)
            r.rss_kb["worker_peak"] = memory_kb(pid, "VmHWM")
            r.rss_kb["server_after"] = memory_kb(self.server_pid)
            r.slurm_activities = activity_slurm.counter.stats.snapshot()
            r.slurm_watcher = watcher_slurm.counter.stats.snapshot()
            r.watcher_passes = list(watcher_slurm.passes)
            r.kube_requests = Counter(
                kube_operation(req.method, req.path, req.query)
                for req in self.kube.requests
                if req.query.get("watch") not in ("true", "1")
            )
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

            # 5. reference, same server, same batch
            if o.reference:
                say(f"reference: {o.reference} workflows (3 no-op activities + 1 signal)")
                cpu_ref = self.cpu()
                metrics_ref = scrape(self.metrics_url)
                r.reference = await run_reference(
                    self.temporal, f"{task_queue}-reference", o.reference, o.concurrency
                )
                r.cpu_reference = self.cpu().since(cpu_ref)
                await asyncio.sleep(METRICS_FLUSH)
                r.server_actions_reference = metric_delta(
                    scrape(self.metrics_url), metrics_ref, "action", "action_type"
                )
                r.reference_costs = await self.histories(r.reference.workflow_ids)

            say("reading histories; timing the decoding of one full job listing")
            try:
                r.listing = await listing_cost(self.bed)
            except (httpx.HTTPError, ValueError) as error:  # slurmrestd busy or restarting: skip it
                r.notes.append(f"job listing not timed: {error!r}")
            r.placements = placed
            r.costs = await self.histories([self.workflow_id(t) for t in placed])
            r.observer_lost = observer.lost
            self.latencies(activity_slurm, watcher_slurm)
        return r

    def latencies(self, activity_slurm: ActivitySlurm, watcher_slurm: WatcherSlurm) -> None:
        r = self.results
        lat: dict[str, list[float]] = {
            "created_to_bound": [],
            "running_to_bound": [],
            "running_to_watcher": [],
            "watcher_to_bound": [],
            "created_to_submitted": [],
            "succeeded_to_cancelled": [],
            "succeeded_to_done": [],
        }
        for t in r.placements:
            if t.created and t.bound:
                lat["created_to_bound"].append(t.bound - t.created)
            if t.job_id is None:
                continue
            submitted = activity_slurm.submitted.get(t.job_id)
            seen = watcher_slurm.running_seen.get(t.job_id)
            started = watcher_slurm.start_time.get(t.job_id)
            if submitted and t.created:
                lat["created_to_submitted"].append(submitted - t.created)
            running: float | None = None
            if submitted and started is not None and started <= int(submitted):
                running = submitted  # allocated during the submit call: RUNNING when it answered
                r.running_at_submit += 1
            elif started is not None:
                running = started + 0.5  # Slurm's clock, whole seconds: middle of the second
            if running and t.bound:
                lat["running_to_bound"].append(t.bound - running)
            if running and seen:
                lat["running_to_watcher"].append(seen - running)
            if seen and t.bound:
                lat["watcher_to_bound"].append(t.bound - seen)
            cancelled = activity_slurm.cancelled.get(t.job_id)
            if t.succeeded and cancelled:
                lat["succeeded_to_cancelled"].append(cancelled - t.succeeded)
            if t.succeeded and t.finalizer_removed:
                lat["succeeded_to_done"].append(t.finalizer_removed - t.succeeded)
        r.latencies = lat


async def listing_cost(bed: SlurmTestBed, repeat: int = 3) -> dict[str, float]:
    """What one full `GET /jobs/` costs the bridge's event loop, best of `repeat`.

    Both the job watcher (each pass after any change in Slurm) and submit_job
    (find_job: `update_time` is all-or-nothing, so it gets every job) decode a
    complete listing: JSON, then the generated pydantic models, then (watcher)
    placement_of + job_event per job, each of which dumps the model again.
    """
    url = f"{bed.rest_url}/slurm/{API_VERSION}/jobs/"
    headers = {"X-SLURM-USER-NAME": bed.user_name, "X-SLURM-USER-TOKEN": bed.token()}
    best: dict[str, float] = {}
    async with httpx.AsyncClient(timeout=30) as http:
        for _ in range(repeat):
            started = time.perf_counter()
            response = await http.get(url, headers=headers)
            fetched = time.perf_counter()
            data = json.loads(response.content)
            decoded = time.perf_counter()
            jobs = V0044OpenapiJobInfoResp.model_validate(data).jobs or []
            validated = time.perf_counter()
            for job in jobs:
                if placement_of(job) is not None:
                    job_event(job)
            routed = time.perf_counter()
            sample = {
                "jobs": float(len(jobs)),
                "kib": len(response.content) / 1024,
                "http_ms": (fetched - started) * 1000,
                "json_ms": (decoded - fetched) * 1000,
                "pydantic_ms": (validated - decoded) * 1000,
                "route_ms": (routed - validated) * 1000,
            }
            if not best or sample["json_ms"] + sample["pydantic_ms"] < best["json_ms"] + best["pydantic_ms"]:
                best = sample
    return best


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


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


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
    return {
        "machine": f"{os.cpu_count()} vCPU ({cpu_model}), {mem_total} RAM, {platform.system()} "
        f"{platform.release()}",
        "load": "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg()),
        "python": platform.python_version(),
        "temporalio": metadata.version("temporalio"),
        "temporal": run(str(TEMPORAL_CLI), "--version"),
        "slurm": slurm,
    }


# -- the report -----------------------------------------------------------------


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.0f}"


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def report(r: Results) -> str:
    o = r.options
    n = len(r.placements) or 1
    lines: list[str] = []
    add = lines.append
    add(f"slurm-bridge placement benchmark, {r.started}")
    for key, value in r.environment.items():
        add(f"  {key:<11} {value}")
    add(
        f"  set-up      {o.pods} pods x 1 CPU (exclusive=false), {o.nodes} nodes x {o.cpus} CPUs; "
        f"<= {o.concurrency} pods waiting to be bound; job watch interval {o.watch_interval:g} s"
    )
    add("              one worker (sandbox on, SDK defaults); dev server with in-memory SQLite")
    if r.failures:
        add(f"  FAILED placements: {len(r.failures)}: {r.failures[:3]}")
    for note in r.notes:
        add(f"  note: {note}")
    add("")

    rate = placement_rate(r.placements) or 0.0
    add("Throughput")
    add(f"  {'placements/s (first pod created -> last pod bound)':<56} {rate:7.2f}")
    if r.reference:
        ratio = rate / r.reference.rate if r.reference.rate else 0.0
        add(f"  {'reference workflows/s (3 no-op activities + 1 signal)':<56} {r.reference.rate:7.2f}")
        add(f"  {'ratio placement / reference (same server, same batch)':<56} {ratio:7.2f}")
    add("")

    add(f"{'Latency, ms':<40} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7} {'n':>5}")

    def latency_row(label: str, values: Sequence[float]) -> None:
        cells = [percentile(values, 50), percentile(values, 90), percentile(values, 99)]
        cells.append(max(values) if values else None)
        add(f"  {label:<38} " + " ".join(f"{fmt_ms(v):>7}" for v in cells) + f" {len(values):>5}")

    for label, key in LATENCY_ROWS:
        latency_row(label, r.latencies.get(key, []))
    if r.reference:
        latency_row("reference: start -> completed", r.reference.latencies)
    add(
        f"  (RUNNING = the submit's answer for the {r.running_at_submit} of {len(r.placements)} jobs Slurm "
        "started during submit, else Slurm's start_time + 0.5 s)"
    )
    add("")

    add(f"{'Temporal, per workflow (its history)':<40} {'mean':>7} {'min':>7} {'max':>7}  {'reference':>9}")

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
    add("  activities: " + ", ".join(f"{name} {count / n:.1f}" for name, count in activities.most_common()))
    if r.server_actions:
        by_kind = sorted(r.server_actions.items(), key=lambda kv: -kv[1])
        add(
            f"  dev server 'action' counter: {sum(r.server_actions.values()) / n:.1f} per placement ("
            + ", ".join(f"{k.removeprefix('command_').removeprefix('grpc_')} {v / n:.1f}" for k, v in by_kind)
            + ")"
        )
    signals = r.server_requests.get("SignalWorkflowExecution", 0.0)
    if signals:
        missed = r.server_not_found.get("SignalWorkflowExecution", 0.0)
        add(
            f"  SignalWorkflowExecution RPCs: {signals / n:.1f} per placement, {missed / n:.1f} of them "
            "NotFound (workflow already closed or on another server)"
        )
    add("")

    window = r.window[1] - r.window[0]
    add(f"Slurm REST, per placement (placement + hold + finish = {window:.0f} s)")
    for operation, count in sorted(r.slurm_activities.count.items(), key=lambda kv: -kv[1]):
        received = r.slurm_activities.bytes_in[operation] / count / 1024
        took = r.slurm_activities.seconds[operation] / count * 1000
        add(
            f"  activities  {operation:<18} {count / n:5.2f}  {received:7.1f} KiB  {took:6.1f} ms"
            "  (KiB and ms per request)"
        )
    watcher = sum(r.slurm_watcher.count.values())
    if watcher:
        listed = [jobs for _, jobs in r.watcher_passes if jobs]
        add(
            f"  job watcher {'GET /jobs/':<18} {watcher / n:5.2f}  "
            f"{sum(r.slurm_watcher.bytes_in.values()) / watcher / 1024:7.1f} KiB  "
            f"{sum(r.slurm_watcher.seconds.values()) / watcher * 1000:6.1f} ms   "
            f"({watcher / window:.2f}/s; {len(listed)} of {len(r.watcher_passes)} answers listed jobs, "
            f"{mean(listed):.0f} on average)"
        )
    total = sum(r.slurm_activities.count.values()) + watcher
    kib_total = (sum(r.slurm_activities.bytes_in.values()) + sum(r.slurm_watcher.bytes_in.values())) / 1024
    add(f"  all         {total / n:.2f} requests, {kib_total / n:.0f} KiB received per placement")
    if r.listing:
        x = r.listing
        add(
            f"  decoding one full listing ({x['jobs']:.0f} jobs, {x['kib']:.0f} KiB) on the event loop: "
            f"json {x['json_ms']:.0f} ms + pydantic {x['pydantic_ms']:.0f} ms + routing "
            f"{x['route_ms']:.0f} ms"
        )
    add("")

    add("Kubernetes API, requests per placement")
    for operation, count in r.kube_requests.most_common():
        add(f"  {operation:<56} {count / n:5.2f}")
    add(f"  {'total':<56} {sum(r.kube_requests.values()) / n:5.2f}")
    add("")

    add(f"{'CPU, ms per workflow':<36} {'placement':>10} {'+hold+finish':>13} {'reference':>10}")
    n_ref = len(r.reference.latencies) if r.reference else 0
    for label, key in CPU_ROWS:
        place, whole, ref = r.cpu_place.get(key), r.cpu_total.get(key), r.cpu_reference.get(key)
        add(
            f"  {label:<34} {fmt_ms(place / n if place is not None else None):>10} "
            f"{fmt_ms(whole / n if whole is not None else None):>13} "
            f"{fmt_ms(ref / n_ref if ref is not None and n_ref else None):>10}"
        )
    wall = r.cpu_place.get("wall") or 0.0
    busy = sum(r.cpu_place.get(key) or 0.0 for key in ("process", "server", "slurmctld", "slurmrestd"))
    machine = r.cpu_place.get("machine") or 0.0
    add(
        f"  placement phase: {wall:.1f} s wall; these processes kept {busy / wall if wall else 0:.2f} "
        f"of {os.cpu_count()} cores busy, the whole machine {machine / wall if wall else 0:.2f}"
    )
    add("")

    if r.hold_seconds:
        actions = sum(r.hold_actions.values())
        per_minute = actions / n / r.hold_seconds * 60
        by_kind = sorted(r.hold_actions.items(), key=lambda kv: -kv[1])
        answered = sum(1 for _, jobs in r.hold_passes if jobs)
        add(f"Waiting: {len(r.placements)} placements in flight (pods running) for {r.hold_seconds:.0f} s")
        add(
            f"  Temporal actions: {actions:.0f} = {per_minute:.2f} per placement per minute"
            + (
                " (" + ", ".join(f"{k.split('_', 1)[-1]} {v:.0f}" for k, v in by_kind) + ")"
                if by_kind
                else ""
            )
        )
        add(
            f"  job watcher: {answered} of {len(r.hold_passes)} answers listed jobs "
            "(a change to any job anywhere in Slurm lists every job)"
        )
        add("")

    add("Memory (RSS)")
    base, held = r.rss_kb.get("worker_baseline"), r.rss_kb.get("worker_in_flight")
    add(
        f"  this process: {kib(base)} before, {kib(held)} with {r.open_at_hold or n} placements in flight, "
        f"{kib(r.rss_kb.get('worker_after'))} after (peak {kib(r.rss_kb.get('worker_peak'))})"
    )
    if base and held:
        add(
            f"    {(held - base) / n:.0f} KiB per in-flight placement (an upper bound: includes the fake "
            "API's store and heap grown by decoding job listings)"
        )
    server_base, server_held = r.rss_kb.get("server_baseline"), r.rss_kb.get("server_in_flight")
    add(
        f"  Temporal dev server: {kib(server_base)} before, {kib(server_held)} in flight, "
        f"{kib(r.rss_kb.get('server_after'))} after"
    )
    if server_base and server_held:
        add(f"    {(server_held - server_base) / n:.0f} KiB per in-flight placement")
    if r.observer_lost:
        add(f"  (the pod observer fell behind the fake API's event log {r.observer_lost} times)")
    return "\n".join(lines)


LATENCY_ROWS = (
    ("pod created -> bound", "created_to_bound"),
    ("pod created -> Slurm job submitted", "created_to_submitted"),
    ("Slurm RUNNING -> pod bound", "running_to_bound"),
    ("  RUNNING -> seen by the job watcher", "running_to_watcher"),
    ("  seen by the job watcher -> bound", "watcher_to_bound"),
    ("pod Succeeded -> Slurm job cancelled", "succeeded_to_cancelled"),
    ("pod Succeeded -> finalizer removed", "succeeded_to_done"),
)
CPU_ROWS = (
    ("this process", "process"),
    ("  asyncio thread (bridge, driver)", "main_thread"),
    ("  Temporal SDK core threads", "sdk_core"),
    ("  other threads (fake kube API)", "other_threads"),
    ("Temporal dev server", "server"),
    ("slurmctld (shared with others)", "slurmctld"),
    ("slurmrestd (shared with others)", "slurmrestd"),
)


def kib(value: int | None) -> str:
    return "?" if value is None else f"{value / 1024:.0f} MiB"


def to_json(r: Results) -> dict[str, Any]:
    return {
        "options": asdict(r.options),
        "started": r.started,
        "environment": r.environment,
        "placement_rate": placement_rate(r.placements),
        "reference_rate": r.reference.rate if r.reference else None,
        "latencies_ms": {
            key: {q: (percentile(v, q) or 0) * 1000 for q in (50, 90, 99)} for key, v in r.latencies.items()
        },
        "history": {
            "events": mean([c.events for c in r.costs]),
            "bytes": mean([c.bytes for c in r.costs]),
            "actions": mean([c.billable_actions for c in r.costs]),
        },
        "cpu_place": r.cpu_place,
        "cpu_total": r.cpu_total,
        "cpu_reference": r.cpu_reference,
        "rss_kb": r.rss_kb,
        "slurm_activities": dict(r.slurm_activities.count),
        "slurm_watcher": dict(r.slurm_watcher.count),
        "kube_requests": dict(r.kube_requests),
        "server_actions": dict(r.server_actions),
        "server_requests": dict(r.server_requests),
        "server_not_found": dict(r.server_not_found),
        "hold_seconds": r.hold_seconds,
        "hold_actions": dict(r.hold_actions),
        "listing": r.listing,
        "failures": r.failures,
        "notes": r.notes,
    }


# -- entry point ----------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> Options:
    p = argparse.ArgumentParser(prog="python -m bench.placement", description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, default=100, help="placements to measure (default 100)")
    p.add_argument(
        "--nodes", type=int, default=50, help="Slurm external nodes = Kubernetes nodes (default 50)"
    )
    p.add_argument("--cpus", type=int, default=4, help="CPUs per node (default 4)")
    p.add_argument("--memory-mb", type=int, default=8000, help="memory per node (default 8000)")
    p.add_argument(
        "--concurrency", type=int, default=20, help="pods waiting to be bound at most (default 20)"
    )
    p.add_argument("--watch-interval", type=float, default=1.0, help="JOB_WATCH_INTERVAL, s (default 1)")
    p.add_argument("--warmup", type=int, default=3, help="uncounted placements first (default 3)")
    p.add_argument(
        "--reference", type=int, default=None, help="reference workflows (default: --pods; 0: none)"
    )
    p.add_argument(
        "--finish-rate", type=float, default=None, help="pods/s turned Succeeded (default: measured rate)"
    )
    p.add_argument("--hold", type=float, default=10, help="s all pods stay running (default 10)")
    p.add_argument("--timeout", type=float, default=300, help="the whole run, s (default 300)")
    p.add_argument("--json", dest="json_path", help="also write the figures to this file")
    a = p.parse_args(argv)
    if a.pods < 1 or a.concurrency < 1 or a.nodes < 1:
        p.error("--pods, --nodes and --concurrency must be at least 1")
    if a.pods > a.nodes * a.cpus:
        p.error(f"{a.pods} 1-CPU pods do not fit on {a.nodes} x {a.cpus} CPUs: the benchmark holds them all")
    return Options(
        pods=a.pods,
        nodes=a.nodes,
        cpus=a.cpus,
        memory_mb=a.memory_mb,
        concurrency=a.concurrency,
        watch_interval=a.watch_interval,
        warmup=max(a.warmup, 1),
        reference=a.pods if a.reference is None else a.reference,
        finish_rate=a.finish_rate,
        hold=a.hold,
        timeout=a.timeout,
        json_path=a.json_path,
    )


class Aborted(Exception):
    """The run could not finish: timed out, or Slurm was restarted under it."""


async def slurmctld_restarted(bed: SlurmTestBed, bench: "Bench") -> str:
    """Returns when slurmctld restarts while placements are in flight (it forgets our partition and
    kills its jobs, so they cannot finish); a restart at any other time is only noted."""
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
    say(f"Slurm partition: {o.nodes} external nodes x {o.cpus} CPUs")
    partition = await asyncio.to_thread(bed.make_partition, nodes=o.nodes, cpus=o.cpus, memory_mb=o.memory_mb)
    bench = Bench(o, bed, partition)
    run = asyncio.create_task(bench.run(), name="bench")
    guard = asyncio.create_task(slurmctld_restarted(bed, bench), name="slurmctld guard")
    try:
        done, _ = await asyncio.wait({run, guard}, timeout=o.timeout, return_when=asyncio.FIRST_COMPLETED)
        if run in done:
            return run.result()
        why = guard.result() if guard in done else f"timed out after --timeout {o.timeout:g} s"
        raise Aborted(f"{why}; progress: {bench.progress()}")
    finally:
        for task in (run, guard):
            task.cancel()
        await asyncio.gather(run, guard, return_exceptions=True)  # the bench's own clean-up runs here
        say(f"removing Slurm partition {partition.name}")
        # Synchronous on purpose: nothing can cancel it, after a timeout or ^C the partition still goes.
        remove_partition(bed, partition, watch=90.0 if bench.slurm_restarted else 0.0)


def remove_partition(bed: SlurmTestBed, partition: TestPartition, watch: float) -> None:
    """Cancel the partition's jobs, delete it and its nodes; then, for `watch` seconds, delete it again
    whenever it comes back (a test that restarts slurmctld re-creates the dynamic partitions it saw
    before the restart, ours included)."""
    deadline = time.monotonic() + watch
    while True:
        try:
            partition.cleanup()
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
        Path(options.json_path).write_text(json.dumps(to_json(results), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
