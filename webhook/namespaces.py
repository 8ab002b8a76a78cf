"""Is a namespace managed? A fixed list, or a label selector over cached namespace labels.

With a selector, every admission request needs the labels of its namespace.
A GET per request would put the API server on the hot path of every pod
creation (and make the webhook as slow as the API server under load), so the
labels come from a cache fed by one list + watch: resumed from the last
resourceVersion when the stream ends, re-listed when the API server answers
410 Gone (the version is too old). A namespace missing from the cache (created
a moment ago, its watch event not here yet) is fetched once and cached.
"""

import asyncio
import contextlib
import logging
import random
from collections.abc import Iterable
from typing import Any, Protocol

from activities.kube_client import KubeClient, KubeError, KubeNotFound, WatchExpired, api_path
from bridge.labels import Selector

log = logging.getLogger(__name__)


class NamespaceLookupError(Exception):
    """The labels of a namespace could not be read; the message says why."""


class ManagedNamespaces(Protocol):
    async def is_managed(self, namespace: str) -> bool: ...

    def not_ready_reason(self) -> str | None:
        """None when decisions can be made, else why not (for /readyz)."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class StaticNamespaces:
    """`--managed-namespaces`: a fixed list, no API access needed."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(names)

    async def is_managed(self, namespace: str) -> bool:
        return namespace in self.names

    def not_ready_reason(self) -> str | None:
        return None

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


class NamespaceLabelCache:
    """Labels of every namespace, kept current by list + watch."""

    def __init__(
        self, kube: KubeClient, *, watch_timeout_seconds: int = 300, max_backoff: float = 30.0
    ) -> None:
        self.kube = kube
        self.labels: dict[str, dict[str, str]] = {}
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.watch_timeout_seconds = watch_timeout_seconds
        self.max_backoff = max_backoff
        # Counters the tests (and debug logs) read: how often the cache had to ask.
        self.lists = 0
        self.lookups = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="namespace-label-cache")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                if not self.resource_version:
                    await self._list()
                await self._watch()
                failures = 0  # the stream ended normally (timeoutSeconds): resume from where it stopped
            except WatchExpired:
                log.info("namespace watch expired (410 Gone): re-listing namespaces")
                self.resource_version = ""
            except Exception as error:  # the cache must outlive any failure; CancelledError still stops it
                failures += 1
                delay = min(self.max_backoff, 0.2 * 2**failures) * random.uniform(0.5, 1.0)
                log.warning("namespace list/watch failed (%s); retrying in %.1fs", error, delay)
                await asyncio.sleep(delay)

    async def _list(self) -> None:
        listed = await self.kube.request("GET", api_path("namespaces"))
        self.lists += 1
        self.labels = {
            str(item["metadata"]["name"]): _labels(item) for item in listed.get("items") or [] if _named(item)
        }
        self.resource_version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
        self.synced.set()
        log.info(
            "namespace label cache listed %d namespaces at resourceVersion %s",
            len(self.labels),
            self.resource_version,
        )

    async def _watch(self) -> None:
        async for event in self.kube.watch(
            api_path("namespaces"),
            resource_version=self.resource_version,
            timeout_seconds=self.watch_timeout_seconds,
        ):
            obj = event.get("object") or {}
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if event.get("type") in ("ADDED", "MODIFIED") and _named(obj):
                self.labels[obj["metadata"]["name"]] = _labels(obj)
            elif event.get("type") == "DELETED" and _named(obj):
                self.labels.pop(obj["metadata"]["name"], None)
            if version:
                self.resource_version = str(version)

    async def get(self, namespace: str) -> dict[str, str] | None:
        """The namespace's labels; None if it does not exist."""
        cached = self.labels.get(namespace)
        if cached is not None:
            return cached
        self.lookups += 1
        try:
            obj = await self.kube.request("GET", api_path("namespaces", name=namespace), timeout=5.0)
        except KubeNotFound:
            return None
        except (KubeError, ValueError) as error:
            raise NamespaceLookupError(f"cannot read namespace {namespace}: {error}") from error
        labels = _labels(obj)
        self.labels[namespace] = labels
        return labels


def _named(obj: Any) -> bool:
    return (
        isinstance(obj, dict) and isinstance(obj.get("metadata"), dict) and bool(obj["metadata"].get("name"))
    )


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


class SelectedNamespaces:
    """`--managed-namespace-selector`: namespaces whose labels match, read from the cache."""

    def __init__(self, selector: Selector, cache: NamespaceLabelCache) -> None:
        self.selector = selector
        self.cache = cache

    async def is_managed(self, namespace: str) -> bool:
        labels = await self.cache.get(namespace)
        return labels is not None and self.selector.matches(labels)

    def not_ready_reason(self) -> str | None:
        return None if self.cache.synced.is_set() else "namespace labels not listed yet"

    async def start(self) -> None:
        await self.cache.start()

    async def stop(self) -> None:
        await self.cache.stop()
        await self.cache.kube.close()
