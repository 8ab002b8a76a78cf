"""The scenarios, `batch` and `pending` (bench/README.md, "What it does"), their phases (warm-up,
idle, hold, the control window with the job watcher paused, probes), and the figures they take
from the pods, slurmctld's log and the bridge's Slurm clients (`latencies`).
"""

import asyncio
import contextlib
import gc
import os
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from bench.kube import PodTimes
from bench.placement.environment import say
from bench.placement.figures import LATENCY_ROWS
from bench.placement.pods import PodDriver
from bench.probes import RequestStats, Samples, memory_kb, metric_by
from bench.reference import run_reference
from bench.slurm import running_times, start_passes
from bridge import keys
from workflows.placement import WORKFLOW_TYPE, PlacementWorkflow

# The dev server's counters reach /metrics up to about a second late.
METRICS_FLUSH = 2.0


class Scenarios(PodDriver):
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
        passes_hold = self.job_watcher.passes
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
        r.watcher_passes_hold = self.job_watcher.passes - passes_hold
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

    async def warm_up_beside(self) -> dict[str, str]:
        """Warm up in the probes' partition, then the idle window; the probes' annotations."""
        assert self.spare is not None
        spare = {keys.SLURMJOB_PREFIX + "partition": self.spare.name}
        await self.warm_up(annotations=spare)
        await self.idle(5.0)
        return spare

    async def run_pending(self) -> None:
        o, r = self.o, self.results
        spare = await self.warm_up_beside()

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
        passes_hold = self.job_watcher.passes
        cpu_hold = self.cpu()
        r.hold.start = time.time()
        await asyncio.sleep(o.hold)
        r.hold.end = time.time()
        r.hold.cpu = self.cpu().since(cpu_hold)
        r.hold_actions = metric_delta(self.metrics(), metrics_hold, "action", "action_type")
        r.slurm_hold = stats_delta(self.watcher_slurm.counter.stats, hold_stats)
        r.watcher_passes_hold = self.job_watcher.passes - passes_hold
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
