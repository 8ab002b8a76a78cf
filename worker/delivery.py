"""Deliver the latest state per key, one delivery in flight per key.

Watch events for one pod must reach its workflow in order, but only the newest
snapshot matters: while a delivery for a key is in flight, newer snapshots for
that key replace each other, and the next delivery carries the last one.
Different keys are delivered concurrently, up to a bound.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class LatestPerKey(Generic[T]):
    def __init__(self, deliver: Callable[[str, T], Awaitable[None]], concurrency: int = 64) -> None:
        self._deliver = deliver
        self._latest: dict[str, T] = {}
        self._running: dict[str, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(concurrency)
        self._idle = asyncio.Event()
        self._idle.set()

    def submit(self, key: str, item: T) -> None:
        self._latest[key] = item
        if key not in self._running:
            self._idle.clear()
            self._running[key] = asyncio.create_task(self._drain(key), name=f"deliver {key}")

    async def _drain(self, key: str) -> None:
        backoff = 0.5
        try:
            while key in self._latest:
                item = self._latest.pop(key)
                async with self._slots:
                    try:
                        await self._deliver(key, item)
                        backoff = 0.5
                        continue
                    except Exception as error:
                        log.warning("delivery for %s failed, will retry: %s", key, error)
                # Keep the failed item unless a newer one arrived meanwhile.
                self._latest.setdefault(key, item)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
        finally:
            del self._running[key]
            if not self._running:
                self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def close(self) -> None:
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
