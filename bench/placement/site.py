"""The `site` scenario: the whole bridge at a site's size, at growing numbers of live placements.

The bridge's partition has `--nodes` nodes (1,000 by default) of `--cpus` CPUs (5): as many 1-CPU
pods run at once as there are CPUs, the rest wait in Slurm. For each level of `--levels`
(100, 1,000 and 10,000 live placements by default: at 10,000, 5,000 run and 5,000 wait), the
placements are grown to the level (at most `--concurrency` pods waiting to be submitted), then,
with all of them in flight:

- a hold (`--hold` s): the job watcher's passes and requests, every process's CPU, the worker's
  and the dev server's memory, the dev server's actions;
- a control window with the job watcher paused: the Slurm daemons' CPU without the bridge's
  questions, so that what slurmctld spends on its own scheduling of a long queue is told apart
  from what the watcher costs it;
- `--probes` pods, one a second, in a partition of their own with free CPUs (each runs 2 s):
  Slurm RUNNING → bound, and pod created → bound, while the level's placements are in flight.

Before the first level, `--reference` reference workflows (3 no-op activities + 1 signal) at the
same `--concurrency`, on the same server: each level's fill rate is printed against it.

Every pod stays in flight to the end of the run; the partitions' jobs are cancelled after it.
"""

import asyncio
import gc
import os
import time
from collections.abc import Sequence

from bench.kube import PodTimes
from bench.placement.environment import say
from bench.placement.results import SiteLevel
from bench.placement.scenarios import Scenarios, delta, stats_delta
from bench.probes import memory_kb, metric_by, wake_times
from bench.reference import run_reference
from bench.slurm import running_times

PROBE_RATE = 1.0  # probe pods created per second
PROBE_RUNS = 2.0  # seconds a probe pod runs before it turns Succeeded


class SiteScenario(Scenarios):
    """The scenarios of scenarios.py, and this one; `Bench` (stack.py) runs them."""

    async def run_site(self) -> None:
        o, r = self.o, self.results
        spare = await self.warm_up_beside()
        if o.reference:
            say(f"reference: {o.reference} workflows, at most {o.concurrency} in flight")
            r.reference_before = await run_reference(
                self.temporal, f"{self.task_queue}-reference", o.reference, o.concurrency
            )
        self.reset_counters()
        r.rss_kb["worker_baseline"] = memory_kb(os.getpid())
        r.rss_kb["server_baseline"] = memory_kb(self.server_pid)
        live: list[PodTimes] = []
        r.whole.start = time.time()
        for level in o.levels:
            measured = SiteLevel(live=level)
            say(f"level {level:,}: growing from {len(live):,} live placements")
            started = time.time()
            added = await self.fill(len(live), level - len(live))
            live += added
            measured.fill_placements, measured.fill_seconds = len(added), time.time() - started
            await self.settle(timeout=300)
            measured.bound = sum(1 for t in live if t.bound)
            pending = level - measured.bound
            say(f"level {level:,}: {measured.bound:,} bound, {pending:,} pending; hold {o.hold:g} s")
            await self.hold(measured)
            say(f"level {level:,}: {o.probes} probe pods, {PROBE_RATE:g} a second")
            probes = await self.paced(
                f"probe-{level}", o.probes, PROBE_RATE, run_for=PROBE_RUNS, annotations=spare
            )
            await self.wait_closed(probes)
            measured.probes = await self.probe_latencies(probes)
            r.site_levels.append(measured)
        r.whole.end = time.time()
        r.whole.pods = live
        self.placing = False

    async def fill(self, first: int, count: int) -> list[PodTimes]:
        """`count` more pods, at most `--concurrency` waiting to be submitted at once."""
        slots = asyncio.Semaphore(self.o.concurrency)
        added: list[PodTimes] = []

        async def one(index: int) -> None:
            async with slots:
                times = await self.create(f"pod-{index:05d}")
                added.append(times)
                await self.labelled_events[times.name].wait()  # submitted

        self.placing = True
        await asyncio.gather(*(one(first + i) for i in range(count)))
        return added

    async def hold(self, measured: SiteLevel) -> None:
        """Everything in flight for --hold s, then the control window with the job watcher paused."""
        o = self.o
        gc.collect()
        stats = self.watcher_slurm.counter.stats.snapshot()
        passes = self.job_watcher.passes
        actions = self.actions()
        cpu = self.cpu()
        started = time.time()
        await asyncio.sleep(o.hold)
        measured.hold_seconds = time.time() - started
        measured.hold_cpu = self.cpu().since(cpu)
        measured.hold_actions = self.actions() - actions
        measured.watcher = stats_delta(self.watcher_slurm.counter.stats, stats)
        measured.watcher_passes = self.job_watcher.passes - passes
        measured.rss_worker_kb = memory_kb(os.getpid())
        measured.rss_server_kb = memory_kb(self.server_pid)
        measured.rss_follower_kb = memory_kb(self.follower_pids[0]) if self.follower_pids else None
        self.watcher_slurm.running.clear()
        try:
            await asyncio.sleep(o.watch_interval * 2)  # a pass in flight finishes
            cpu = self.cpu()
            started = time.time()
            await asyncio.sleep(min(o.hold, 15.0))
            measured.paused_seconds = time.time() - started
            measured.paused_cpu = self.cpu().since(cpu)
        finally:
            self.watcher_slurm.running.set()

    def actions(self) -> float:
        return sum(metric_by(self.metrics(), "action", "action_type").values())

    async def probe_latencies(self, probes: Sequence[PodTimes]) -> list[dict[str, float | None]]:
        """Each probe's RUNNING -> bound, and its legs: the watcher's probe, the signal's delivery,
        the workflow task's wait for the worker, the task's run to the pod bound (the server's
        and this process's clocks are the machine's)."""
        started = running_times(self.bed, [t.job_id for t in probes if t.job_id])
        slots = asyncio.Semaphore(10)

        async def legs(probe: PodTimes) -> dict[str, float | None]:
            async with slots:
                history = await self.temporal.get_workflow_handle(self.workflow_id(probe)).fetch_history()
            wake = wake_times(history.events)
            running = started.get(probe.job_id or -1)
            seen = self.watcher_slurm.probed_running.get(probe.job_id or -1)
            return {
                "created_to_bound": delta(probe.created, probe.bound),
                "running_to_bound": delta(running, probe.bound),
                "running_to_seen": delta(running, seen),
                "seen_to_signal": delta(seen, wake.get("signal")),
                "signal_to_task": delta(wake.get("signal"), wake.get("task_started")),
                "task_to_bound": delta(wake.get("task_started"), probe.bound),
                "bound_to_task_completed": delta(probe.bound, wake.get("bound_task_completed")),
            }

        return list(await asyncio.gather(*(legs(probe) for probe in probes)))
