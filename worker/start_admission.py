"""How many placements the pod watcher has started that have not claimed their pods yet.

A placement's first workflow task waits in Temporal's task queue, and so does the task that binds
a pod whose Slurm job started: in a burst of 1,000 new pods the placements already running waited
behind the 1,000 new ones' first tasks (signal -> its task started 6 s p50, 52 s p99). So the pod
watcher starts at most `limit` placements ahead of their claim (their first activity, which waits
for an activity slot of its own; the worker allows twice its activity slots); the next start
waits, first come first served, for one of them to claim its pods.

A placement that never claims (a group waiting for its other pods, a worker that lost the task)
lets its room go after `hold_seconds`, so a start never waits for ever: at worst `limit` starts
per `hold_seconds`.
"""

import asyncio
import time
from collections import deque
from collections.abc import Callable

# Started, not yet claimed: twice the worker's activity slots (20 by default) keeps them busy.
START_AHEAD = 40
# A placement that has not claimed its pods this long after its start no longer counts.
HOLD_SECONDS = 30.0


class StartAdmission:
    def __init__(
        self,
        limit: int = START_AHEAD,
        hold_seconds: float = HOLD_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit < 1:
            raise ValueError(f"the start limit must be at least 1, not {limit}")
        self.limit = limit
        self.hold_seconds = hold_seconds
        self._clock = clock
        self._held: dict[str, float] = {}  # placement id -> when its room goes by itself
        self._waiting: deque[tuple[str, asyncio.Future[bool]]] = deque()
        self.waits = 0  # starts that waited for room (for the benchmark and metrics)

    @property
    def held(self) -> int:
        return len(self._held)

    def request(self, key: str) -> asyncio.Future[bool]:
        """`key`'s (a placement id's) place in line: a future done once it may start, at once if
        it holds room already (another pod of the same group) or there is room and nobody waits.
        Its result: whether this start took the room (not another pod of its group)."""
        self._expire()
        admitted: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if key in self._held:
            admitted.set_result(False)
        elif len(self._held) < self.limit and not self._waiting:
            self._held[key] = self._clock() + self.hold_seconds
            admitted.set_result(True)
        else:
            self.waits += 1
            self._waiting.append((key, admitted))
        return admitted

    async def enter(self, key: str) -> None:
        """Until `key` may start (`request`); cancelled meanwhile, it takes no room."""
        admitted = self.request(key)
        try:
            while not admitted.done():
                # Woken by a claim, or by the earliest hold running out.
                earliest = min(self._held.values(), default=self._clock())
                try:
                    await asyncio.wait_for(asyncio.shield(admitted), max(earliest - self._clock(), 0.0))
                except TimeoutError:
                    self._expire()
        except BaseException:
            if admitted.done() and not admitted.cancelled() and admitted.result():
                self.leave(key)  # given the room as it was cancelled: hand it on
            else:
                admitted.cancel()  # skipped by `_admit`
            raise

    def leave(self, key: str) -> None:
        """The placement claimed its pods, or will not start: its room goes to the next in turn."""
        if self._held.pop(key, None) is not None:
            self._admit()

    def _expire(self) -> None:
        now = self._clock()
        for key in [key for key, until in self._held.items() if until <= now]:
            del self._held[key]
        self._admit()

    def _admit(self) -> None:
        while self._waiting and len(self._held) < self.limit:
            key, admitted = self._waiting.popleft()
            if admitted.done():
                continue  # its start was cancelled while it waited
            self._held[key] = self._clock() + self.hold_seconds
            admitted.set_result(True)
            # The group's other pods that queued meanwhile go with it: they need no room of their own.
            for other, joined in self._waiting:
                if other == key and not joined.done():
                    joined.set_result(False)
