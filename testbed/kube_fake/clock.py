"""The clock the simulated controllers schedule delayed work on.

Only delays measured by a controller (a toleration's ``tolerationSeconds``)
read it; timestamps written into objects stay wall-clock.  A test that wants
to cross a delay without waiting for it passes a ``FakeClock`` to
``FakeKubeServer`` and calls ``advance_clock``.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale."""
        ...

    def wait_timeout(self, deadline: float | None) -> float | None:
        """How long (real seconds) a thread may sleep before ``deadline`` is due;
        None: until something wakes it."""
        ...


class RealClock:
    def now(self) -> float:
        return time.monotonic()

    def wait_timeout(self, deadline: float | None) -> float | None:
        return None if deadline is None else max(deadline - time.monotonic(), 0.0)


class FakeClock:
    """Stands still until advanced; whoever advances it must wake the sleepers
    (``FakeKubeServer.advance_clock`` notifies the store's condition)."""

    def __init__(self, start: float = 0.0) -> None:
        self._lock = threading.Lock()
        self._now = start

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("kube_fake: a clock cannot go backwards")
        with self._lock:
            self._now += seconds

    def wait_timeout(self, deadline: float | None) -> float | None:
        # Time only moves when advanced, which wakes every sleeper anyway.
        return 0.0 if deadline is not None and deadline <= self.now() else None
