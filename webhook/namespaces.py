"""Is a namespace managed? A fixed list, or a label selector over cached namespace labels.

With a selector, every admission request needs the labels of its namespace.
A GET per request would put the API server on the hot path of every pod
creation (and make the webhook as slow as the API server under load), so the
labels come from a cache fed by one list + watch (an `Informer`): resumed
from the last resourceVersion when the stream ends, re-listed when the API
server answers 410 Gone (the version is too old) or after a failure. A
namespace missing from the cache (created a moment ago, its watch event not
here yet) is fetched once and cached.
"""

import logging
from collections.abc import Iterable
from typing import Any, Protocol

from bridge.labels import Selector
from clients.informer import Backoff
from clients.kube_client import KubeClient, KubeError, KubeNotFound, api_path
from clients.watched import WatchedObjects

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
        self.store = WatchedObjects(
            kube,
            api_path("namespaces"),
            _labels,
            name="namespaces",
            watch_timeout_seconds=watch_timeout_seconds,
            backoff=Backoff(initial=min(0.2, max_backoff), max=max_backoff),
            on_synced=self._on_synced,
        )
        self.informer = self.store.informer
        self.synced = self.store.synced
        # Counters the tests (and debug logs) read: how often the cache had to ask.
        self.lists = 0
        self.lookups = 0

    @property
    def labels(self) -> dict[str, dict[str, str]]:
        return self.store.items

    @property
    def resource_version(self) -> str:
        return self.informer.resource_version

    async def start(self) -> None:
        await self.store.start()

    async def stop(self) -> None:
        await self.store.stop()

    async def run(self) -> None:
        await self.store.run()

    def _on_synced(self, names: frozenset[str]) -> None:
        self.lists += 1
        log.info(
            "namespace label cache listed %d namespaces at resourceVersion %s",
            len(names),
            self.resource_version,
        )

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
        self.store.put(namespace, labels)
        return labels


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
