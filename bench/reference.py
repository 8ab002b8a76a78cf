"""The reference workload: a trivial workflow run on the same server in the same batch.

Three no-op activities, then a wait for one signal that the driver sends right
after the start. On a shared, noisy machine absolute rates drift by tens of
percent between runs; the ratio placement ÷ reference taken in one batch
drifts less.
"""

import asyncio
import time
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker


@activity.defn(name="bench_noop")
async def noop() -> None:
    return None


@workflow.defn(name="BenchReference")
class ReferenceWorkflow:
    def __init__(self) -> None:
        self.poked = False

    @workflow.signal
    def poke(self) -> None:
        self.poked = True

    @workflow.run
    async def run(self) -> None:
        for _ in range(3):
            await workflow.execute_activity(noop, start_to_close_timeout=timedelta(seconds=30))
        await workflow.wait_condition(lambda: self.poked)


@dataclass
class ReferenceRun:
    workflow_ids: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)  # start request → result, seconds
    first_start: float = 0.0
    last_done: float = 0.0

    @property
    def rate(self) -> float:
        span = self.last_done - self.first_start
        return len(self.latencies) / span if span > 0 else 0.0


async def run_reference(client: Client, task_queue: str, count: int, concurrency: int) -> ReferenceRun:
    """`count` reference workflows, at most `concurrency` in flight (closed loop), on their own worker."""
    run = ReferenceRun()
    slots = asyncio.Semaphore(concurrency)

    async def one(index: int) -> None:
        async with slots:
            wid = f"bench-reference-{task_queue}-{index}"
            started = time.time()
            if not run.first_start:
                run.first_start = started
            handle = await client.start_workflow(ReferenceWorkflow.run, id=wid, task_queue=task_queue)
            await handle.signal(ReferenceWorkflow.poke)
            await handle.result()
            done = time.time()
            run.workflow_ids.append(wid)
            run.latencies.append(done - started)
            run.last_done = max(run.last_done, done)

    async with Worker(client, task_queue=task_queue, workflows=[ReferenceWorkflow], activities=[noop]):
        await asyncio.gather(*(one(i) for i in range(count)))
    return run
