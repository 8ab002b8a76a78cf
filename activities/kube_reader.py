"""`bridge.grouping.Reader` over the Kubernetes API: how the worker reads owners and group members.

It also finds the version of `scheduling.k8s.io` that serves built-in PodGroups
(Kubernetes 1.36 serves v1alpha2, 1.37 v1beta1 and/or v1alpha3) through API
discovery, once per client and DISCOVERY_TTL_SECONDS: two small GETs, the
group's versions and that version's resources. The group's preferred version
is no answer: it is v1, PriorityClass's, which has no PodGroups.
"""

import asyncio
import time
import weakref
from collections.abc import Callable

from bridge.grouping import BUILTIN_SCHEDULING_APIS, SCHEDULING_GROUP, BuiltinSchedulingApi, Kind
from clients.kube_client import Json, KubeClient, KubeError, KubeNotFound, api_path

# Long enough that discovery costs nothing next to placements; short enough that an
# upgraded API server (1.36 → 1.37) or an API enabled later is found within minutes.
DISCOVERY_TTL_SECONDS = 300.0


class SchedulingDiscovery:
    """Which version of `scheduling.k8s.io` serves PodGroups on one cluster, asked at most once per TTL."""

    def __init__(
        self,
        kube: KubeClient,
        ttl_seconds: float = DISCOVERY_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.ttl_seconds = ttl_seconds
        self.clock = clock
        self._found: tuple[BuiltinSchedulingApi | None, float] | None = None  # (answer, when)
        self._lock = asyncio.Lock()  # concurrent first reads share one discovery

    async def served(self) -> BuiltinSchedulingApi | None:
        """The newest version the bridge reads that serves `podgroups`; None when none does."""
        async with self._lock:
            if self._found is None or self.clock() - self._found[1] >= self.ttl_seconds:
                # A failed discovery (KubeError) is not remembered: the caller's retry asks again.
                self._found = (await self._discover(), self.clock())
            return self._found[0]

    async def _discover(self) -> BuiltinSchedulingApi | None:
        try:
            group = await self.kube.request("GET", f"/apis/{SCHEDULING_GROUP}")
        except KubeNotFound:
            return None
        listed = {str(v.get("version")) for v in group.get("versions") or [] if isinstance(v, dict)}
        for api in BUILTIN_SCHEDULING_APIS:
            if api.version in listed and await self._serves_pod_groups(api.version):
                return api
        return None

    async def _serves_pod_groups(self, version: str) -> bool:
        try:
            resources = await self.kube.request("GET", f"/apis/{SCHEDULING_GROUP}/{version}")
        except KubeNotFound:
            return False  # dropped between the two reads
        return any(
            isinstance(r, dict) and r.get("name") == "podgroups" for r in resources.get("resources") or []
        )


# Readers are made per call; the answer lives as long as the client it was asked through.
_discoveries: "weakref.WeakKeyDictionary[KubeClient, SchedulingDiscovery]" = weakref.WeakKeyDictionary()


def scheduling_discovery(kube: KubeClient) -> SchedulingDiscovery:
    """The discovery of built-in PodGroups' version shared by everything using `kube`."""
    discovery = _discoveries.get(kube)
    if discovery is None:
        discovery = _discoveries[kube] = SchedulingDiscovery(kube)
    return discovery


class KubeReader:
    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube

    async def get(self, kind: Kind, namespace: str, name: str) -> Json | None:
        path = api_path(kind.plural, namespace=namespace, name=name, group=kind.group, version=kind.version)
        try:
            return await self.kube.request("GET", path)
        except KubeNotFound:
            return None
        except KubeError as error:
            if error.status == 403:
                raise PermissionError(error.message) from error
            raise

    async def list_pods(self, namespace: str, label_selector: str) -> list[Json]:
        query = {"labelSelector": label_selector} if label_selector else None
        listed = await self.kube.request("GET", api_path("pods", namespace=namespace), query=query)
        return list(listed.get("items", []))

    async def served_scheduling_api(self) -> BuiltinSchedulingApi | None:
        return await scheduling_discovery(self.kube).served()
