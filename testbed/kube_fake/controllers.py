"""A kube-controller-manager in miniature: controllers fed by the store's event log.

A real cluster always runs controllers next to the API server; the ones whose
effects a client of the API can observe (a pod deleted because its node got a
NoExecute taint, a PodDisruptionBudget's status) are simulated here.

Each controller sees every stored change in order - the same ``StoredEvent``s
watches are served from, so nothing is polled - may keep timers on the
injectable clock, and writes through the store like any client.  One thread
runs them all, holding the store lock while it works (as the simulated kubelet
does) and sleeping on the store's condition until the next write or the next
due timer.  When the bounded event log has dropped events it had not read yet
(a burst of writes, ``compact_history``) it starts over from a full listing,
as an informer does after a 410.
"""

from __future__ import annotations

import functools
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Protocol

from . import errors
from .clock import Clock
from .loop import StoreLoop
from .resources import Registry
from .store import Store, StoredEvent
from .util import JSON, now_rfc3339


class Controller(Protocol):
    name: str

    def resync(self) -> None:
        """Rebuild all state from a full listing (start, or events were lost)."""
        ...

    def handle(self, event: StoredEvent) -> None:
        """React to one stored change (called in resourceVersion order)."""
        ...

    def next_due(self) -> float | None:
        """The earliest timer (clock seconds), if any."""
        ...

    def fire_due(self, now: float) -> None:
        """Run every timer due at ``now``."""
        ...


class ControllerManager(StoreLoop):
    def __init__(self, store: Store, clock: Clock, controllers: Sequence[Controller]) -> None:
        super().__init__(store, "kube-fake-controllers")
        self.clock = clock
        self.controllers = tuple(controllers)
        self._cursor: int | None = None  # last resourceVersion handed to the controllers

    def caught_up(self) -> bool:
        """Every change so far handled and no timer overdue (caller holds the store lock)."""
        if self._cursor != self.store.rv:
            return False
        due = self._next_due()
        return due is None or due > self.clock.now()

    # ------------------------------------------------------------ the loop
    def _run(self) -> None:
        store = self.store
        with store.cond:
            while not (self._stop or store.closing):
                self._step()
                # Wake ``settle()`` callers even when the step wrote nothing.
                store.cond.notify_all()
                timeout = self.clock.wait_timeout(self._next_due())
                store.cond.wait_for(self._woken, timeout=timeout)

    def _woken(self) -> bool:
        if self._stop or self.store.closing or self._cursor != self.store.rv:
            return True
        due = self._next_due()
        return due is not None and due <= self.clock.now()

    def _step(self) -> None:
        store = self.store
        if self._cursor is None:
            self._resync()
        assert self._cursor is not None
        try:
            events = store.events_after(self._cursor)
        except errors.ApiError:  # 410: the log no longer reaches back to our cursor
            self._resync()
            events = []
        for event in events:
            self._cursor = event.rv
            for controller in self.controllers:
                self._guard(controller, functools.partial(controller.handle, event))
        now = self.clock.now()
        for controller in self.controllers:
            due = controller.next_due()
            if due is not None and due <= now:
                self._guard(controller, functools.partial(controller.fire_due, now))

    def _resync(self) -> None:
        self._cursor = self.store.rv
        for controller in self.controllers:
            self._guard(controller, controller.resync)

    def _next_due(self) -> float | None:
        dues = [d for d in (c.next_due() for c in self.controllers) if d is not None]
        return min(dues) if dues else None

    @staticmethod
    def _guard(controller: Controller, work: Callable[[], None]) -> None:
        try:
            work()
        except Exception:
            # A controller bug must be visible but must not stop the others.
            print(f"kube_fake: controller {controller.name} failed:", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)


def record_event(
    store: Store, registry: Registry, involved: JSON, reason: str, message: str, component: str
) -> JSON:
    """A core/v1 Event as client-go's EventRecorder writes it (Normal, count 1)."""
    now = now_rfc3339()
    event: JSON = {
        "metadata": {
            "name": f"{involved['name']}.{time.time_ns():x}",
            "namespace": involved.get("namespace") or "default",
        },
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "source": {"component": component},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "type": "Normal",
        "eventTime": None,
        "reportingComponent": component,
        "reportingInstance": "",
    }
    return store.create(registry.resolve("events"), event["metadata"]["namespace"], event)
