"""Pods waiting for their PodGroup to be created, and the watches that see it appear.

A pod naming a PodGroup that does not exist yet (label `scheduling.x-k8s.io/pod-group`,
or `spec.schedulingGroup` for the built-in kind) is not placed alone: as with
kube-scheduler, it waits for the group. A watch of a PodGroup kind runs only
while some pod waits for a group of that kind, so a cluster that never meets
the case (or has no such CRD) pays nothing for it.

A kind is one API version: a built-in PodGroup is waited for at the version of
`scheduling.k8s.io` the cluster serves (`PodGroupNotFound.kind`, which
`bridge.grouping` found through discovery), so that is the version watched.

No creation is missed: a wait is registered before the PodGroup is looked up
once more (`recheck`), and a watch started later lists what exists first.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable

from bridge.grouping import Kind
from clients.informer import EventType, Informer
from clients.kube_client import Json, KubeClient, api_path

log = logging.getLogger(__name__)

# kind → (namespace, name) → pod uid → the pod as last seen
Waiting = dict[Kind, dict[tuple[str, str], dict[str, Json]]]
Appeared = Callable[[list[Json]], None]


class PodGroupWaits:
    def __init__(self, kube: KubeClient, on_appeared: Appeared) -> None:
        self.kube = kube
        self.on_appeared = on_appeared
        self._waiting: Waiting = {}
        self._watches: dict[Kind, asyncio.Task[None]] = {}
        self.idle = asyncio.Event()  # set while no pod waits (and nothing is watched)
        self.idle.set()

    def add(self, kind: Kind, namespace: str, name: str, pod: Json) -> bool:
        """Remember that `pod` waits for this PodGroup; True when it was not waiting already."""
        pods = self._waiting.setdefault(kind, {}).setdefault((namespace, name), {})
        uid = pod["metadata"]["uid"]
        new = uid not in pods
        pods[uid] = pod
        if kind not in self._watches:
            self._watches[kind] = asyncio.create_task(self._watch(kind), name=f"{kind.kind} watch")
        self.idle.clear()
        return new

    def update(self, pod: Json) -> None:
        """A newer snapshot of a waiting pod: it is the one started once its group appears."""
        uid = pod["metadata"]["uid"]
        for groups in self._waiting.values():
            for pods in groups.values():
                if uid in pods:
                    pods[uid] = pod

    def forget(self, uid: str) -> None:
        """The pod is gone (or no longer waits)."""
        for kind, groups in list(self._waiting.items()):
            for key, pods in list(groups.items()):
                pods.pop(uid, None)
                if not pods:
                    del groups[key]
            if not groups:
                self._stop(kind)

    @property
    def watching(self) -> set[Kind]:
        """The PodGroup kinds watched now: those some pod waits for."""
        return set(self._watches)

    def waiting(self, uid: str) -> bool:
        return any(uid in pods for groups in self._waiting.values() for pods in groups.values())

    async def recheck(self, kind: Kind, namespace: str, name: str) -> None:
        """Look the PodGroup up again after registering the wait: one created in between is not missed."""
        path = api_path(kind.plural, namespace=namespace, name=name, group=kind.group, version=kind.version)
        with contextlib.suppress(Exception):  # not found, or unreadable: the watch will tell
            self._appeared(kind, await self.kube.request("GET", path))

    async def close(self) -> None:
        for kind in list(self._watches):
            self._stop(kind)

    def _stop(self, kind: Kind) -> None:
        self._waiting.pop(kind, None)
        task = self._watches.pop(kind, None)
        if task is not None:
            task.cancel()
        if not self._watches:
            self.idle.set()

    async def _watch(self, kind: Kind) -> None:
        path = api_path(kind.plural, group=kind.group, version=kind.version)

        def on_event(event: EventType, obj: Json) -> None:
            if event in ("LISTED", "ADDED"):
                self._appeared(kind, obj)

        # Runs until cancelled (no pod waits for this kind any more).
        await Informer(self.kube, path, on_event=on_event, name=f"{kind.kind} ({kind.api_version})").run()

    def _appeared(self, kind: Kind, pod_group: Json) -> None:
        meta = pod_group.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        groups = self._waiting.get(kind, {})
        pods = groups.pop(key, None)
        if not groups:
            self._stop(kind)
        if pods:
            log.info("PodGroup %s/%s (%s) appeared: %d pods start", *key, kind.api_version, len(pods))
            self.on_appeared(list(pods.values()))
