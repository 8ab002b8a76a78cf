"""resource.k8s.io/v1 (dynamic resource allocation): defaults and the checks a
client of these types can trip over.

From pkg/apis/resource/v1/defaults.go and pkg/apis/resource/validation:
required fields on create (a request needs a name and exactly one of
``exactly``/``firstAvailable``, which need a ``deviceClassName``; a
ResourceSlice needs a driver, a pool and exactly one node selection), the
``allocationMode: ExactCount`` / ``count: 1`` defaults, and the claim status
invariants (``reservedFor`` entries are complete and need an allocation).
A pod's ``status.extendedResourceClaimStatus`` (KEP-5004, what the scheduler writes
for DRA-backed extended resources) is checked as validatePodExtendedResourceClaimStatus
does: mappings present, each naming a container and one of its requested resources,
no duplicates, a claim name. Names are not format-checked, CEL selectors are not
compiled, and the immutability of a claim's spec and of an allocation is not enforced.
"""

from __future__ import annotations

from typing import Any

from . import errors
from .resources import ResourceType
from .util import JSON

Cause = tuple[str, str, str]  # (field, cause reason, message)
NODE_SELECTION = "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
REQUEST_KIND = "exactly one of `exactly` or `firstAvailable` is required"


def _required(path: str, detail: str = "") -> Cause:
    return (path, "FieldValueRequired", f"Required value: {detail}" if detail else "Required value")


def _default_request(request: JSON) -> None:
    """SetDefaults_ExactDeviceRequest / SetDefaults_DeviceSubRequest."""
    request.setdefault("allocationMode", "ExactCount")
    if request["allocationMode"] == "ExactCount" and not request.get("count"):
        request["count"] = 1


def _claim_spec(spec: Any, path: str) -> list[Cause]:
    causes: list[Cause] = []
    devices = (spec or {}).get("devices") or {}
    for i, request in enumerate(devices.get("requests") or []):
        at = f"{path}.devices.requests[{i}]"
        if not request.get("name"):
            causes.append(_required(f"{at}.name"))
        exactly, first = request.get("exactly"), request.get("firstAvailable") or []
        if exactly is None and not first:
            causes.append(_required(at, REQUEST_KIND))
        elif exactly is not None and first:
            causes.append(
                (at, "FieldValueInvalid", f"Invalid value: null: {REQUEST_KIND}, but multiple fields are set")
            )
        elif exactly is not None:
            _default_request(exactly)
            if not exactly.get("deviceClassName"):
                causes.append(_required(f"{at}.exactly.deviceClassName"))
        for j, sub in enumerate(first):
            _default_request(sub)
            for key in ("name", "deviceClassName"):
                if not sub.get(key):
                    causes.append(_required(f"{at}.firstAvailable[{j}].{key}"))
    return causes


def _slice_spec(spec: JSON) -> list[Cause]:
    causes: list[Cause] = []
    if not spec.get("driver"):
        causes.append(_required("spec.driver"))
    pool = spec.get("pool") or {}
    if not pool.get("name"):
        causes.append(_required("spec.pool.name"))
    count = pool.get("resourceSliceCount", 0)
    if not isinstance(count, int) or count <= 0:
        causes.append(
            (
                "spec.pool.resourceSliceCount",
                "FieldValueInvalid",
                f"Invalid value: {count}: must be greater than zero",
            )
        )
    chosen = [
        f"`{key}`"
        for key in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
        if spec.get(key) not in (None, "", False)
    ]
    if not chosen:
        causes.append(_required("spec", NODE_SELECTION))
    elif len(chosen) > 1:
        value = "{" + ", ".join(chosen) + "}"
        causes.append(
            (
                "spec",
                "FieldValueInvalid",
                f'Invalid value: "{value}": {NODE_SELECTION}, but multiple fields are set',
            )
        )
    return causes


def prepare_create(rt: ResourceType, obj: JSON) -> None:
    """Defaults, then 422 Invalid if a required field is missing."""
    name = str(obj["metadata"].get("name", ""))
    spec = obj.setdefault("spec", {})
    causes: list[Cause] = []
    if rt.plural == "resourceclaims":
        causes = _claim_spec(spec, "spec")
    elif rt.plural == "resourceclaimtemplates":
        causes = _claim_spec(spec.get("spec"), "spec.spec")
    elif rt.plural == "resourceslices":
        causes = _slice_spec(spec)
    if causes:
        raise errors.invalid(rt, name, causes)


def validate_claim_status(rt: ResourceType, name: str, new: JSON) -> None:
    """validateResourceClaimStatusUpdate's invariants for ``reservedFor``."""
    status = new.get("status") or {}
    causes: list[Cause] = []
    reserved = status.get("reservedFor") or []
    for i, ref in enumerate(reserved):
        for key in ("resource", "name", "uid"):
            if not (ref or {}).get(key):
                causes.append(_required(f"status.reservedFor[{i}].{key}"))
    if reserved and not status.get("allocation"):
        causes.append(
            (
                "status.reservedFor",
                "FieldValueForbidden",
                "Forbidden: may not be specified when `allocated` is not set",
            )
        )
    if causes:
        raise errors.invalid(rt, name, causes)


def validate_pod_claim_statuses(rt: ResourceType, name: str, new: JSON) -> None:
    """validatePodResourceClaimStatuses: each entry names one of spec.resourceClaims, once."""
    claims = {
        c.get("name") for c in (new.get("spec") or {}).get("resourceClaims") or [] if isinstance(c, dict)
    }
    causes: list[Cause] = []
    seen: set[str] = set()
    for i, entry in enumerate((new.get("status") or {}).get("resourceClaimStatuses") or []):
        claim = str((entry or {}).get("name", ""))
        at = f"status.resourceClaimStatuses[{i}].name"
        if claim not in claims:
            causes.append(
                (
                    at,
                    "FieldValueInvalid",
                    f'Invalid value: "{claim}": must match the name of an entry in `spec.resourceClaims`',
                )
            )
        if claim in seen:
            causes.append((at, "FieldValueDuplicate", f'Duplicate value: "{claim}"'))
        seen.add(claim)
    if causes:
        raise errors.invalid(rt, name, causes)


def validate_pod_extended_resource_claim_status(rt: ResourceType, name: str, new: JSON) -> None:
    """validatePodExtendedResourceClaimStatus, without the DNS format checks of the names."""
    status = (new.get("status") or {}).get("extendedResourceClaimStatus")
    if status is None:
        return
    spec = new.get("spec") or {}
    containers = {
        c.get("name"): c
        for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        if isinstance(c, dict)
    }
    path = "status.extendedResourceClaimStatus"
    causes: list[Cause] = []
    mappings = status.get("requestMappings") or []
    if not mappings:
        causes.append(_required(f"{path}.requestMappings", "at least one request mapping is required"))
    seen: set[tuple[str, str, str]] = set()
    for i, mapping in enumerate(mappings):
        at = f"{path}.requestMappings[{i}]"
        container_name = str(mapping.get("containerName", ""))
        resource_name = str(mapping.get("resourceName", ""))
        request_name = str(mapping.get("requestName", ""))
        container = containers.get(container_name)
        if container is None:
            causes.append(
                (
                    f"{at}.containerName",
                    "FieldValueInvalid",
                    f'Invalid value: "{container_name}": must match the name of an entry in '
                    "spec.initContainers.name or spec.containers.name",
                )
            )
        elif resource_name not in ((container.get("resources") or {}).get("requests") or {}):
            causes.append(
                (
                    f"{at}.resourceName",
                    "FieldValueInvalid",
                    f'Invalid value: "{resource_name}": must match the extended resource name of an entry in '
                    "spec.initContainers.resources.requests or spec.containers.resources.requests",
                )
            )
        if not request_name:
            causes.append(_required(f"{path}.requestName"))
        key = (container_name, resource_name, request_name)
        if key in seen:
            for field, value in zip(("containerName", "resourceName", "requestName"), key, strict=True):
                causes.append((f"{at}.{field}", "FieldValueDuplicate", f'Duplicate value: "{value}"'))
        seen.add(key)
    if not status.get("resourceClaimName"):
        causes.append(_required(f"{path}.resourceClaimName"))
    if causes:
        raise errors.invalid(rt, name, causes)
