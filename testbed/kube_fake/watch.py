"""One watch connection: replay from the event log, then stream live events.

Selector handling copies the apiserver watch cache (cacheWatcher): an event
is judged against both the new and the previous state of the object, so an
object that starts matching arrives as ADDED and one that stops matching
arrives as DELETED (carrying its last matching state at the event's RV).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from . import errors
from .resources import ResourceType
from .store import Filter, Store, StoredEvent
from .util import JSON, clone, meta

# How often an idle watch checks that its client is still connected.  Only a
# server-side bound on leaked threads; it never delays event delivery.
LIVENESS_INTERVAL = 0.5


def encode(event_type: str, obj: JSON) -> bytes:
    return json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode() + b"\n"


def parse_rv(value: str | None) -> int | None:
    """None for "start from current state" (unset/""/"0").

    Not an unsigned integer: the storage layer's invalid-value error, which the
    real server answers as an unexpected error (500, a Status without reason).
    """
    if value in (None, "", "0"):
        return None
    text = str(value)
    if not text.isascii() or not text.isdigit() or int(text) >= 2**64:
        problem = "value out of range" if text.isascii() and text.isdigit() else "invalid syntax"
        raise errors.unexpected(
            f'resourceVersion: Invalid value: "{text}": strconv.ParseUint: parsing "{text}": {problem}'
        )
    return int(text)


class WatchStream:
    def __init__(
        self,
        store: Store,
        rt: ResourceType,
        namespace: str | None,
        flt: Filter,
        *,
        start_rv: int | None,
        timeout: float | None,
        allow_bookmarks: bool,
        send_initial_events: bool,
        write: Callable[[bytes], None],
        alive: Callable[[], bool],
    ) -> None:
        self.store, self.rt, self.namespace, self.flt = store, rt, namespace, flt
        self.start_rv = start_rv
        self.deadline = time.monotonic() + timeout if timeout else None
        self.allow_bookmarks = allow_bookmarks
        self.explicit_initial = send_initial_events
        self.send_initial = send_initial_events or start_rv is None
        self._write, self._alive = write, alive
        self._drop_seq = 0

    def _bookmark(self, rv: int, initial_end: bool = False) -> bytes:
        obj: JSON = {
            "kind": self.rt.kind,
            "apiVersion": self.rt.api_version,
            "metadata": {"resourceVersion": str(rv)},
        }
        if initial_end:
            obj["metadata"]["annotations"] = {"k8s.io/initial-events-end": "true"}
        return encode("BOOKMARK", obj)

    def _transform(self, ev: StoredEvent) -> bytes | None:
        if ev.rkey != self.rt.key or (self.namespace is not None and ev.namespace != self.namespace):
            return None
        now_ok = ev.type != "DELETED" and self.flt.matches(ev.obj)
        was_ok = ev.prev is not None and self.flt.matches(ev.prev)
        if now_ok:
            return encode("MODIFIED" if was_ok else "ADDED", self.rt.served(ev.obj))
        if not was_ok:
            return None
        if ev.type == "DELETED":
            return encode("DELETED", self.rt.served(ev.obj))
        assert ev.prev is not None
        gone: Any = clone(ev.prev)
        meta(gone)["resourceVersion"] = str(ev.rv)
        return encode("DELETED", self.rt.served(gone))

    def run(self) -> bool:
        """Stream until timeout/expiry (True: end the response cleanly) or until
        the server stops or the client goes away (False: drop the connection)."""
        store = self.store
        with store.cond:
            # Registering, snapshotting and noting the bookmark sequence happen
            # atomically, so a test that waited for ``active_watches`` cannot
            # slip a change or a bookmark request in between.
            store.active_watches += 1
            store.cond.notify_all()
            seen_bookmarks = store.bookmark_seq
            self._drop_seq = store.watch_drop_seq
            if self.send_initial:
                initial, cursor = store.snapshot(self.rt, self.namespace, self.flt), store.rv
            else:
                initial, cursor = [], int(self.start_rv or 0)
        try:
            for obj in initial:
                self._write(encode("ADDED", obj))
            if self.explicit_initial and self.allow_bookmarks:
                # Streaming-list clients (sendInitialEvents=true) wait for this marker.
                self._write(self._bookmark(cursor, initial_end=True))
            return self._stream(cursor, seen_bookmarks)
        except OSError:
            return False  # client went away mid-write
        finally:
            with store.cond:
                store.active_watches -= 1
                store.cond.notify_all()

    def _stream(self, cursor: int, seen_bookmarks: int) -> bool:
        store = self.store
        while True:
            error: errors.ApiError | None = None
            events: list[StoredEvent] = []
            with store.cond:
                while True:
                    if store.closing or store.watch_drop_seq != self._drop_seq:
                        # Shutdown, or drop_watches(): cut the stream without its
                        # final chunk, as a broken connection or a restarted
                        # apiserver would.
                        return False
                    try:
                        events = store.events_after(cursor)
                    except errors.ApiError as exc:
                        error = exc
                    bookmark_due = self.allow_bookmarks and store.bookmark_seq != seen_bookmarks
                    timed_out = self.deadline is not None and time.monotonic() >= self.deadline
                    if events or error or bookmark_due or timed_out:
                        seen_bookmarks = store.bookmark_seq
                        break
                    wait = LIVENESS_INTERVAL
                    if self.deadline is not None:
                        wait = min(wait, max(self.deadline - time.monotonic(), 0.0))
                    store.cond.wait(wait)
                    if not self._alive():
                        return False
            if error is not None:
                self._write(encode("ERROR", error.status()))
                return True
            for ev in events:
                cursor = ev.rv
                line = self._transform(ev)
                if line is not None:
                    self._write(line)
            if bookmark_due or (timed_out and self.allow_bookmarks):
                self._write(self._bookmark(cursor))
            if timed_out:
                return True
