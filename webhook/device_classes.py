"""Which DeviceClasses the cluster has: a list + watch cache, as for namespace labels.

A pod asking for `deviceclass.resource.kubernetes.io/<class>` of a class the cluster
does not have would wait in Slurm's queue and then fail at binding (the kubelet cannot
prepare devices of a class that does not exist); the webhook refuses it at creation
instead. A GET per pod would put the API server on the hot path of every DRA pod, so
the class names come from a cache fed by one list + watch (an `Informer`); a class
not in the cache (created a moment ago) is fetched once.

`resource.k8s.io/v1` is served from Kubernetes 1.34; an older API server answers its
paths with a plain-text `404 page not found`. The cache takes that as "no DeviceClasses"
(a served collection is never 404) and asks again every `unserved_recheck` seconds, so
an upgraded cluster is noticed without a restart; meanwhile it neither watches nor logs
failures.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from bridge import keys
from bridge.dra import RESOURCE_GROUP
from clients.informer import Backoff
from clients.kube_client import Json, KubeClient, KubeError, KubeNotFound, api_path
from clients.watched import WatchedObjects
from webhook.policy import ClusterDeviceClasses

log = logging.getLogger(__name__)

DEVICE_CLASSES = api_path("deviceclasses", group=RESOURCE_GROUP)
# Failures of one read: the API server answered something else, or did not answer.
READ_ERRORS = (KubeError, ValueError, OSError, TimeoutError)


class DeviceClassLookup(Protocol):
    async def lookup(self, names: Iterable[str]) -> ClusterDeviceClasses: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def dra_classes_named(*objects: Any) -> set[str]:
    """Every class named by a `deviceclass.resource.kubernetes.io/<class>` key anywhere in the objects.

    Pods, pod templates of workloads and a PodGroup's minResources alike: the pure checks
    decide which of them matter, this only says which classes to look up. Iterative, so a
    deeply nested object cannot exhaust the stack.
    """
    found: set[str] = set()
    stack: list[Any] = list(objects)
    while stack:
        value = stack.pop()
        if isinstance(value, Mapping):
            for key, item in value.items():
                if isinstance(key, str) and key.startswith(keys.DRA_RESOURCE_PREFIX):
                    found.add(key.removeprefix(keys.DRA_RESOURCE_PREFIX))
                stack.append(item)
        elif isinstance(value, list):
            stack.extend(value)
    return found


def _present(obj: Json) -> bool:
    return True  # a class's name is all the checks need


class DeviceClassCache:
    """Names of the cluster's DeviceClasses, kept current by list + watch while the group is served."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        watch_timeout_seconds: int = 300,
        max_backoff: float = 30.0,
        unserved_recheck: float = 60.0,
        read_timeout: float = 5.0,
    ) -> None:
        self.kube = kube
        # True: resource.k8s.io/v1 is served; False: it is not (no DeviceClasses); None: not known yet.
        self.served: bool | None = None
        self.unserved_recheck = unserved_recheck
        self.max_backoff = max_backoff
        self.read_timeout = read_timeout
        self.store = WatchedObjects(
            kube,
            DEVICE_CLASSES,
            _present,
            name="deviceclasses",
            watch_timeout_seconds=watch_timeout_seconds,
            backoff=Backoff(initial=min(0.2, max_backoff), max=max_backoff),
            on_synced=self._on_synced,
        )
        self.informer = self.store.informer
        # Counters the tests (and debug logs) read: how often the cache had to ask.
        self.probes = 0
        self.lookups = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def names(self) -> set[str]:
        return set(self.store.items)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="device-class-cache")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.kube.close()

    async def run(self) -> None:
        """Watch while the group is served; otherwise ask again now and then. Ends when cancelled."""
        while True:
            try:
                served = await self.probe()
            except READ_ERRORS as error:
                # Unreachable or refused (RBAC): lookups ask for themselves meanwhile.
                log.warning(
                    "cannot list DeviceClasses (%s); asking again in %gs", _why(error), self.max_backoff
                )
                await asyncio.sleep(self.max_backoff)
                continue
            if served:
                await self.store.run()  # only cancellation ends it
            await asyncio.sleep(self.unserved_recheck)

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Return once `predicate()` holds, checked after each change the cache sees."""
        await self.store.wait_until(predicate)

    async def probe(self) -> bool:
        """List the classes once: whether the group is served, and its classes if so."""
        self.probes += 1
        try:
            listed = await self.kube.request("GET", DEVICE_CLASSES, timeout=self.read_timeout)
        except KubeNotFound:
            if self.served is not False:
                log.info(
                    "%s/v1 is not served by this API server: no DeviceClasses, so pods asking for DRA "
                    "devices are refused; asking again every %gs",
                    RESOURCE_GROUP,
                    self.unserved_recheck,
                )
            self.served = False
            self.store.replace({})
            return False
        self.served = True
        self.store.replace({str(item["metadata"]["name"]): True for item in listed.get("items") or []})
        return True

    def _on_synced(self, names: frozenset[str]) -> None:
        self.served = True
        log.info("device class cache listed %d DeviceClasses", len(names))

    async def lookup(self, names: Iterable[str]) -> ClusterDeviceClasses:
        """What the cluster says of these classes: served or not, and which are missing."""
        wanted = set(names)
        if self.served is None:
            # Asked before the first list answered: list now, so "not served" is told apart
            # from "no such class" (both are a 404 to a GET of one class).
            try:
                await self.probe()
            except READ_ERRORS as error:
                return ClusterDeviceClasses(unknown=tuple((n, _why(error)) for n in sorted(wanted)))
        if self.served is False:
            return ClusterDeviceClasses(unserved=True, missing=frozenset(wanted))
        absent: set[str] = set()
        unknown: list[tuple[str, str]] = []
        for name in sorted(wanted - self.names):
            self.lookups += 1
            path = api_path("deviceclasses", name=name, group=RESOURCE_GROUP)
            try:
                await self.kube.request("GET", path, timeout=self.read_timeout)
            except KubeNotFound:
                absent.add(name)
                continue
            except READ_ERRORS as error:
                unknown.append((name, _why(error)))
                continue
            self.store.put(name, True)
        return ClusterDeviceClasses(missing=frozenset(absent), unknown=tuple(unknown))


def _why(error: BaseException) -> str:
    return str(error) or type(error).__name__  # a TimeoutError says nothing by itself
