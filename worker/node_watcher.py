"""Node watcher: a relevant Kubernetes node change → node sync now, not at the next interval.

List + watch of all nodes through an `Informer` (resumed from the last
resourceVersion, re-listed on 410 and after failures). Only changes that can
change the plan count (labels and annotations the bridge reads,
`spec.unschedulable`, Ready, allocatable, InternalIP, our taint; not
heartbeats). A burst of them (a cordon of a whole rack) becomes one
trigger, `debounce` seconds after the first change.

A trigger also tells the placements that no node could take (phase
Unschedulable) and whose pods' view of the nodes changed to look again, and the
pending ones whose job's excluded nodes no longer match the nodes' rules to
update their job (worker/node_rules.py).

A trigger asks the Schedule for one run with overlap BUFFER_ONE: a run already
going may have read the nodes before this change, so one more run is queued
after it (never more than one). A paused schedule is left paused: the watcher
does not trigger it, while an operator's own trigger still works.
"""

import asyncio
import logging

from temporalio.client import Client, ScheduleOverlapPolicy
from temporalio.service import RPCError, RPCStatusCode

from bridge import keys
from bridge.node_facts import rules_signature, watch_signature
from clients.informer import EventType, Informer, missing
from clients.kube_client import Json, KubeClient, api_path
from worker.node_rules import ExclusionRefresher, UnschedulableWakes
from workflows.placement import PlacementWorkflow

log = logging.getLogger(__name__)
# Placements waiting because no bridge node passes their pods' node rules.
UNSCHEDULABLE = (
    f"{keys.PLACEMENT_TYPE_CLAUSE} AND PlacementPhase = 'Unschedulable' AND ExecutionStatus = 'Running'"
)


def unschedulable_query(task_queue: str | None) -> str:
    """This bridge's placements (its task queue) waiting because no node passes their pods' rules;
    every installation's on the Temporal namespace without a task queue."""
    if task_queue is None:
        return UNSCHEDULABLE
    return f"{UNSCHEDULABLE} AND TaskQueue = '{task_queue.replace(chr(39), '')}'"


MAX_WAKE = 10_000


class NodeWatcher:
    def __init__(
        self,
        kube: KubeClient,
        temporal: Client,
        *,
        schedule_id: str,
        debounce: float = 1.0,
        refresher: ExclusionRefresher | None = None,
        unschedulable: UnschedulableWakes | None = None,
        task_queue: str | None = None,
    ) -> None:
        self.kube = kube
        self.temporal = temporal
        self.schedule_id = schedule_id
        self.debounce = debounce
        self.refresher = refresher
        self.unschedulable = unschedulable  # None: every such placement is woken on every burst
        self.unschedulable_query = unschedulable_query(task_queue)
        self.informer = Informer(
            kube, api_path("nodes"), name="nodes", on_event=self._on_event, on_synced=self._on_synced
        )
        self.synced = self.informer.synced  # set once the first full list is seen
        self.triggers = 0  # runs asked for
        self.paused_skips = 0  # changes not synced because the schedule was paused
        self.wakes = 0  # unschedulable placements told that nodes changed
        self._signature: dict[str, str] = {}
        self._rules: dict[str, str] = {}
        # The nodes whose changes the latest pass answered, and those changed since: on a shared
        # cluster, which passes were for which nodes (the log's and a test's question).
        self.last_burst: frozenset[str] = frozenset()
        self._burst: set[str] = set()
        self._sync_due = False
        self._changed = asyncio.Event()
        self._missing_logged = False

    async def run(self) -> None:
        trigger = asyncio.create_task(self._trigger_loop(), name="node sync trigger")
        try:
            await self.informer.run()
        finally:
            trigger.cancel()
            await asyncio.gather(trigger, return_exceptions=True)

    def _on_event(self, kind: EventType, node: Json) -> None:
        name = node["metadata"]["name"]
        signature = None if kind == "DELETED" else watch_signature(node)
        if self._signature.get(name) != signature:
            if signature is None:
                self._signature.pop(name, None)
            else:
                self._signature[name] = signature
            self._sync_due = True
            self._burst.add(name)
            self._changed.set()
        # What a pod's node rules look at (any label or taint, cordon, Ready) matters to
        # placements even where node sync has nothing to do.
        rules = None if kind == "DELETED" else rules_signature(node)
        if self._rules.get(name) != rules:
            if rules is None:
                self._rules.pop(name, None)
            else:
                self._rules[name] = rules
            self._burst.add(name)
            self._changed.set()

    def _on_synced(self, names: frozenset[str]) -> None:
        gone = missing(self._signature, names)
        for name in gone:
            del self._signature[name]
        for name in missing(self._rules, names):
            del self._rules[name]
        if gone or not self.synced.is_set():
            # The first list always triggers: whatever changed while no worker ran.
            self._sync_due = True
            self._burst.update(gone if self.synced.is_set() else names)
            self._changed.set()

    async def _trigger_loop(self) -> None:
        while True:
            await self._changed.wait()
            await asyncio.sleep(self.debounce)  # coalesce a burst of changes into one run
            self._changed.clear()
            sync_due, self._sync_due = self._sync_due, False
            self.last_burst, self._burst = frozenset(self._burst), set()
            log.debug("a pass for changes on %d nodes", len(self.last_burst))
            try:
                if sync_due:
                    await self._trigger()
                await self._wake_unschedulable()
                if self.refresher is not None:
                    await self.refresher.refresh()
            except Exception as error:  # Temporal unreachable, say: this loop must outlive it
                log.warning("could not trigger node sync (schedule %s): %s", self.schedule_id, error)
                self._sync_due = self._sync_due or sync_due
                self._burst |= self.last_burst
                self._changed.set()  # the change still needs a run
                await asyncio.sleep(5)

    async def _wake_unschedulable(self) -> None:
        """Placements that no node could take look again (once per burst of node changes): those
        the burst concerns, when `unschedulable` tells them apart."""
        listed = self.temporal.list_workflows(self.unschedulable_query, limit=MAX_WAKE)
        waiting = [execution.id async for execution in listed]
        if self.unschedulable is not None:
            waiting = await self.unschedulable.select(waiting)
        for workflow_id in waiting:
            try:
                await self.temporal.get_workflow_handle(workflow_id).signal(PlacementWorkflow.nodes_changed)
            except RPCError as error:
                if error.status != RPCStatusCode.NOT_FOUND:
                    raise
            self.wakes += 1

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
