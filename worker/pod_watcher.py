"""Pod watcher: Kubernetes pod changes → placement workflows.

List + watch of the pods that name our scheduler through an `Informer`
(clients/informer.py: resumed from the last resourceVersion, re-listed on 410
and, with back-off, after failures).

- An unclaimed unscheduled pod starts its group's placement (or, when the
  group's placement runs already, is signalled to it): the placement's first
  pod travels in the start request, so starting costs no signal.
- A pod claimed by a placement (annotation `slurm-bridge/placement`, written with
  the finalizer) is only ever signalled to that placement; when it is closed the
  pod is left alone (a failed placement waits for `slurm-bridge retry`).
- Only changes a placement acts on are signalled: finished, being deleted, gone,
  changed `slurmjob.slinky.slurm.net/*` annotations.
- The job-id label of claimed pods feeds `LiveJobs`, the list of jobs the job
  watcher asks Slurm about: what it follows comes from Kubernetes, so its cost
  follows the bridge's jobs, not the cluster's.
"""

import logging
from typing import Any, Protocol

from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.kube_reader import KubeReader
from bridge import grouping, keys
from bridge.models import (
    PLACEMENT_ID_PREFIX,
    PlacementRequest,
    PodEvent,
    PodRef,
    installation_of,
    workflow_id_of,
)
from bridge.pod_events import claim_of, job_id_label, pod_event
from clients.informer import EventType, Informer, missing, uid_key
from clients.kube_client import Json, KubeClient, KubeError, api_path
from clients.placements import start_placement
from worker.delivery import LatestPerKey
from worker.job_registry import LiveJobs
from worker.pod_group_waits import PodGroupWaits
from worker.start_admission import StartAdmission
from workflows.placement import PlacementWorkflow

log = logging.getLogger(__name__)
DEFAULT_INSTALLATION = keys.DEFAULT_INSTALLATION
POD_GROUP_NOT_FOUND = "PodGroupNotFound"
# A pod of a group that has fewer pods than its minimum: nothing is submitted until the rest come.
WAITING_FOR_GROUP_MEMBERS = "WaitingForGroupMembers"
START_ATTEMPTS = 5  # start, or join by signal, a placement that may be ending meanwhile


class Tell(Protocol):
    """How a waiting pod is told why: PodScheduled=False and an Event, both with this reason and
    message; a Warning Event unless `warning` is False (waiting that is expected)."""

    async def __call__(self, pod: PodRef, reason: str, message: str, warning: bool = True) -> None: ...


def group_workflow_id(group: grouping.Group, installation: str = DEFAULT_INSTALLATION) -> str:
    """`placement/<installation>/<group key>` (docs/architecture.md, "Placement ids")."""
    return f"{PLACEMENT_ID_PREFIX}{installation}/{group.key}"


def workflow_id(pod: PodRef, installation: str = DEFAULT_INSTALLATION) -> str:
    """The workflow id of a pod placed on its own."""
    return group_workflow_id(solo_group(pod), installation)


def solo_group(pod: PodRef) -> grouping.Group:
    return grouping.Group(
        key=f"{pod.key}/{pod.uid}", kind="Pod", namespace=pod.namespace, name=pod.key, min_pods=1
    )


def wants_placement(event: PodEvent) -> bool:
    return not event.node_name and not event.deleting and not event.terminal


# What a delivery carries: the event, the pod as listed, and whether to start its placement.
Delivery = tuple[PodEvent, Json | None, bool]


class PodWatcher:
    def __init__(
        self,
        kube: KubeClient,
        temporal: Client,
        *,
        task_queue: str,
        scheduler_name: str,
        installation: str = DEFAULT_INSTALLATION,
        jobs: LiveJobs | None = None,
        deletion_slack_seconds: float = 60.0,
        eviction_patience_seconds: float = 300.0,
        tell: Tell | None = None,
        step_heartbeat_seconds: float = 15.0,
        admission: StartAdmission | None = None,
    ) -> None:
        self.kube = kube
        self.tell = tell
        self.temporal = temporal
        self.task_queue = task_queue
        self.scheduler_name = scheduler_name
        self.installation = installation
        self.jobs = jobs if jobs is not None else LiveJobs()
        self.deletion_slack_seconds = deletion_slack_seconds
        self.eviction_patience_seconds = eviction_patience_seconds
        self.step_heartbeat_seconds = step_heartbeat_seconds
        self.starts = 0  # placements started (for the benchmark and metrics)
        self.signals = 0  # pod_changed signals delivered
        self._workflow_of: dict[str, str] = {}  # pod uid → placement workflow id
        self._refs: dict[str, PodRef] = {}
        self._signature: dict[str, tuple[Any, ...]] = {}
        self._job_of: dict[str, int] = {}  # pod uid → the Slurm job its label names
        # And back, job → the uids labelled with it: a pod event looks at its own job's pods
        # only, not at every pod's job (at 10,000 pods a walk of all of them on every event).
        self._pods_of: dict[int, set[str]] = {}
        self._finished: set[str] = set()  # uids of claimed pods that finished
        self._started: set[str] = set()  # uids whose placement was started or joined
        # Unclaimed pods given to each group's placement (workflow id → uids): while fewer than
        # the group's minimum, each is told it waits for the rest.
        self._unclaimed: dict[str, set[str]] = {}
        self._unclaimed_in: dict[str, str] = {}  # uid → the workflow id above
        self._delivery: LatestPerKey[Delivery] = LatestPerKey(self._deliver)
        # Starts go their own way: a start waiting for admission holds up no signal.
        self._starts: LatestPerKey[Delivery] = LatestPerKey(self._deliver)
        self.admission = admission if admission is not None else StartAdmission()
        # Pods whose PodGroup does not exist yet: started when it appears.
        self.pod_group_waits = PodGroupWaits(kube, self._pod_group_appeared)
        self.informer = Informer(
            kube,
            api_path("pods"),
            name="pods",
            field_selector=f"spec.schedulerName={scheduler_name}",
            key=uid_key,
            on_event=self._on_event,
            on_synced=self._on_synced,
        )
        self.synced = self.informer.synced  # set once the first full list has been handled

    async def run(self) -> None:
        await self.informer.run()

    async def close(self) -> None:
        await self.pod_group_waits.close()
        await self._starts.close()
        await self._delivery.close()

    def _on_event(self, kind: EventType, pod: Json) -> None:
        self._observe(pod, gone=kind == "DELETED")

    def _on_synced(self, uids: frozenset[str]) -> None:
        # Pods deleted while we were not watching: tell their workflows.
        for uid in missing(list(self._refs), uids):
            self._observe_gone(self._refs[uid])
        self.jobs.retain(self._job_of.values())

    def _observe(self, pod: Json, *, gone: bool) -> None:
        event = pod_event(pod, gone=gone)
        if gone:
            self._observe_gone(event.pod)
            return
        claim = claim_of(pod)
        if claim is not None and installation_of(claim) != self.installation:
            return  # another bridge installation's pod
        start = claim is None and wants_placement(event)
        uid = event.pod.uid
        if not start and self.pod_group_waits.waiting(uid):
            self.pod_group_waits.forget(uid)  # bound by someone else, finished or being deleted
        if not (start or claim):
            return  # bound by someone else, or finished before we ever saw it
        self._refs[uid] = event.pod
        if claim is not None:
            self._forget_unclaimed(uid)  # its placement took it: no longer waiting for the others
            self._workflow_of[uid] = workflow_id_of(claim)
            self.admission.leave(self._workflow_of[uid])  # it runs its first activity: the next may start
            self._follow_job(uid, pod, claim, finished=event.terminal)
        # Only what a placement acts on is worth a signal (each is a billable action):
        # not the claim, the job label, the binding or the move to Running.
        signature = (event.terminal, event.deleting, event.job_annotations)
        if start:
            if uid in self._started:
                self.pod_group_waits.update(pod)
                return  # its placement has it (in the start request or by signal), or it waits
            self._started.add(uid)
        elif self._signature.get(uid) == signature:
            return
        self._signature[uid] = signature
        (self._starts if start else self._delivery).submit(uid, (event, pod, start))

    def _follow_job(self, uid: str, pod: Json, placement_id: str, *, finished: bool = False) -> None:
        job_id = job_id_label(pod)
        if job_id is None:
            return
        before = self._job_of.get(uid)
        if before is not None and before != job_id:
            self._unlabel(uid, before)  # labelled with another job: that job keeps being followed
        self._job_of[uid] = job_id
        self._pods_of.setdefault(job_id, set()).add(uid)
        if finished:
            self._finished.add(uid)
        if all(other in self._finished for other in self._pods_of[job_id]):
            # Every pod of the job finished: the placement cancels it; nothing to watch for.
            self.jobs.finished(job_id)
        else:
            self.jobs.track(job_id, placement_id)

    def _observe_gone(self, pod: PodRef) -> None:
        self.pod_group_waits.forget(pod.uid)
        self._forget_unclaimed(pod.uid)
        self._refs.pop(pod.uid, None)
        self._signature.pop(pod.uid, None)
        self._started.discard(pod.uid)
        self._finished.discard(pod.uid)
        job_id = self._job_of.pop(pod.uid, None)
        if job_id is not None and not self._unlabel(pod.uid, job_id):
            self.jobs.forget(job_id)
        if pod.uid in self._workflow_of:
            self._delivery.submit(pod.uid, (PodEvent(pod=pod, gone=True), None, False))

    def _unlabel(self, uid: str, job_id: int) -> bool:
        """The pod no longer carries the job's label; whether another pod still does."""
        pods = self._pods_of.get(job_id, set())
        pods.discard(uid)
        if not pods:
            self._pods_of.pop(job_id, None)
        return bool(pods)

    async def _group_of(self, pod: Json, ref: PodRef) -> grouping.Group:
        """The pod's group; PodGroupNotFound when it names a PodGroup that does not exist yet."""
        try:
            return await grouping.resolve(KubeReader(self.kube), pod)
        except grouping.PodGroupNotFound:
            raise  # it waits for its group
        except grouping.GroupError as error:
            # Placed alone, so its translation reports the problem on the pod.
            log.info("pod %s: %s", ref.key, error)
            return solo_group(ref)

    async def _deliver(self, uid: str, item: Delivery) -> None:
        event, pod, start = item
        wid = self._workflow_of.get(uid)
        group = None
        if wid is None and pod is not None and start:
            try:
                group = await self._group_of(pod, event.pod)
            except grouping.PodGroupNotFound as missing:
                await self._wait_for_pod_group(missing, pod, event.pod)
                return
            wid = group_workflow_id(group, self.installation)
        if wid is None:
            return
        if event.gone:
            self._workflow_of.pop(uid, None)
        if start and group is not None:
            await self._start(uid, wid, group, event)
            return
        handle: WorkflowHandle[Any, Any] = self.temporal.get_workflow_handle(wid)
        try:
            await handle.signal(PlacementWorkflow.pod_changed, event)
        except RPCError as error:
            if error.status != RPCStatusCode.NOT_FOUND:
                raise  # retried by the delivery queue
            # No running placement: it finished, or never existed. Nothing to do.
            return
        self.signals += 1

    async def _start(self, uid: str, wid: str, group: grouping.Group, event: PodEvent) -> None:
        """Start the group's placement with this pod (or join it), once admitted."""
        await self.admission.enter(wid)
        if uid not in self._started:
            self.admission.leave(wid)  # the pod went while it waited: nothing to start
            return
        try:
            # Told before its placement hears of it: the condition can never land after a binding.
            await self._tell_if_incomplete(wid, group, event.pod)
            await start_placement_workflow(
                self.temporal,
                event,
                group,
                self.task_queue,
                installation=self.installation,
                deletion_slack_seconds=self.deletion_slack_seconds,
                eviction_patience_seconds=self.eviction_patience_seconds,
                step_heartbeat_seconds=self.step_heartbeat_seconds,
            )
        except BaseException:
            self.admission.leave(wid)  # tried again later as a start, in turn
            raise
        # Only once started: a failed start is retried as a start, not as a signal.
        self._workflow_of[uid] = wid
        self.starts += 1

    async def _tell_if_incomplete(self, wid: str, group: grouping.Group, ref: PodRef) -> None:
        """A pod that joins a group still short of its minimum is told it waits for the rest, as
        kube-scheduler's coscheduling tells a pod without enough siblings (best effort)."""
        if group.min_pods <= 1:
            return
        unclaimed = self._unclaimed.setdefault(wid, set())
        unclaimed.add(ref.uid)
        self._unclaimed_in[ref.uid] = wid
        if len(unclaimed) >= group.min_pods or self.tell is None:
            return
        message = (
            f"waiting for the other pods of {group.kind} {group.namespace}/{group.name}: its Slurm job "
            f"is submitted once {group.min_pods} of its pods exist; {len(unclaimed)} did when this pod came"
        )
        try:
            await self.tell(ref, WAITING_FOR_GROUP_MEMBERS, message, warning=False)
        except KubeError as error:
            log.info("pod %s: not told it waits for its group: %s", ref.key, error)

    def _forget_unclaimed(self, uid: str) -> None:
        wid = self._unclaimed_in.pop(uid, None)
        if wid is None:
            return
        unclaimed = self._unclaimed[wid]
        unclaimed.discard(uid)
        if not unclaimed:
            del self._unclaimed[wid]

    async def _wait_for_pod_group(self, missing: grouping.PodGroupNotFound, pod: Json, ref: PodRef) -> None:
        """Not placed alone: the pod waits, told why, until its PodGroup is created."""
        if self.pod_group_waits.add(missing.kind, missing.namespace, missing.name, pod):
            log.info("pod %s waits: %s", ref.key, missing)
            if self.tell is not None:
                await self.tell(ref, POD_GROUP_NOT_FOUND, str(missing))
        await self.pod_group_waits.recheck(missing.kind, missing.namespace, missing.name)

    def _pod_group_appeared(self, pods: list[Json]) -> None:
        for pod in pods:
            event = pod_event(pod, gone=False)
            self._starts.submit(event.pod.uid, (event, pod, True))


async def start_placement_workflow(
    temporal: Client,
    event: PodEvent,
    group: grouping.Group,
    task_queue: str,
    *,
    installation: str = DEFAULT_INSTALLATION,
    deletion_slack_seconds: float = 60.0,
    eviction_patience_seconds: float = 300.0,
    step_heartbeat_seconds: float = 15.0,
    generation: str | None = None,
    members: list[PodEvent] | None = None,
    retry: bool = False,
) -> WorkflowHandle[Any, Any]:
    """Start the group's placement with this pod, or signal the pod to it if it runs already.

    The first pod travels in the request (no start signal: one action less). A
    closed placement of the same group may be followed by a new one: its pods
    are new (claimed pods are never started again), so it is the group's next
    generation. `slurm-bridge retry` passes retry=True, the failed generation
    and all its pods: the new run first looks for a job that generation left.
    """
    pod = event.pod
    events = members or [event]
    wid = group_workflow_id(group, installation)
    request = PlacementRequest(
        group=group.name,
        namespace=pod.namespace,
        pods=[e.pod for e in events],
        kind=group.kind,
        min_pods=group.min_pods,
        installation=installation,
        generation=generation or pod.uid,
        recovery=retry,
        deletion_slack_seconds=deletion_slack_seconds,
        eviction_patience_seconds=eviction_patience_seconds,
        step_heartbeat_seconds=step_heartbeat_seconds,
        events=events,
    )
    for _ in range(START_ATTEMPTS):
        try:
            return await start_placement(
                temporal,
                wid,
                request,
                task_queue=task_queue,
                summary=f"place {group.kind} {group.name} with Slurm" + (" (retry)" if retry else ""),
                pod=pod,
            )
        except WorkflowAlreadyStartedError:
            pass
        # The group's placement runs: this pod joins it (or is told it is too late).
        handle: WorkflowHandle[Any, Any] = temporal.get_workflow_handle(wid)
        try:
            for member in events:
                await handle.signal(PlacementWorkflow.pod_changed, member)
        except RPCError as error:
            if error.status != RPCStatusCode.NOT_FOUND:
                raise
            # It ended between the start and the signal (a restarted group's last placement
            # cleaning up): these pods open the next generation, so start again.
            log.info("placement %s ended before %s could join it; starting it again", wid, pod.key)
            continue
        return handle
    # Raised to the delivery queue, which tries again later.
    raise RuntimeError(f"placement {wid} kept ending while {pod.key} was joining it")
