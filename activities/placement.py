"""The three steps of a placement, each one Temporal activity.

A placement used to run a dozen small activities; each one is a billable
action and three history events. These fold them by what happens together:

- prepare_and_submit: finalizer + placement annotation → translate → submit →
  label with the job id → Event (an adopted job is read as well: it may run);
- bind: read the job afresh (and the pods beside it) → map Slurm nodes → pods/binding
  carrying the node annotation (a patch first only when the pod lacks the managed-node
  toleration) → Event;
- release: condition and Event → cancel the job or remove the pods → finalizer.

Every step is idempotent, so an attempt after a crash repeats nothing that
was done: patches are compare-and-swap or set a value, a binding to the same
node is accepted, and submission adopts the job carrying this placement's id
whenever the attempt may follow an earlier one (docs/architecture.md).

Its size (about 650 lines) is three steps and their shared pod writes; the Kubernetes and
Slurm requests themselves are activities/kube.py's and activities/slurm.py's.
"""

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.dra import DeviceClaims
from activities.errors import classified, waits_for_slurm
from activities.kube import BOUND_ELSEWHERE, INVALID_POD, UNPROCESSABLE, KubeActivities, now
from activities.node_source import (
    ListedNodes,
    NodeSource,
    PerSnapshot,
    SlurmNodeNames,
    kubernetes_node_names,
    with_departed_nodes,
)
from activities.pod_group_status import set_scheduled
from activities.slurm import SlurmActivities
from bridge import hostlist, keys
from bridge.components import component_summary
from bridge.device_classes import DEFAULT_DEVICE_CLASSES, DeviceClasses
from bridge.feasibility import FeasibilityByRules, excluded_slurm_nodes
from bridge.models import (
    ENDED_JOB_STATES,
    BindInput,
    BindResult,
    CheckJobInput,
    JobDescription,
    JobEvent,
    PodRef,
    Prepared,
    PrepareInput,
    ReleaseInput,
    ReportPendingInput,
    SlurmUnavailableInput,
    SubmitResult,
    TellPodsInput,
    UpdatePendingJobInput,
)
from bridge.pod_events import job_annotations, job_id_label
from bridge.resources import total_allocatable
from bridge.slurm_jobs import job_event_of, placement_of
from bridge.tolerations import managed_node_toleration, tolerates_managed_nodes
from bridge.translate import sizing_note
from clients.kube_client import Json, KubeConflict, KubeError, KubeNotFound, api_path
from clients.slurm_errors import SlurmNotFound, SlurmRejected
from clients.slurm_health import SlurmHealth

# Temporal's activity logger: each line carries the workflow and activity ids.
log = activity.logger
TOO_MANY_REQUESTS = 429  # what an eviction a PodDisruptionBudget forbids answers
INVALID_NODE_NAME = 2018  # Slurm: "Invalid node name specified"
CAS_ATTEMPTS = 5  # a pod edited by others this often in a row: let the activity retry later
# Normal Event: the group's pods ask for different amounts and every node is sized by the largest.
SIZED_BY_LARGEST_POD = "SizedByLargestPod"


class PlacementActivities:
    def __init__(
        self,
        kube: KubeActivities,
        slurm: SlurmActivities,
        nodes: NodeSource | None = None,
        slurm_health: SlurmHealth | None = None,
        honoured: DeviceClasses = DEFAULT_DEVICE_CLASSES,
    ) -> None:
        self.kube = kube
        self.slurm = slurm
        # The worker's watched cache of the bridge's nodes; listed on each use without one.
        self.nodes = nodes or ListedNodes(kube.kube, kube.settings.scheduler_name)
        # Worked out once per state of the nodes (PerSnapshot), not once per submission.
        self.capacity = PerSnapshot(total_allocatable)
        self.node_rules = PerSnapshot(FeasibilityByRules)
        # DRA_DEVICE_CLASSES: the claims name the GRES indexes or cores each class maps to.
        self.claims = DeviceClaims(kube.kube, slurm.slurm, honoured)
        # The worker's Slurm-health gate: with it, a step that finds Slurm away fails at once
        # as SlurmUnavailable and its placement waits for the gate (activities/errors.py).
        self.slurm_health = slurm_health

    # -- prepare and submit ----------------------------------------------------

    @activity.defn(name="prepare_and_submit")
    @waits_for_slurm
    @classified
    async def prepare_and_submit(self, given: PrepareInput) -> Prepared:
        """Claim the pods, translate them, submit (or adopt) the job and label the pods with it."""
        request = given.request
        pods: list[Json] = []
        for ref in request.pods:
            pod = await self._claim(ref, given.placement_id)
            if pod is None:
                if given.recovery or activity.info().attempt > 1:
                    # An earlier run or attempt may have submitted before the pods went away.
                    for job_id in await self.slurm.live_jobs_of(given.placement_id, given.since):
                        log.info(
                            "cancelling Slurm job %s: its pods are gone", job_id, extra={"job_id": job_id}
                        )
                        await self.slurm.cancel_job(job_id)
                await self._unclaim(request.pods)
                return Prepared(
                    submitted=False, pods=request.pods, detail=f"pod {ref.key} is gone or finished"
                )
            pods.append(pod)

        pods, group = await self.kube.resolve_group(pods)
        parts = self.kube.job_parts(pods, group)
        # No bridge node at all (none labelled, and node sync has marked no namesake of a Slurm
        # node yet): nothing to filter with, Slurm alone decides. Each part (a heterogeneous
        # job's component) must find a node its pods may run on.
        nodes = await self._bridge_nodes()
        checks = [self.node_rules.of(nodes).of(part) for part in parts]
        summary = next((check.summary for check in checks if check.summary is not None), None)
        # Pods bound already (a reset or adopted placement whose job runs) are pinned by their
        # nodeName, each to its own node: no node passes a group's rules any more, and none
        # needs to, since the job they run under is adopted below, not submitted.
        adopting = all((pod.get("spec") or {}).get("nodeName") for pod in pods)
        if nodes and summary is not None and not adopting:
            if summary != given.reported:
                await self._tell_no_node_fits(request.pods, pods[0], summary)
            return Prepared(submitted=False, pods=request.pods, unschedulable=summary)
        job = self.kube.build_job(
            request,
            group,
            [(part, excluded_slurm_nodes(check)) for part, check in zip(parts, checks, strict=True)],
            # Judged at submission only: a job already accepted is not refused later.
            capacity=self.capacity.of(nodes) if nodes else None,
        )
        recovery = given.recovery or activity.info().attempt > 1
        submitted = await self._submit(job, given.placement_id, since=given.since, recovery=recovery)
        by_key = {ref.key: ref for ref in request.pods}
        ordered = [by_key[key] for key in job.pod_keys if key in by_key]
        verb = "submitted" if submitted.created else "adopted (it already existed)"
        offsets = {key: offset for offset, c in enumerate(job.components) for key in c.pod_keys}
        message = f"Slurm job {submitted.job_id} {verb} in partition {job.partition}"
        if job.components:
            message += (
                f", as a heterogeneous job of {component_summary([len(c.pod_keys) for c in job.components])}"
            )
        # Where the pods ask for different amounts, each is told what it is given instead.
        note = sizing_note(pods, job, f"Slurm job {submitted.job_id}")
        notes = [
            self.kube._event(
                ref,
                SIZED_BY_LARGEST_POD,
                note,
                False,
                name=told_once(ref, given.placement_id, SIZED_BY_LARGEST_POD),
            )
            for ref in ordered
            if note
        ]
        # Nothing orders the labels, the Events and an adopted job's read: sent together,
        # the step takes one round trip instead of several (any failure fails the attempt,
        # and each of them is safe to repeat).
        read, _, _ = await asyncio.gather(
            self._adopted_job(submitted),
            asyncio.gather(
                *(self._patch(ref, job_labels(submitted.job_id, offsets.get(ref.key))) for ref in ordered)
            ),
            asyncio.gather(
                *(self.kube._event(ref, "SlurmJobSubmitted", message, False) for ref in ordered), *notes
            ),
        )
        return Prepared(
            submitted=True,
            pods=ordered,
            job_id=submitted.job_id,
            partition=job.partition,
            created=submitted.created,
            components=len(job.components) or 1,
            job=read,
            annotations={pod["metadata"]["uid"]: job_annotations(pod) for pod in pods},
        )

    async def _adopted_job(self, submitted: SubmitResult) -> JobEvent | None:
        """An adopted job as it is now; None for a job just created (the job watcher reports it).

        slurmctld starts a job in a scheduling pass, never inside the submission (its log
        shows every start on the main scheduler's tick or in a backfill pass), so a read
        right after submitting finds the job pending, and its reason (usually Priority,
        for the moment before the next pass) is no news: a Slurm request for nothing on
        every placement. An adopted job may be running already, and the job watcher, which
        tells each placement only what changed, may have told an earlier run of this
        workflow id about it: that one is read, reason included.
        """
        if submitted.created:
            return None
        return await self._read_job(submitted.job_id)

    async def _bridge_nodes(self) -> Sequence[Json]:
        return await self.nodes.bridge_nodes()

    async def _submit(
        self, job: JobDescription, placement_id: str, *, since: int, recovery: bool
    ) -> SubmitResult:
        """Submit; an exclusion naming a node Slurm does not know (not registered yet) is dropped."""
        try:
            return await self.slurm.submit_once(job, placement_id, since=since, recovery=recovery)
        except ApplicationError as error:
            rejected = error.__cause__
            unknown_node = isinstance(rejected, SlurmRejected) and INVALID_NODE_NAME in rejected.error_numbers
            if not (unknown_node and job.excluded_nodes):
                raise
        # One listing of Slurm's nodes, not a read per excluded name (999 for a pinned pod).
        in_slurm = await SlurmNodeNames(self.slurm.slurm).names()
        known = [name for name in job.excluded_nodes if name in in_slurm]
        log.info("excluded nodes unknown to Slurm dropped: %s", sorted(set(job.excluded_nodes) - set(known)))
        job = job.model_copy(update={"excluded_nodes": known or None})
        return await self.slurm.submit_once(job, placement_id, since=since, recovery=recovery)

    async def _claim(self, ref: PodRef, placement_id: str) -> Json | None:
        """Finalizer and placement annotation in one write; None if the pod is not placeable.

        A strategic-merge patch adds the bridge's entry to the finalizers on the server,
        so nothing is read first: the pod the patch returns says whether it can be placed
        (being deleted or finished: the caller takes the finalizer out again). A pod being
        deleted refuses a finalizer it does not have yet (422): not placeable either.
        """
        patch = {
            "metadata": {
                "finalizers": [keys.FINALIZER],
                "annotations": {keys.ANNOTATION_PLACEMENT: placement_id},
            }
        }
        try:
            pod = await self.kube.patch_if_present(ref, patch, strategic=True)
        except KubeError as error:
            if error.status != UNPROCESSABLE:
                raise  # a 409 for the pod itself among them: the step's next attempt claims it
            # A pod being deleted refuses a new finalizer; any other refusal fails the step.
            current = await self.kube.read_pod(ref)
            if current is None or not _placeable(current):
                return None
            raise
        return pod if pod is not None and _placeable(pod) else None

    async def _unclaim(self, pods: list[PodRef]) -> None:
        await self.kube.remove_finalizer(pods)

    # -- bind --------------------------------------------------------------------

    @activity.defn(name="bind")
    @waits_for_slurm
    @classified
    async def bind(self, given: BindInput) -> BindResult:
        """Bind pod i to allocated node i, if the job is (still) running; the job as read decides."""
        # The job decides; the pods are read beside it (bind is called once the job was seen
        # running, so the reads are rarely wasted) and bound from these reads.
        job, reads = await asyncio.gather(
            self._read_job(given.job_id, given.placement_id),
            asyncio.gather(*(self.kube.read_pod(ref) for ref in given.pods)),
        )
        if not job.running or len(job.nodes) < len(given.pods):
            return _bound_before(job, given.pods, reads)
        slurm_nodes = job.nodes[: len(given.pods)]
        nodes = await kubernetes_node_names(self.kube.kube, self.nodes, slurm_nodes)
        leaving = await self._leaving(nodes, given.job_id)
        if leaving and not given.force:
            # Slurm hands a node on the moment a job ends; its pods may still be stopping.
            grace = max(
                float((p.get("spec") or {}).get("terminationGracePeriodSeconds") or 30) for p in leaving
            )
            return BindResult(job=job, waiting_for=sorted(_key(p) for p in leaving), grace_seconds=grace)
        # DRA pods: their claims name the devices Slurm chose; all are worked out before any binding.
        pods = [(ref, pod) for ref, pod in zip(given.pods, reads, strict=True) if pod is not None]
        present = {ref.uid for ref, _ in pods}
        alive = [
            (ref, s, n)
            for ref, s, n in zip(given.pods, slurm_nodes, nodes, strict=True)
            if ref.uid in present
        ]
        try:
            pinned = await self.claims.pin_all(
                pods, given.job_id, [s for _, s, _ in alive], [n for _, _, n in alive]
            )
        except SlurmRejected:
            job = await self._read_job(given.job_id)
            if not job.running:
                return BindResult(job=job)  # it ended meanwhile: Slurm has no layout for it any more
            raise
        claims = []
        for claim in pinned:
            name = await self.claims.write(claim)
            claims.append(f"{claim.ref.namespace}/{name}")
            log.info("pod %s: ResourceClaim %s pins Slurm's devices", claim.ref.key, name)
        # A pod read above is bound from that read, unless its claim was just written (it changed).
        as_read = {ref.uid: pod for ref, pod in pods if ref.uid not in {c.ref.uid for c in pinned}}
        scheduler = given.scheduler_name or self.kube.settings.scheduler_name
        bound = await asyncio.gather(
            *(
                self._bind(ref, node, scheduler, as_read.get(ref.uid))
                for ref, node in zip(given.pods, nodes, strict=True)
            )
        )
        read = [pod for pod in bound if pod is not None]
        message = f"Slurm job {job.job_id} allocated {', '.join(slurm_nodes)}; bound to {', '.join(nodes)}"
        if leaving:
            message += f", although {', '.join(sorted(_key(p) for p in leaving))} had not stopped in time"
        await asyncio.gather(
            *(self.kube._event(ref, "Bound", message, bool(leaving)) for ref in given.pods),
            *([set_scheduled(self.kube.kube, read[0], True, message, stamp=now())] if read else []),
        )
        return BindResult(job=job, slurm_nodes=slurm_nodes, nodes=nodes, claims=claims)

    async def _leaving(self, nodes: list[str], job_id: int) -> list[Json]:
        """Pods on these nodes of another bridge job that is over, not yet stopped: they hold the node."""
        others: list[Json] = []
        for node in sorted(set(nodes)):
            # resourceVersion=0: from the API server's watch cache, which indexes pods by node
            # (as the kubelet lists its pods). Without it the list is a consistent read, which
            # kube-apiserver answers by reading every pod from etcd: at 10,000 pods the bind's
            # slowest part. A cache a moment old is enough: a pod that holds the node has been
            # bound there for a while, and a stale phase only makes the bind wait.
            listed = await self.kube.kube.request(
                "GET",
                api_path("pods"),
                query={
                    "fieldSelector": f"spec.nodeName={node}",
                    "labelSelector": keys.LABEL_SLURM_JOB_ID,
                    "resourceVersion": "0",
                },
            )
            others += [
                pod
                for pod in listed.get("items", [])
                if job_id_label(pod) not in (None, job_id)
                and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            ]
        if not others:
            return []
        ids = {job_id_label(pod) for pod in others} - {None}
        states = await self.slurm.slurm.job_states([i for i in ids if i is not None])
        # A job Slurm still runs shares the node by Slurm's own decision; an ended or forgotten one does not.
        return [pod for pod in others if not _running(states.get(job_id_label(pod) or 0))]

    async def _bind(
        self, ref: PodRef, node: str, scheduler_name: str, read: Json | None = None
    ) -> Json | None:
        """Bind the pod to the node (from `read` if given); the pod as read (None when it went away)."""
        for _ in range(CAS_ATTEMPTS):
            pod, read = read or await self.kube.read_pod(ref), None
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                return None  # the workflow learns of it from the pod watcher
            spec, meta = pod.get("spec") or {}, pod["metadata"]
            current = spec.get("nodeName")
            if current:
                if current == node:
                    return pod  # an earlier attempt got there
                raise ApplicationError(
                    f"pod {ref.key} is already bound to {current}, not to the allocated node {node}",
                    type=BOUND_ELSEWHERE,
                    non_retryable=True,
                )
            binding: Json = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            }
            # Node sync taints bridge nodes NoExecute; without the toleration the taint
            # manager would evict the pod right after binding (the webhook is optional).
            tolerations = list(spec.get("tolerations") or [])
            if any(tolerates_managed_nodes(t, scheduler_name) for t in tolerations):
                # The usual case (the webhook added it): the API server copies a Binding's
                # annotations onto the pod with the node, in one write, and the resourceVersion
                # precondition makes it the same compare-and-swap as a patch would be.
                binding["metadata"]["resourceVersion"] = meta["resourceVersion"]
                binding["metadata"]["annotations"] = {keys.ANNOTATION_SLURM_NODE: node}
            else:
                patch: Json = {
                    "metadata": {
                        "resourceVersion": meta["resourceVersion"],
                        "annotations": {keys.ANNOTATION_SLURM_NODE: node},
                    },
                    "spec": {"tolerations": [*tolerations, managed_node_toleration(scheduler_name)]},
                }
                try:
                    await self.kube._patch_pod(ref, patch)
                except KubeNotFound:
                    return None
                except KubeConflict:
                    continue
            try:
                await self.kube.kube.request(
                    "POST",
                    api_path("pods", namespace=ref.namespace, name=ref.name, subresource="binding"),
                    body=binding,
                )
            except KubeNotFound:
                return None
            except KubeConflict:
                continue  # changed or bound meanwhile (an earlier attempt, another replica): read again
            return pod
        raise KubeConflict(409, "Conflict", f"pod {ref.key} kept changing while it was bound")

    # -- release -----------------------------------------------------------------

    @activity.defn(name="release")
    @waits_for_slurm
    @classified
    async def release(self, given: ReleaseInput) -> list[str]:
        """Tell the pods why, give back the Slurm job or the pods, then drop the finalizer.

        Returns the pods a PodDisruptionBudget kept from being evicted ("ns/name");
        the workflow tries again later, and deletes them once its patience is spent.
        """
        if given.condition:
            await self.kube.set_unschedulable(given.pods, given.reason, given.message)
        if given.cancel_job and given.job_id is not None:
            await self.slurm.cancel_job(given.job_id)
        blocked = []
        if given.remove_pods:
            for ref in given.pods:
                if not await self._evict(ref, given.reason, given.message, force=given.force_delete):
                    blocked.append(ref.key)
        else:
            await self.kube.record_event(given.pods, given.reason, given.message, given.warning)
        # The claims pinned Slurm's devices to the pods; the job no longer holds them. A placement
        # that wrote none (no DRA pod, or never bound) has none to look for.
        if given.claims:
            for name in await self.claims.delete_for(given.pods):
                log.info("ResourceClaim %s deleted", name)
        await self.kube.remove_finalizer(given.pods)
        return blocked

    async def _evict(self, ref: PodRef, reason: str, message: str, *, force: bool) -> bool:
        """Evict the pod (grace period and budgets honoured), saying why; False while a budget blocks it."""
        pod = await self.kube.read_pod(ref)
        if pod is None:
            return True
        conditions = (pod.get("status") or {}).get("conditions") or []
        told = any(c.get("type") == keys.CONDITION_SLURM_JOB_ENDED for c in conditions)
        if not told:
            # The bridge's reason, in a condition of its own: eviction overwrites DisruptionTarget.
            condition = {
                "type": keys.CONDITION_SLURM_JOB_ENDED,
                "status": "True",
                "reason": reason,
                "message": message[:1024],
                "lastTransitionTime": now(),
            }
            await self._patch(ref, {"status": {"conditions": [condition]}}, subresource="status")
            await self.kube._event(ref, reason, message, True)
        if pod["metadata"].get("deletionTimestamp"):
            return True  # already going
        path = api_path("pods", namespace=ref.namespace, name=ref.name)
        try:
            if force:
                await self.kube._event(
                    ref,
                    "DisruptionBudgetOverridden",
                    "a PodDisruptionBudget blocked the eviction longer than the bridge waits; deleting",
                    True,
                )
                body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": ref.uid}}
                await self.kube.kube.request("DELETE", path, body=body)
                return True
            eviction = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": ref.name, "namespace": ref.namespace},
                "deleteOptions": {"preconditions": {"uid": ref.uid}},
            }
            await self.kube.kube.request("POST", f"{path}/eviction", body=eviction)
        except KubeNotFound:
            return True
        except KubeConflict:
            # The uid precondition failed (a namesake: ours is gone), or a 409 for the pod itself.
            if await self.kube.read_pod(ref) is not None:
                raise
            return True
        except KubeError as error:
            if error.status == TOO_MANY_REQUESTS:
                return False  # a PodDisruptionBudget says not now
            raise
        return True

    # -- smaller steps -----------------------------------------------------------

    @activity.defn(name="report_pending")
    @classified
    async def report_pending(self, given: ReportPendingInput) -> None:
        """Why the pods wait (Slurm's pending reason, or the bridge's): PodScheduled=False and an Event."""
        pods, reason = given.pods, given.reason
        event_reason = reason if given.message else "SlurmJobPending"  # message "": Slurm's own reason
        message = given.message or f"Slurm job {given.job_id} is pending: {reason}"
        await self.kube.set_unschedulable(pods, reason, message)
        await self.kube.record_event(pods, event_reason, message, False)
        if event_reason == "SlurmJobPending" and pods and (pod := await self.kube.read_pod(pods[0])):
            await set_scheduled(self.kube.kube, pod, False, message, stamp=now())

    @activity.defn(name="update_pending_job")
    @waits_for_slurm
    @classified
    async def update_pending_job(self, given: UpdatePendingJobInput) -> dict[str, str]:
        """The annotations or the nodes changed while Slurm still waits: update the job.

        Returns the annotations the job now reflects; a refusal is told on the pods
        and keeps the job as it was (the placement goes on). When no node passes the
        pods' rules any more, the job stays pending with every node excluded and the
        pods are told why, as when none fitted at submission.
        """
        request, job_id = given.request, given.job_id
        pods = [pod for ref in request.pods if (pod := await self.kube.read_pod(ref)) is not None]
        annotations = {pod["metadata"]["uid"]: job_annotations(pod) for pod in pods}
        if len(pods) < len(request.pods):
            return annotations  # a pod is gone: the workflow ends the placement anyway
        try:
            pods, group = await self.kube.resolve_group(pods)
            parts = self.kube.job_parts(pods, group)
            nodes = await self._bridge_nodes()
            checks = [self.node_rules.of(nodes).of(part) for part in parts]
            current = await self.slurm.slurm.get_job_components(job_id)
            if len(current) != len(parts):
                raise ApplicationError(
                    f"the pods now make {len(parts)} job component(s) where the job has {len(current)}; "
                    "a submitted job's components cannot change (the pods' next placement takes it)",
                    type=INVALID_POD,
                    non_retryable=True,
                )
            excluded = [
                await with_departed_nodes(
                    SlurmNodeNames(self.slurm.slurm),
                    excluded_slurm_nodes(check),
                    hostlist.expand(component.excluded_nodes or ""),
                    nodes,
                )
                for check, component in zip(checks, current, strict=True)
            ]
            job = self.kube.build_job(request, group, list(zip(parts, excluded, strict=True)))
            # Each component is its own job to update: the leader's id plus its offset.
            for offset, component in enumerate(job.components or [job]):
                await self.slurm.update_job(job_id + offset, component)
        except ApplicationError as error:
            if not error.non_retryable:
                raise
            await self.kube.record_event(
                request.pods,
                "SlurmJobUpdateFailed",
                f"Slurm job {job_id} kept as it was: {error.message}",
                True,
            )
            return annotations
        message = f"Slurm job {job_id} updated: the pods' annotations or usable nodes changed"
        await self.kube.record_event(request.pods, "SlurmJobUpdated", message, False)
        summary = next((check.summary for check in checks if check.summary is not None), None)
        if nodes and summary is not None:
            await self._tell_no_node_fits(request.pods, pods[0], summary)
        elif any(_scheduled_reason(pod) == "Unschedulable" for pod in pods):
            await self._tell_a_node_fits_again(request.pods, pods[0], job_id)
        return annotations

    async def _tell_no_node_fits(self, refs: list[PodRef], pod: Json, summary: str) -> None:
        """kube-scheduler's word when no node passes the pods' rules: PodScheduled=False and an Event."""
        await self.kube.set_unschedulable(refs, "Unschedulable", summary)
        await self.kube.record_event(refs, "FailedScheduling", summary, True)
        await set_scheduled(self.kube.kube, pod, False, summary, stamp=now())

    async def _tell_a_node_fits_again(self, refs: list[PodRef], pod: Json, job_id: int) -> None:
        """Replace the no-node-fits condition: left, it would outlive its truth for as long as
        Slurm's pending reason stays the one already reported (nothing else rewrites it)."""
        message = f"Slurm job {job_id} is pending: a node passes the pods' node rules again"
        await self.kube.set_unschedulable(refs, "SlurmJobPending", message)
        await set_scheduled(self.kube.kube, pod, False, message, stamp=now())

    @activity.defn(name="check_job")
    @waits_for_slurm
    @classified
    async def check_job(self, given: CheckJobInput) -> JobEvent:
        """The safety re-check: Slurm's word on the job, when no signal came for long."""
        return await self._read_job(given.job_id)

    @activity.defn(name="report_slurm_unavailable")
    @classified
    async def report_slurm_unavailable(self, given: SlurmUnavailableInput) -> None:
        """Why the pods wait on Slurm (away, or taking no new job): a Warning Event, and
        PodScheduled=False if not bound."""
        if given.condition:
            await self.kube.set_unschedulable(given.pods, given.reason, given.message)
        await self.kube.record_event(given.pods, given.reason, given.message, True)

    @activity.defn(name="tell_pods")
    @classified
    async def tell_pods(self, given: TellPodsInput) -> None:
        """An Event on each pod: a stuck step, late pods, changes that come too late."""
        await self.kube.record_event(given.pods, given.reason, given.message, given.warning)

    async def _read_job(self, job_id: int, placement_id: str = "") -> JobEvent:
        """The job as Slurm has it now; gone when Slurm does not know it, or (given a placement
        id) when the id names another job: Slurm's state was wiped and the id handed out again.

        The job watcher tells a placement that its job started from the state probe alone
        when it never read the job (it started within the pending grace), so this read, the
        one the bind step makes anyway, is where the job's comment is checked.
        """
        try:
            # Every component of a heterogeneous job (one for an ordinary job), leader first.
            components = await self.slurm.slurm.get_job_components(job_id)
        except SlurmNotFound:
            return JobEvent(job_id=job_id, states=[], gone=True)
        if placement_id and (comment := placement_of(components[0])) != placement_id:
            log.warning(
                "Slurm job %s belongs to %s, not to placement %s: taken as gone",
                job_id,
                comment or "no placement",
                placement_id,
                extra={"job_id": job_id},
            )
            return JobEvent(job_id=job_id, states=[], gone=True)
        return job_event_of(components)

    async def _patch(self, ref: PodRef, patch: Json, *, subresource: str | None = None) -> None:
        if not await self.kube.patch_if_present(ref, patch, subresource=subresource):
            log.info("pod %s gone before it could be updated", ref.key)

    def all(self) -> list[Callable[..., Awaitable[Any]]]:
        return [
            self.prepare_and_submit,
            self.bind,
            self.release,
            self.report_pending,
            self.update_pending_job,
            self.check_job,
            self.tell_pods,
            self.report_slurm_unavailable,
        ]


def job_labels(job_id: int, offset: int | None) -> Json:
    """The pod's job-id label, and its component's offset when the job is heterogeneous."""
    labels = {keys.LABEL_SLURM_JOB_ID: str(job_id)}
    if offset is not None:
        labels[keys.LABEL_HET_JOB_OFFSET] = str(offset)
    return {"metadata": {"labels": labels}}


def told_once(ref: PodRef, placement_id: str, reason: str) -> str:
    """The name of an Event told once per placement: the same on every attempt of its step, so a
    repeated step finds it there; another placement (the group's next generation) tells again."""
    digest = hashlib.sha256(f"{placement_id}/{ref.uid}/{reason}".encode()).hexdigest()[:16]
    # An Event's name is a DNS subdomain of at most 253 characters, as a pod's is.
    return f"{ref.name[:200].rstrip('.-')}.{digest}"


def _key(pod: Json) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def _scheduled_reason(pod: Json) -> str | None:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c.get("reason") for c in conditions if c.get("type") == keys.CONDITION_POD_SCHEDULED), None)


def _running(states: list[str] | None) -> bool:
    return bool(states) and not ENDED_JOB_STATES.intersection(states or [])


def _placeable(pod: Json) -> bool:
    """Neither being deleted nor finished."""
    status = pod.get("status") or {}
    return not pod["metadata"].get("deletionTimestamp") and status.get("phase") not in ("Succeeded", "Failed")


def _bound_before(job: JobEvent, refs: list[PodRef], reads: Sequence[Json | None]) -> BindResult:
    """The bind step's answer when the job does not (or no longer) run: not bound, unless an
    earlier attempt of this step bound the pods before the job ended.

    A local attempt can bind and still time out (an Event write hanging while the API server
    shuts down); the retry then finds the job over. Reporting those pods unbound would fail the
    placement as "never placed" and leave them running without an allocation; reported bound,
    the placement follows the job's end and evicts them with its reason.
    """
    bound = [(pod.get("spec") or {}).get("nodeName") if pod is not None else None for pod in reads]
    if not any(bound):
        return BindResult(job=job)
    log.info(
        "pods %s were bound by an earlier attempt; Slurm job %s is %s",
        [r.key for r in refs],
        job.job_id,
        job.summary,
    )
    return BindResult(
        job=job, slurm_nodes=list(job.nodes[: len(refs)]), nodes=[str(node or "") for node in bound]
    )
