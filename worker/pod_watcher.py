"""Pod watcher: Kubernetes pod changes → placement workflows.

List + watch of the pods that name our scheduler, resumed from the last
resourceVersion and re-listed when the API server says it is too old (410).
An unscheduled pod gets its group's placement workflow (signal-with-start, so
starting twice, from two replicas or after a restart, only signals); every
change of a pod the bridge is involved with is signalled to its workflow.
"""

import asyncio
import json
import logging
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.kube_client import Json, KubeClient, KubeError, WatchExpired, api_path
from activities.kube_reader import KubeReader
from bridge import grouping, keys
from bridge import search_attributes as sa
from bridge.models import PLACEMENT_ID_PREFIX, PlacementRequest, PodEvent, PodRef
from worker.delivery import LatestPerKey
from workflows.placement import PlacementWorkflow

log = logging.getLogger(__name__)


def workflow_id(pod: PodRef) -> str:
    """The placement id of a pod placed on its own."""
    return f"{PLACEMENT_ID_PREFIX}{pod.namespace}/{pod.name}/{pod.uid}"


def group_workflow_id(group: grouping.Group) -> str:
    return PLACEMENT_ID_PREFIX + group.key


def solo_group(pod: PodRef) -> grouping.Group:
    return grouping.Group(
        key=f"{pod.key}/{pod.uid}", kind="Pod", namespace=pod.namespace, name=pod.key, min_pods=1
    )


def pod_event(pod: Json, *, gone: bool = False) -> PodEvent:
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    grace = meta.get("deletionGracePeriodSeconds") or spec.get("terminationGracePeriodSeconds") or 30
    return PodEvent(
        pod=PodRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"]),
        phase=status.get("phase") or "Pending",
        node_name=spec.get("nodeName") or None,
        deleting=bool(meta.get("deletionTimestamp")),
        deletion_grace_seconds=int(grace),
        gone=gone,
        resource_version=meta.get("resourceVersion", ""),
        created=meta.get("creationTimestamp", ""),
        job_annotations=json.dumps(
            {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(keys.SLURMJOB_PREFIX)},
            sort_keys=True,
        ),
    )


def wants_placement(event: PodEvent) -> bool:
    return not event.node_name and not event.deleting and not event.terminal


def bridge_involved(pod: Json) -> bool:
    meta = pod["metadata"]
    return keys.FINALIZER in (meta.get("finalizers") or []) or keys.LABEL_SLURM_JOB_ID in (
        meta.get("labels") or {}
    )


class PodWatcher:
    def __init__(self, kube: KubeClient, temporal: Client, *, task_queue: str, scheduler_name: str) -> None:
        self.kube = kube
        self.temporal = temporal
        self.task_queue = task_queue
        self.scheduler_name = scheduler_name
        self.synced = asyncio.Event()  # set once the first full list has been handled
        self._workflow_of: dict[str, str] = {}  # pod uid → placement workflow id
        self._refs: dict[str, PodRef] = {}
        self._signature: dict[str, tuple[Any, ...]] = {}
        self._delivery: LatestPerKey[tuple[PodEvent, Json | None, bool]] = LatestPerKey(self._deliver)

    async def run(self) -> None:
        path = api_path("pods")
        query = {"fieldSelector": f"spec.schedulerName={self.scheduler_name}"}
        while True:
            try:
                version = await self._list(path, query)
                while True:  # re-watch from the newest version until it expires
                    version = await self._watch(path, query, version)
            except WatchExpired:
                log.info("pod watch expired; re-listing")
            except (KubeError, OSError, ValueError) as error:
                log.warning("pod watch failed, re-listing in 2 s: %s", error)
                await asyncio.sleep(2)
            except Exception:
                # The watcher must outlive anything unexpected: log it and start over.
                log.exception("pod watcher error, re-listing in 2 s")
                await asyncio.sleep(2)

    async def close(self) -> None:
        await self._delivery.close()

    async def _list(self, path: str, query: dict[str, str]) -> str:
        listed = await self.kube.request("GET", path, query=query)
        seen = set()
        for pod in listed.get("items", []):
            seen.add(pod["metadata"]["uid"])
            self._observe(pod, gone=False)
        # Pods deleted while we were not watching: tell their workflows.
        for uid in [uid for uid in self._refs if uid not in seen]:
            self._observe_gone(self._refs[uid])
        self.synced.set()
        return str(listed.get("metadata", {}).get("resourceVersion", ""))

    async def _watch(self, path: str, query: dict[str, str], version: str) -> str:
        async for event in self.kube.watch(path, resource_version=version, query=query):
            obj = event["object"]
            version = obj.get("metadata", {}).get("resourceVersion", version)
            if event["type"] in ("ADDED", "MODIFIED"):
                self._observe(obj, gone=False)
            elif event["type"] == "DELETED":
                self._observe(obj, gone=True)
        return version

    def _observe(self, pod: Json, *, gone: bool) -> None:
        event = pod_event(pod, gone=gone)
        if gone:
            self._observe_gone(event.pod)
            return
        start = wants_placement(event)
        if not start and not bridge_involved(pod):
            return  # bound by someone else, or finished before we ever saw it
        self._refs[event.pod.uid] = event.pod
        signature = (event.phase, event.node_name, event.deleting, start, event.job_annotations)
        if self._signature.get(event.pod.uid) == signature:
            return  # only a change the workflow cares about is worth a signal
        self._signature[event.pod.uid] = signature
        self._delivery.submit(event.pod.uid, (event, pod, start))

    def _observe_gone(self, pod: PodRef) -> None:
        self._refs.pop(pod.uid, None)
        self._signature.pop(pod.uid, None)
        if pod.uid in self._workflow_of:
            self._delivery.submit(pod.uid, (PodEvent(pod=pod, gone=True), None, False))

    async def _group_of(self, pod: Json, ref: PodRef) -> grouping.Group:
        try:
            return await grouping.resolve(KubeReader(self.kube), pod)
        except grouping.GroupError as error:
            # Placed alone, so its translation reports the problem on the pod.
            log.info("pod %s: %s", ref.key, error)
            return solo_group(ref)

    async def _deliver(self, uid: str, item: tuple[PodEvent, Json | None, bool]) -> None:
        event, pod, start = item
        wid = self._workflow_of.get(uid)
        group = None
        if wid is None and pod is not None:
            group = await self._group_of(pod, event.pod)
            wid = self._workflow_of[uid] = group_workflow_id(group)
        if wid is None:
            return
        if event.gone:
            self._workflow_of.pop(uid, None)
        if start:
            group = group or await self._group_of(pod or {}, event.pod)
            try:
                await start_placement_workflow(self.temporal, event, group, self.task_queue)
            except WorkflowAlreadyStartedError:
                log.debug("placement %s already closed; not restarting it", wid)
            return
        handle: WorkflowHandle[Any, Any] = self.temporal.get_workflow_handle(wid)
        try:
            await handle.signal(PlacementWorkflow.pod_changed, event)
        except RPCError as error:
            if error.status != RPCStatusCode.NOT_FOUND:
                raise  # retried by the delivery queue
            # No running placement: it finished, or never existed. Nothing to do.


async def start_placement_workflow(
    temporal: Client, event: PodEvent, group: grouping.Group, task_queue: str, *, retry: bool = False
) -> WorkflowHandle[Any, Any]:
    """Start the group's placement with this pod, or signal the pod to it if it runs already.

    The watcher never restarts a closed placement (a failed one waits for
    `slurm-bridge retry`, which passes retry=True).
    """
    pod = event.pod
    return await temporal.start_workflow(
        PlacementWorkflow.run,
        PlacementRequest(
            group=group.name, namespace=pod.namespace, pods=[pod], kind=group.kind, min_pods=group.min_pods
        ),
        id=group_workflow_id(group),
        task_queue=task_queue,
        start_signal="pod_changed",
        start_signal_args=[event],
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE
        if retry
        else WorkflowIDReusePolicy.REJECT_DUPLICATE,
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(sa.POD_NAMESPACE, pod.namespace),
                SearchAttributePair(sa.POD_NAME, pod.name),
                SearchAttributePair(sa.POD_UID, pod.uid),
                SearchAttributePair(sa.PLACEMENT_GROUP, group.name),
                SearchAttributePair(sa.PLACEMENT_PHASE, "Translating"),
            ]
        ),
        static_summary=f"place {group.kind} {group.name} with Slurm" + (" (retry)" if retry else ""),
    )
