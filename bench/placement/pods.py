"""The benchmark's user and kubelet: pods created, waited for until bound, turned Succeeded; the
placements' workflows and histories read; CPU and the dev server's counters sampled.

`PodDriver` is the base of `Bench` (stack.py), which sets up what is declared here from Temporal
to the Slurm clients before any of it is used.
"""

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError, RPCStatusCode

from bench.kube import CountingKube, KubeDriver, KubeProcess, PodTimes, RealKube, pod_manifest
from bench.placement.results import Options, Results
from bench.probes import CpuSample, Samples, scrape, split_history, step_durations
from bench.slurm import ActivitySlurm, WatcherSlurm
from bridge.models import PodRef
from testbed.history_cost import HistoryCost
from testbed.slurm_bed import SlurmTestBed, TestPartition
from worker.job_watcher import JobWatcher
from worker.pod_watcher import workflow_id


class PodDriver:
    # Set up by the stack (Bench.run, stack.py) before the pods are driven.
    loop: asyncio.AbstractEventLoop
    _background: set[asyncio.Future[Any]]
    metrics_url: str
    kube_process: KubeProcess | RealKube
    kube: KubeDriver
    temporal: Client
    server_pid: int | None
    slurmctld_pid: int | None
    slurmrestd_pid: int | None
    follower_pids: list[int]  # the follower worker processes (--followers)
    task_queue: str
    installation: str
    activity_slurm: ActivitySlurm
    watcher_slurm: WatcherSlurm
    job_watcher: JobWatcher
    kube_client: CountingKube

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

    async def paced(self, prefix: str, count: int, rate: float, run_for: float, **kw: Any) -> list[PodTimes]:
        """Create `count` pods at `rate` per second whatever happens (open loop); each runs `run_for` s."""
        start = time.monotonic()
        tasks = []
        for index in range(count):
            delay = start + index / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            name = f"{prefix}-{index:05d}"
            self.run_after[name] = run_for
            tasks.append(asyncio.create_task(self.create(name, **kw)))
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
        return CpuSample.take(
            self.server_pid,
            self.kube_process.pids,
            self.slurmctld_pid,
            self.slurmrestd_pid,
            self.follower_pids,
        )

    def metrics(self) -> Samples:
        return scrape(self.metrics_url)
