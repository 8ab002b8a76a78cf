"""Objects of one kind kept in memory by list + watch: client-go's informer store, for our caches.

The webhook's namespace labels and DeviceClass names and the worker's node cache each
keep, per object, only what they read (`keep`): the labels, a flag, a trimmed node. An
object `keep` turns down (None) is not kept, or leaves the store, so a cache can hold
just the objects it cares about while watching them all. After each list, what the list
no longer has is forgotten (deleted while nothing watched).

`wait_until` wakes on every change, so a test (or a caller) waits for what it expects to
see instead of polling.
"""

import asyncio
import contextlib
from collections.abc import Callable
from typing import Generic, TypeVar

from clients.informer import Backoff, EventType, Informer, missing
from clients.kube_client import Json, KubeClient

T = TypeVar("T")


class WatchedObjects(Generic[T]):
    """What `keep` made of each object of `path`, by name, while `run()` (or `start()`) watches."""

    def __init__(
        self,
        kube: KubeClient,
        path: str,
        keep: Callable[[Json], T | None],
        *,
        name: str,
        watch_timeout_seconds: int = 300,
        backoff: Backoff | None = None,
        on_synced: Callable[[frozenset[str]], None] | None = None,
    ) -> None:
        self.items: dict[str, T] = {}
        self.version = 0  # counts the changes to `items`: what is derived from them knows when to redo
        self._keep = keep
        self._on_synced_too = on_synced
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.informer = Informer(
            kube,
            path,
            name=name,
            on_event=self._on_event,
            on_synced=self._on_synced,
            watch_timeout_seconds=watch_timeout_seconds,
            backoff=backoff,
        )

    @property
    def synced(self) -> asyncio.Event:
        """Set after the first complete list; the store is complete from then on."""
        return self.informer.synced

    async def run(self) -> None:
        """Watch until cancelled."""
        await self.informer.run()

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"watch {self.informer.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def put(self, name: str, value: T) -> None:
        """Keep an object read some other way (a GET for one not seen by the watch yet)."""
        self.items[name] = value
        self._notify()

    def replace(self, values: dict[str, T]) -> None:
        """Everything there is, read some other way (a plain list)."""
        self.items = dict(values)
        self._notify()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Return once `predicate()` holds, checked now and after each change."""
        # A change sets the event and so wakes every waiter at once; each clears it before
        # waiting again, which cannot un-wake another already woken.
        while not predicate():
            self._changed.clear()
            await self._changed.wait()

    def _on_event(self, kind: EventType, obj: Json) -> None:
        name = str(obj["metadata"]["name"])
        kept = None if kind == "DELETED" else self._keep(obj)
        if kept is None:
            self.items.pop(name, None)
        else:
            self.items[name] = kept
        self._notify()

    def _on_synced(self, names: frozenset[str]) -> None:
        for name in missing(self.items, names):
            del self.items[name]
        if self._on_synced_too is not None:
            self._on_synced_too(names)
        self._notify()

    def _notify(self) -> None:
        self.version += 1
        self._changed.set()
