"""Kubernetes side effects of a placement, as Temporal activities.

Every write is idempotent (a retried or replayed activity changes nothing the
second time) and checks the pod's UID, so a pod deleted and re-created under
the same name is never touched by the old placement.
"""

import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.kube_client import (
    MERGE_PATCH,
    Json,
    KubeClient,
    KubeConflict,
    KubeError,
    KubeNotFound,
    api_path,
)
from activities.kube_reader import KubeReader
from activities.node_source import NODE_NOT_FOUND as NODE_NOT_FOUND  # the v1 workflow's import
from activities.node_source import ListedNodes, kubernetes_node_names
from bridge import grouping, keys
from bridge.models import JobDescription, PlacementRequest, PodRef
from bridge.policy import PolicyFile
from bridge.resources import Capacity
from bridge.translate import Defaults, GroupShape, TranslationError, build_job

# Temporal's activity logger: each line carries the workflow and activity ids.
log = activity.logger
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
UNPROCESSABLE = 422  # Invalid: what kube-apiserver answers a write that fails validation

# ApplicationError types the workflow's retry policies treat as final.
INVALID_POD = "InvalidPod"
POD_GONE = "PodGone"
BOUND_ELSEWHERE = "BoundElsewhere"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class KubeSettings:
    scheduler_name: str = keys.DEFAULT_SCHEDULER_NAME
    defaults: Defaults = field(default_factory=Defaults)
    # The tenant policy (TENANT_POLICY_FILE), re-read when the file changes.
    policy: PolicyFile = field(default_factory=PolicyFile)


class KubeActivities:
    def __init__(self, kube: KubeClient, settings: KubeSettings) -> None:
        self.kube = kube
        self.settings = settings
        self.instance = socket.gethostname()

    # -- reading -----------------------------------------------------------

    async def read_pod(self, ref: PodRef) -> Json | None:
        """The pod, or None when it is gone (or replaced by a namesake)."""
        try:
            pod = await self.kube.request("GET", api_path("pods", namespace=ref.namespace, name=ref.name))
        except KubeNotFound:
            return None
        return pod if pod.get("metadata", {}).get("uid") == ref.uid else None

    async def _patch_pod(
        self, ref: PodRef, patch: Json, *, subresource: str | None = None, strategic: bool = False
    ) -> Json:
        """The pod as the patch left it (the API server answers with it).

        The patch carries the pod's uid, so it never touches a namesake (a pod of the same
        name created after ours was deleted): kube-apiserver builds the patched object and
        refuses to change its uid, an immutable field (422 Invalid). That is raised as the
        KubeConflict a uid precondition gives elsewhere (a deletion's, a Binding's), so every
        caller tells a namesake from its pod the same way: it reads the pod again.
        """
        path = api_path("pods", namespace=ref.namespace, name=ref.name, subresource=subresource)
        body = {**patch, "metadata": {**patch.get("metadata", {}), "uid": ref.uid}}
        content = STRATEGIC_MERGE if strategic or subresource == "status" else MERGE_PATCH
        try:
            return await self.kube.request("PATCH", path, body=body, content_type=content)
        except KubeError as error:
            if error.status == UNPROCESSABLE and "metadata.uid" in error.message:
                raise KubeConflict(409, "Conflict", f"another pod of that name: {error.message}") from error
            raise

    async def patch_if_present(
        self, ref: PodRef, patch: Json, *, subresource: str | None = None, strategic: bool = False
    ) -> Json | None:
        """The pod as the patch left it; None when it is gone or replaced by a namesake.

        A 409 is not proof that the pod is gone: a namesake refuses the pod's uid, but an
        API server under load or in the middle of an update can answer 409 for the pod
        itself. Only a fresh read decides; a conflict on the pod still there is raised,
        and the activity retries.
        """
        try:
            return await self._patch_pod(ref, patch, subresource=subresource, strategic=strategic)
        except KubeNotFound:
            return None
        except KubeConflict:
            if await self.read_pod(ref) is None:
                return None
            raise

    # -- finalizer ---------------------------------------------------------

    @activity.defn(name="add_finalizer")
    async def add_finalizer(self, pods: list[PodRef]) -> list[PodRef]:
        """Protect the pods from vanishing while a Slurm job exists for them; returns the pods still there."""
        present = []
        for ref in pods:
            if await self._add_finalizer(ref):
                present.append(ref)
        return present

    @activity.defn(name="remove_finalizer")
    async def remove_finalizer(self, pods: list[PodRef]) -> None:
        # A strategic merge patch takes the one entry out of the list on the server, so it
        # needs neither a read nor a resourceVersion: nobody else's finalizer can be lost,
        # and a pod without ours is a write that changes nothing (no new resourceVersion).
        drop = {"metadata": {"$deleteFromPrimitiveList/finalizers": [keys.FINALIZER]}}
        for ref in pods:
            await self.patch_if_present(ref, drop, strategic=True)

    async def _add_finalizer(self, ref: PodRef) -> bool:
        pod = await self.read_pod(ref)
        if pod is None:
            return False
        meta = pod["metadata"]
        finalizers: list[str] = list(meta.get("finalizers") or [])
        if meta.get("deletionTimestamp"):
            return False  # being deleted: nothing to place, and new finalizers are refused
        if keys.FINALIZER in finalizers:
            return True
        # resourceVersion makes this a compare-and-swap: the pod is placed only as it was
        # read (not deleted or finished meanwhile); a concurrent edit gives 409 and the
        # activity retries with a fresh read.
        patch = {
            "metadata": {
                "finalizers": [*finalizers, keys.FINALIZER],
                "resourceVersion": meta["resourceVersion"],
            }
        }
        try:
            await self._patch_pod(ref, patch)
        except KubeNotFound:
            return False
        return True

    # -- translation -------------------------------------------------------

    @activity.defn(name="translate")
    async def translate(self, request: PlacementRequest) -> JobDescription:
        """Read the group's pods and owners and build the Slurm job that represents them."""
        pods = []
        for ref in request.pods:
            pod = await self.read_pod(ref)
            if pod is None:
                raise ApplicationError(f"pod {ref.key} is gone", type=POD_GONE, non_retryable=True)
            pods.append(pod)
        return await self.build_job(request, pods)

    async def build_job(
        self,
        request: PlacementRequest,
        pods: list[Json],
        excluded_nodes: list[str] | None = None,
        capacity: Capacity | None = None,
    ) -> JobDescription:
        """The job for these pods (as read), in the group's order; bad input is final.

        `capacity`: what all the bridge's nodes have together, to refuse a PodGroup whose
        spec.minResources no state of the cluster could meet (`bridge.translate.build_job`).
        """
        pods = grouping.in_order(pods)
        try:
            group = await grouping.resolve(KubeReader(self.kube), pods[0])
            return build_job(
                pods,
                annotations=group.annotations,
                shape=group.shape or GroupShape(name=request.group),
                defaults=self.settings.defaults,
                excluded_nodes=excluded_nodes,
                policy=self.settings.policy.current(),
                capacity=capacity,
            )
        except (TranslationError, grouping.GroupError) as error:
            raise ApplicationError(str(error), type=INVALID_POD, non_retryable=True) from error

    # -- labels, binding ---------------------------------------------------

    @activity.defn(name="label_job_id")
    async def label_job_id(self, pods: list[PodRef], job_id: int) -> None:
        for ref in pods:
            if not await self.patch_if_present(
                ref, {"metadata": {"labels": {keys.LABEL_SLURM_JOB_ID: str(job_id)}}}
            ):
                log.info("pod %s gone before it could be labelled with job %s", ref.key, job_id)

    @activity.defn(name="resolve_nodes")
    async def resolve_nodes(self, slurm_nodes: list[str]) -> list[str]:
        """Kubernetes node names for Slurm node names: the slurm-nodename label, else the same name."""
        nodes = ListedNodes(self.kube, self.settings.scheduler_name)
        return await kubernetes_node_names(self.kube, nodes, slurm_nodes)

    @activity.defn(name="bind_pods")
    async def bind_pods(self, pods: list[PodRef], nodes: list[str]) -> list[PodRef]:
        """Bind pod i to node i; returns the pods that were still there to bind."""
        bound = []
        for ref, node in zip(pods, nodes, strict=True):
            if await self._bind(ref, node):
                bound.append(ref)
        return bound

    async def _bind(self, ref: PodRef, node: str) -> bool:
        pod = await self.read_pod(ref)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return False
        current = pod.get("spec", {}).get("nodeName")
        if current:
            if current == node:
                return True  # an earlier attempt got there
            raise ApplicationError(
                f"pod {ref.key} is already bound to {current}, not to the allocated node {node}",
                type=BOUND_ELSEWHERE,
                non_retryable=True,
            )
        await self._patch_pod(ref, {"metadata": {"annotations": {keys.ANNOTATION_SLURM_NODE: node}}})
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            await self.kube.request(
                "POST",
                api_path("pods", namespace=ref.namespace, name=ref.name, subresource="binding"),
                body=binding,
            )
        except KubeConflict:
            # Bound meanwhile (a retried attempt, or another replica): accept only our node.
            return await self._bind(ref, node)
        except KubeNotFound:
            return False
        return True

    # -- telling people ----------------------------------------------------

    @activity.defn(name="record_event")
    async def record_event(
        self, pods: list[PodRef], reason: str, message: str, warning: bool = False
    ) -> None:
        for ref in pods:
            await self._event(ref, reason, message, warning)

    async def _event(self, ref: PodRef, reason: str, message: str, warning: bool) -> None:
        stamp = now()
        event: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{ref.name}.", "namespace": ref.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": ref.namespace,
                "name": ref.name,
                "uid": ref.uid,
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": self.settings.scheduler_name},
            "reportingComponent": self.settings.scheduler_name,
            "reportingInstance": self.instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self.kube.request("POST", api_path("events", namespace=ref.namespace), body=event)
        except KubeNotFound:
            log.info("namespace of %s gone; event %s dropped", ref.key, reason)

    @activity.defn(name="set_unschedulable")
    async def set_unschedulable(self, pods: list[PodRef], reason: str, message: str) -> None:
        """PodScheduled=False with Slurm's reason: what `kubectl describe pod` and `kubectl get` show."""
        condition = {
            "type": keys.CONDITION_POD_SCHEDULED,
            "status": "False",
            "reason": reason,
            "message": message[:1024],
            "lastTransitionTime": now(),
        }
        for ref in pods:
            if not await self.patch_if_present(
                ref, {"status": {"conditions": [condition]}}, subresource="status"
            ):
                log.info("pod %s gone; condition %s dropped", ref.key, reason)

    # -- ending ------------------------------------------------------------

    @activity.defn(name="delete_pods")
    async def delete_pods(self, pods: list[PodRef], reason: str, message: str) -> None:
        """Delete the pods because their Slurm job ended, saying why on each."""
        for ref in pods:
            if await self.read_pod(ref) is None:
                continue
            await self._event(ref, reason, message, warning=True)
            body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": ref.uid}}
            try:
                await self.kube.request(
                    "DELETE", api_path("pods", namespace=ref.namespace, name=ref.name), body=body
                )
            except KubeNotFound:
                continue
            except KubeConflict:
                # The uid precondition failed (a namesake: ours is gone), or a 409 for the
                # pod itself, which must still go: a fresh read tells which.
                if await self.read_pod(ref) is not None:
                    raise


def pod_refs(pods: Sequence[Json]) -> list[PodRef]:
    return [
        PodRef(namespace=p["metadata"]["namespace"], name=p["metadata"]["name"], uid=p["metadata"]["uid"])
        for p in pods
    ]
