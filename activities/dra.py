"""The ResourceClaims of DRA pods: written before binding, deleted when the placement ends.

Called from the bind and release activities (activities/placement.py). Each step
is idempotent: a claim already made for the pod (found by Kubernetes' extended
resource claim annotation and the pod as controller) is reused, its status and
the pod's `status.extendedResourceClaimStatus` are set to the same values again.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.kube import STRATEGIC_MERGE, now
from bridge.device_classes import DEFAULT_DEVICE_CLASSES, DeviceClasses
from bridge.dra import (
    EXTENDED_RESOURCE_CLAIM,
    RESOURCE_GROUP,
    DeviceLayoutError,
    PinnedClaim,
    device_requests,
    pin,
)
from bridge.models import PodRef
from clients.kube_client import (
    MERGE_PATCH,
    Json,
    KubeClient,
    KubeConflict,
    KubeError,
    KubeNotFound,
    api_path,
)
from clients.slurm_client import SlurmClient

log = activity.logger
# The workflow's failure reason (pod condition, Event, workflow failure) when devices cannot be pinned.
DEVICES_NOT_PINNED = "SlurmDevicesNotPinned"
FORBIDDEN = 403


def _claims_path(namespace: str, name: str | None = None, subresource: str | None = None) -> str:
    return api_path(
        "resourceclaims",
        namespace=namespace,
        name=name,
        subresource=subresource,
        group=RESOURCE_GROUP,
    )


@dataclass(frozen=True)
class Pinned:
    ref: PodRef
    pod: Json
    claim: PinnedClaim


class DeviceClaims:
    def __init__(
        self, kube: KubeClient, slurm: SlurmClient, honoured: DeviceClasses = DEFAULT_DEVICE_CLASSES
    ) -> None:
        self.kube = kube
        self.slurm = slurm
        # DRA_DEVICE_CLASSES: which GRES (or the cores) each class's devices are pinned to.
        self.honoured = honoured

    async def pin_all(
        self, pods: Sequence[tuple[PodRef, Json]], job_id: int, slurm_nodes: list[str], nodes: list[str]
    ) -> list[Pinned]:
        """The claim of every DRA pod, computed before anything is written (all or none is bound).

        Raises a non-retryable ApplicationError (type SlurmDevicesNotPinned) when
        Slurm's allocation cannot be expressed on the node.
        """
        wanted = [
            (ref, pod, requests, slurm_node, node)
            for (ref, pod), slurm_node, node in zip(pods, slurm_nodes, nodes, strict=True)
            if (requests := device_requests(pod, self.honoured))
        ]
        if not wanted:
            return []
        layouts = {
            entry.node: entry.model_dump(mode="json") for entry in await self.slurm.get_job_resources(job_id)
        }
        classes = await self._device_classes()
        pinned = []
        for ref, pod, requests, slurm_node, node in wanted:
            slices = await self._slices(node)
            try:
                claim = pin(requests, layouts.get(slurm_node), slices, node=node, classes=classes)
            except DeviceLayoutError as error:
                message = (
                    f"pod {ref.key} not bound: Slurm job {job_id}'s devices on {slurm_node} cannot be "
                    f"pinned in a ResourceClaim: {error}"
                )
                raise ApplicationError(message, type=DEVICES_NOT_PINNED, non_retryable=True) from error
            pinned.append(Pinned(ref, pod, claim))
        return pinned

    async def write(self, pinned: Pinned) -> str:
        """Create (or find) the claim, allocate and reserve it, point the pod at it; the claim's name."""
        ref, pod = pinned.ref, pinned.pod
        claim = await self._existing(ref)
        if claim is None:
            claim = await self.kube.request("POST", _claims_path(ref.namespace), body=pinned.claim.claim(pod))
        name = str(claim["metadata"]["name"])
        status = {"status": pinned.claim.status(pod, now())}
        await self.kube.request(
            "PATCH", _claims_path(ref.namespace, name, "status"), body=status, content_type=MERGE_PATCH
        )
        patch = {
            "metadata": {"uid": ref.uid},
            "status": {"extendedResourceClaimStatus": pinned.claim.pod_status(name)},
        }
        path = api_path("pods", namespace=ref.namespace, name=ref.name, subresource="status")
        await self.kube.request("PATCH", path, body=patch, content_type=STRATEGIC_MERGE)
        return name

    async def delete_for(self, pods: Sequence[PodRef]) -> list[str]:
        """Delete the claims written for these pods; the names deleted."""
        deleted = []
        for namespace in sorted({ref.namespace for ref in pods}):
            uids = {ref.uid for ref in pods if ref.namespace == namespace}
            for claim in await self._ours(namespace):
                owner = _controller_uid(claim)
                if owner not in uids:
                    continue
                meta = claim["metadata"]
                body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": meta["uid"]}}
                try:
                    await self.kube.request("DELETE", _claims_path(namespace, meta["name"]), body=body)
                except (KubeNotFound, KubeConflict):
                    continue  # gone already (the garbage collector, an earlier attempt)
                deleted.append(f"{namespace}/{meta['name']}")
        return deleted

    async def _existing(self, ref: PodRef) -> Json | None:
        return next((c for c in await self._ours(ref.namespace) if _controller_uid(c) == ref.uid), None)

    async def _ours(self, namespace: str) -> list[Json]:
        try:
            listed = await self.kube.request("GET", _claims_path(namespace))
        except KubeNotFound:
            return []  # resource.k8s.io/v1 not served: no claim can exist
        except KubeError as error:
            if error.status != FORBIDDEN:
                raise
            # Not granted (an older chart): the bridge cannot have written a claim either.
            log.warning("listing ResourceClaims in %s is forbidden; no claim to delete", namespace)
            return []
        return [
            c
            for c in listed.get("items", [])
            if (c["metadata"].get("annotations") or {}).get(EXTENDED_RESOURCE_CLAIM) == "true"
        ]

    async def _device_classes(self) -> list[str]:
        try:
            listed = await self.kube.request("GET", api_path("deviceclasses", group=RESOURCE_GROUP))
        except KubeNotFound:
            return []
        return [str(c["metadata"]["name"]) for c in listed.get("items", [])]

    async def _slices(self, node: str) -> list[Json]:
        try:
            listed = await self.kube.request(
                "GET",
                api_path("resourceslices", group=RESOURCE_GROUP),
                query={"fieldSelector": f"spec.nodeName={node}"},
            )
        except KubeNotFound:
            return []
        return list(listed.get("items", []))


def _controller_uid(claim: Json) -> str | None:
    for owner in claim["metadata"].get("ownerReferences") or []:
        if owner.get("kind") == "Pod" and owner.get("controller"):
            return str(owner.get("uid"))
    return None
