"""List + watch of one kind of Kubernetes object, kept going until cancelled.

A consumer gets every object of the kind (filtered by label and field
selectors) through one handler, in order: each item of a complete list as
LISTED, then `on_synced(keys)` with the keys of that list, then each watch
event as ADDED, MODIFIED or DELETED. The keys let a consumer forget what was
deleted while nothing watched (before the first list, or during a 410 gap).

The watch starts at the list's resourceVersion and, when a stream ends
normally (the server's timeoutSeconds), resumes from the last version seen,
BOOKMARKs included; so does a stream that breaks off after a healthy while
(HEALTHY_STREAM_SECONDS: a cut connection, a restarted API server). A 410
Gone (the version is too old) re-lists at once. Any other failure, including
one raised by a handler, is logged, counted and followed by a re-list after an
exponential back-off (tenacity); the back-off starts small again after a
session that stayed up for `reset_after` seconds. Only cancellation ends `run()`.

Memory stays bounded: no object cache and no queue. Handlers are awaited
inline, so a slow consumer slows the reading of the stream instead of
buffering it; between lists only the last list's keys are kept.
"""

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

from clients.kube_client import (
    HEALTHY_STREAM_SECONDS,
    Json,
    KubeClient,
    KubeError,
    WatchBroken,
    WatchExpired,
)

log = logging.getLogger(__name__)

EventType = Literal["LISTED", "ADDED", "MODIFIED", "DELETED"]
Handler = Callable[[EventType, Json], Awaitable[None] | None]
SyncedHandler = Callable[[frozenset[str]], Awaitable[None] | None]
ErrorObserver = Callable[[BaseException], None]

# Failures that say "the API server is unreachable or unhappy": logged in one
# line. Anything else is a bug somewhere and is logged with its traceback. An
# answer that does not decode is a KubeError too (KubeBadAnswer, WatchBroken).
EXPECTED_ERRORS = (KubeError, OSError, TimeoutError)


@dataclass(frozen=True)
class Backoff:
    """Delays between failed sessions: `initial`, doubling (plus up to `initial` of jitter) to `max`."""

    initial: float = 0.5
    max: float = 30.0
    reset_after: float = 60.0  # a session up this long counts as healthy: the next failure starts small


def object_key(obj: Json) -> str:
    """`namespace/name`, or `name` for a cluster-scoped object (client-go's MetaNamespaceKeyFunc)."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    namespace = meta.get("namespace")
    return f"{namespace}/{name}" if namespace and name else name


def uid_key(obj: Json) -> str:
    """`metadata.uid`: tells a pod from a later one of the same name."""
    return str((obj.get("metadata") or {}).get("uid") or "")


def _version(obj: Json) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class Informer:
    """List + watch of `path` (e.g. `api_path("pods")`) until cancelled; see the module docstring.

    `synced` is set after the first complete list, and stays set. `lists`,
    `failures` and `listed_keys` are there for tests, logs and consumers;
    `last_success` (wall-clock seconds of the last list, event or normal end of
    a stream) and `failing` (failures since then) tell its health.
    """

    def __init__(
        self,
        kube: KubeClient,
        path: str,
        *,
        on_event: Handler,
        on_synced: SyncedHandler | None = None,
        name: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        key: Callable[[Json], str] = object_key,
        watch_timeout_seconds: int = 300,
        backoff: Backoff | None = None,
        on_error: ErrorObserver | None = None,
    ) -> None:
        self.kube = kube
        self.path = path
        self.name = name or path
        self.key = key
        self.watch_timeout_seconds = watch_timeout_seconds
        self.backoff = backoff or Backoff()
        self.synced = asyncio.Event()
        self.listed_keys: frozenset[str] = frozenset()
        self.resource_version = ""
        self.lists = 0
        self.failures = 0
        self.failing = 0
        self.last_success: float | None = None
        self._on_event = on_event
        self._on_synced = on_synced
        self._on_error = on_error
        self._query = {
            name: value
            for name, value in (("labelSelector", label_selector), ("fieldSelector", field_selector))
            if value
        }

    async def run(self) -> None:
        """List, watch, re-list: returns only by raising CancelledError."""
        while True:
            # A fresh Retrying per round: its back-off counts the failures since the last healthy session.
            retrying = AsyncRetrying(
                retry=retry_if_exception_type(Exception),
                wait=wait_exponential_jitter(
                    multiplier=self.backoff.initial, max=self.backoff.max, jitter=self.backoff.initial
                ),
                before_sleep=self._before_sleep,
            )
            await retrying(self._session)

    async def _session(self) -> None:
        """One list, then watches from its version; returns when a re-list is due at once."""
        await self._list()
        started = time.monotonic()
        try:
            while True:
                await self._watch()  # the stream ended normally: resume where it stopped
                self._succeeded()
        except WatchExpired:
            log.info("%s watch expired (410 Gone); re-listing", self.name)
        except Exception as error:
            if time.monotonic() - started < self.backoff.reset_after:
                raise  # back off, counting from the failures before
            self._failed(error, "re-listing now")

    async def _list(self) -> None:
        listed = await self.kube.request("GET", self.path, query=self._query or None)
        keys = set()
        for item in listed.get("items") or []:
            key = self.key(item) if isinstance(item, dict) else ""
            if not key:
                log.warning("%s list: skipping an item without a key", self.name)
                continue
            keys.add(key)
            await _call(self._on_event, "LISTED", item)
        version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
        del listed  # the handler has seen it all: keep only the keys
        self.listed_keys = frozenset(keys)
        self.resource_version = version
        if self._on_synced is not None:
            await _call(self._on_synced, self.listed_keys)
        self.lists += 1
        self._succeeded()
        self.synced.set()
        log.debug("%s listed: %d objects at resourceVersion %s", self.name, len(keys), self.resource_version)

    async def _watch(self) -> None:
        """One stream; a stream that breaks off after a healthy while ends like a normal one:
        the next resumes from the last version seen, without a back-off or a re-list."""
        opened = time.monotonic()
        try:
            await self._stream()
        except WatchBroken as error:
            if time.monotonic() - opened < HEALTHY_STREAM_SECONDS:
                raise
            log.info("%s watch stream broke off (%s); resuming", self.name, error)

    async def _stream(self) -> None:
        async for event in self.kube.watch(
            self.path,
            resource_version=self.resource_version,
            query=self._query,
            timeout_seconds=self.watch_timeout_seconds,
        ):
            obj = event.get("object")
            kind = event.get("type")
            if not isinstance(obj, dict):
                continue
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                if self.key(obj):
                    await _call(self._on_event, kind, obj)
                else:
                    log.warning("%s watch: skipping a %s event without a key", self.name, kind)
            # After the handler: a watch resumed from here must not skip what it missed.
            self.resource_version = _version(obj) or self.resource_version
            self._succeeded()

    def _succeeded(self) -> None:
        self.last_success = time.time()
        self.failing = 0

    def _before_sleep(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        if error is not None:
            self._failed(error, f"re-listing in {state.upcoming_sleep:.1f}s")

    def _failed(self, error: BaseException, then: str) -> None:
        self.failures += 1
        self.failing += 1
        expected = isinstance(error, EXPECTED_ERRORS)
        log.warning(
            "%s list/watch failed (%s); %s",
            self.name,
            error if expected else type(error).__name__,
            then,
            exc_info=None if expected else error,
        )
        if self._on_error is not None:
            try:
                self._on_error(error)
            except Exception:
                log.exception("%s: the error observer failed", self.name)


async def _call(handler: Callable[..., Awaitable[None] | None], *args: object) -> None:
    result = handler(*args)
    if inspect.isawaitable(result):
        await result


def missing(known: Iterable[str], listed: frozenset[str]) -> list[str]:
    """The keys a consumer knows that a complete list no longer has: deleted while not watched."""
    return [key for key in known if key not in listed]
