"""worker/heartbeat.py: a step that runs long heartbeats, so its heartbeat timeout does not end it."""

import asyncio
import uuid
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.worker import Worker

from worker.heartbeat import HeartbeatInterceptor

ATTEMPTS: list[int] = []


@activity.defn(name="slow_step")
async def slow_step() -> int:
    ATTEMPTS.append(activity.info().attempt)
    await asyncio.sleep(3)  # three heartbeat timeouts' worth of work, without a heartbeat of its own
    return activity.info().attempt


@workflow.defn(name="SlowStep", sandboxed=False)
class SlowStep:
    @workflow.run
    async def run(self) -> int:
        return await workflow.execute_activity(
            slow_step,
            start_to_close_timeout=timedelta(seconds=30),
            heartbeat_timeout=timedelta(seconds=1),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )


async def test_a_step_longer_than_its_heartbeat_timeout_completes_in_one_attempt(
    temporal_client: Client,
) -> None:
    task_queue = f"heartbeat-{uuid.uuid4().hex[:8]}"
    async with Worker(
        temporal_client,
        task_queue=task_queue,
        workflows=[SlowStep],
        activities=[slow_step],
        interceptors=[HeartbeatInterceptor()],
    ):
        result = await temporal_client.execute_workflow(
            SlowStep.run, id=f"heartbeat-{uuid.uuid4()}", task_queue=task_queue
        )
    assert result == 1
    assert ATTEMPTS == [1]
