"""Node watcher: a relevant Kubernetes node change → node sync now, not at the next interval.

List + watch of all nodes, resumed from the last resourceVersion and re-listed
on 410. Only changes that can change the plan count (labels and annotations the
bridge reads, `spec.unschedulable`, Ready, allocatable, InternalIP, our taint;
not heartbeats). A burst of them (a cordon of a whole rack) becomes one
trigger, `debounce` seconds after the first change.

A trigger asks the Schedule for one run with overlap BUFFER_ONE: a run already
going may have read the nodes before this change, so one more run is queued
after it (never more than one). A paused schedule is left paused: the watcher
does not trigger it, while an operator's own trigger still works.
"""

import asyncio
import logging

from temporalio.client import Client, ScheduleOverlapPolicy
from temporalio.service import RPCError, RPCStatusCode

from activities.kube_client import Json, KubeClient, KubeError, WatchExpired, api_path
from bridge.node_facts import watch_signature

log = logging.getLogger(__name__)


class NodeWatcher:
    def __init__(
        self, kube: KubeClient, temporal: Client, *, schedule_id: str, debounce: float = 1.0
    ) -> None:
        self.kube = kube
        self.temporal = temporal
        self.schedule_id = schedule_id
        self.debounce = debounce
        self.synced = asyncio.Event()  # set once the first full list is seen
        self.triggers = 0  # runs asked for
        self.paused_skips = 0  # changes not synced because the schedule was paused
        self._signature: dict[str, str] = {}
        self._changed = asyncio.Event()
        self._missing_logged = False

    async def run(self) -> None:
        trigger = asyncio.create_task(self._trigger_loop(), name="node sync trigger")
        try:
            await self._watch_loop()
        finally:
            trigger.cancel()
            await asyncio.gather(trigger, return_exceptions=True)

    async def _watch_loop(self) -> None:
        path = api_path("nodes")
        while True:
            try:
                version = await self._list(path)
                while True:  # re-watch from the newest version until it expires
                    version = await self._watch(path, version)
            except WatchExpired:
                log.info("node watch expired; re-listing")
            except (KubeError, OSError, ValueError) as error:
                log.warning("node watch failed, retrying in 2 s: %s", error)
                await asyncio.sleep(2)

    async def _list(self, path: str) -> str:
        listed = await self.kube.request("GET", path)
        current = {item["metadata"]["name"]: watch_signature(item) for item in listed.get("items") or []}
        if current != self._signature or not self.synced.is_set():
            # The first list always triggers: whatever changed while no worker ran.
            self._signature = current
            self._changed.set()
        self.synced.set()
        return str(listed.get("metadata", {}).get("resourceVersion", ""))

    async def _watch(self, path: str, version: str) -> str:
        async for event in self.kube.watch(path, resource_version=version):
            node: Json = event["object"]
            version = node.get("metadata", {}).get("resourceVersion", version)
            name = node.get("metadata", {}).get("name")
            if not name or event["type"] not in ("ADDED", "MODIFIED", "DELETED"):
                continue  # BOOKMARK: only the version moves on
            signature = None if event["type"] == "DELETED" else watch_signature(node)
            if self._signature.get(name) != signature:
                if signature is None:
                    self._signature.pop(name, None)
                else:
                    self._signature[name] = signature
                self._changed.set()
        return version

    async def _trigger_loop(self) -> None:
        while True:
            await self._changed.wait()
            await asyncio.sleep(self.debounce)  # coalesce a burst of changes into one run
            self._changed.clear()
            try:
                await self._trigger()
            except Exception as error:  # Temporal unreachable, say: this loop must outlive it
                log.warning("could not trigger node sync (schedule %s): %s", self.schedule_id, error)
                self._changed.set()  # the change still needs a run
                await asyncio.sleep(5)

    async def _trigger(self) -> None:
        handle = self.temporal.get_schedule_handle(self.schedule_id)
        try:
            description = await handle.describe()
            if description.schedule.state.paused:
                log.info("node sync schedule %s is paused; node change not synced", self.schedule_id)
                self.paused_skips += 1
                return
            await handle.trigger(overlap=ScheduleOverlapPolicy.BUFFER_ONE)
        except RPCError as error:
            if error.status != RPCStatusCode.NOT_FOUND:
                raise
            if not self._missing_logged:  # e.g. a worker that does not run node sync
                log.info("no schedule %s: node changes trigger no sync", self.schedule_id)
                self._missing_logged = True
            return
        self.triggers += 1
        log.debug("triggered node sync (schedule %s)", self.schedule_id)
