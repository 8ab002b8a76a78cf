"""Kubernetes side effects of a placement, for its activities (activities/placement.py).

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

from activities.kube_reader import KubeReader
from bridge import grouping, keys
from bridge.components import SizingError, sizing_of, split_by_shape
from bridge.models import JobDescription, PlacementRequest, PodRef
from bridge.resources import Capacity
from bridge.translate import Defaults, GroupShape, TranslationError, build_parts_job
from clients.kube_client import (
    MERGE_PATCH,
    Json,
    KubeClient,
    KubeConflict,
    KubeError,
    KubeNotFound,
    api_path,
)
from clients.policy_file import PolicyFile

# Temporal's activity logger: each line carries the workflow and activity ids.
log = activity.logger
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
UNPROCESSABLE = 422  # Invalid: what kube-apiserver answers a write that fails validation

# ApplicationError types that fail a placement for good.
INVALID_POD = "InvalidPod"
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

    async def remove_finalizer(self, pods: list[PodRef]) -> None:
        # A strategic merge patch takes the one entry out of the list on the server, so it
        # needs neither a read nor a resourceVersion: nobody else's finalizer can be lost,
        # and a pod without ours is a write that changes nothing (no new resourceVersion).
        drop = {"metadata": {"$deleteFromPrimitiveList/finalizers": [keys.FINALIZER]}}
        for ref in pods:
            await self.patch_if_present(ref, drop, strategic=True)

    # -- translation -------------------------------------------------------

    async def resolve_group(self, pods: list[Json]) -> tuple[list[Json], grouping.Group]:
        """The pods in the group's order, and the group they form; bad input is final."""
        pods = grouping.in_order(pods)
        try:
            return pods, await grouping.resolve(KubeReader(self.kube), pods[0])
        except grouping.GroupError as error:
            raise ApplicationError(str(error), type=INVALID_POD, non_retryable=True) from error

    def job_parts(self, pods: list[Json], group: grouping.Group) -> list[list[Json]]:
        """The group's components (bridge/components.py): one per pod shape, or the whole group."""
        defaults = self.settings.defaults
        try:
            sizing = sizing_of(group.annotations, defaults.sizing)
        except SizingError as error:
            raise ApplicationError(str(error), type=INVALID_POD, non_retryable=True) from error
        return split_by_shape(pods, group.annotations, sizing=sizing, devices=defaults.device_classes)

    def build_job(
        self,
        request: PlacementRequest,
        group: grouping.Group,
        parts: Sequence[tuple[list[Json], list[str] | None]],
        capacity: Capacity | None = None,
    ) -> JobDescription:
        """The job for these parts (each with the Slurm nodes it must avoid); bad input is final.

        `capacity`: what all the bridge's nodes have together, to refuse a PodGroup whose
        spec.minResources no state of the cluster could meet (`bridge.translate.build_job`).
        """
        try:
            return build_parts_job(
                parts,
                annotations=group.annotations,
                shape=group.shape or GroupShape(name=request.group),
                defaults=self.settings.defaults,
                policy=self.settings.policy.current(),
                capacity=capacity,
            )
        except TranslationError as error:
            raise ApplicationError(str(error), type=INVALID_POD, non_retryable=True) from error

    # -- telling people ----------------------------------------------------

    async def record_event(
        self, pods: list[PodRef], reason: str, message: str, warning: bool = False
    ) -> None:
        for ref in pods:
            await self._event(ref, reason, message, warning)

    async def _event(
        self, ref: PodRef, reason: str, message: str, warning: bool, *, name: str | None = None
    ) -> None:
        """Record an Event on the pod. With `name`, the Event is told at most once: an attempt
        that repeats the step finds it there (409) and leaves it as it is."""
        stamp = now()
        meta = {"name": name} if name else {"generateName": f"{ref.name}."}
        event: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {**meta, "namespace": ref.namespace},
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
        except KubeConflict:
            if not name:
                raise
            log.info("pod %s was told %s already", ref.key, reason)

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


def pod_refs(pods: Sequence[Json]) -> list[PodRef]:
    return [
        PodRef(namespace=p["metadata"]["namespace"], name=p["metadata"]["name"], uid=p["metadata"]["uid"])
        for p in pods
    ]
