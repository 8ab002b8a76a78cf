"""Heartbeats for slow activity attempts only, so a dead worker's step is taken over within seconds.

A worker killed mid-step (SIGKILL, OOM, a node lost) never reports its attempt. Without a
heartbeat timeout the server retries it only after the start-to-close timeout (60 s), so every
crash stalls its placements for a minute. The placement schedules its steps with a heartbeat
timeout; this interceptor heartbeats for any activity that has one, but only once the attempt
has run for a third of it: heartbeats are billable actions, and a normal step (well under a
second) sends none.
"""

import asyncio
import contextlib
from typing import Any

from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor


class HeartbeatInterceptor(Interceptor):
    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Heartbeating(next)


class _Heartbeating(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        timeout = activity.info().heartbeat_timeout
        if not timeout:
            return await super().execute_activity(input)
        beats = asyncio.create_task(_beat(timeout.total_seconds() / 3))
        try:
            return await super().execute_activity(input)
        finally:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats


async def _beat(interval: float) -> None:
    """Heartbeat every `interval` seconds, the first one after `interval` (the task copies the context)."""
    while True:
        await asyncio.sleep(interval)
        activity.heartbeat()
