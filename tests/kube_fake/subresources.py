"""``pods/binding`` and ``pods/eviction``: the two verbs a scheduler uses.

Both follow pkg/registry/core/pod/storage: binding refuses a pod that is
already bound, being deleted or still gated (409 on ``pods/binding``), sets
``spec.nodeName`` plus ``PodScheduled=True``; eviction is a DELETE that a
PodDisruptionBudget may veto with 429.  Both answer ``Status{Success, 201}``.
"""

from __future__ import annotations

import threading
from typing import Any

from . import errors
from .resources import ResourceType
from .store import Store
from .util import JSON, clone, meta, now_rfc3339

SUCCESS_CREATED = errors.status_body(201, "", "", None, success=True)


def _check_preconditions(rt: ResourceType, name: str, pod: JSON, want: JSON, *, what: str) -> None:
    for key, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        if want.get(key) and want[key] != pod["metadata"].get(key):
            raise errors.conflict(
                rt,
                name,
                f"Precondition failed: {label} in precondition: {want[key]}, "
                f"{label} in object meta: {pod['metadata'].get(key)}",
                qualified=what,
            )


def set_condition(
    status: JSON, ctype: str, value: str, reason: str | None = None, message: str | None = None
) -> None:
    """podutil.UpdatePodCondition: lastTransitionTime only moves when the status flips."""
    conditions: list[JSON] = status.setdefault("conditions", [])
    new: JSON = {"type": ctype, "status": value, "lastTransitionTime": now_rfc3339()}
    if reason:
        new["reason"] = reason
    if message:
        new["message"] = message
    for i, cond in enumerate(conditions):
        if cond.get("type") == ctype:
            if cond.get("status") == value:
                new["lastTransitionTime"] = cond.get("lastTransitionTime", new["lastTransitionTime"])
            if "lastProbeTime" in cond:
                new["lastProbeTime"] = cond["lastProbeTime"]
            conditions[i] = new
            return
    conditions.append(new)


def bind(store: Store, rt: ResourceType, namespace: str, name: str, body: Any) -> JSON:
    if not isinstance(body, dict) or not isinstance(body.get("target"), dict):
        raise errors.bad_request("a Binding object with a target is required")
    target = body["target"]
    bmeta = body.get("metadata") or {}
    if bmeta.get("name") not in (None, "", name):
        raise errors.bad_request("name in URL does not match name in Binding object")
    if target.get("kind") not in (None, "", "Node"):
        raise errors.bad_request(f"binding target kind must be Node, got {target.get('kind')!r}")
    node = str(target.get("name") or "")
    if not node:
        raise errors.invalid(rt, name, [("target.name", "FieldValueRequired", "Required value")])

    def assign(pod: JSON) -> JSON:
        _check_preconditions(rt, name, pod, bmeta, what="pods/binding")
        spec = pod.setdefault("spec", {})
        why = None
        if pod["metadata"].get("deletionTimestamp"):
            why = f"pod {name} is being deleted, cannot be assigned to a host"
        elif spec.get("nodeName"):
            why = f'pod {name} is already assigned to node "{spec["nodeName"]}"'
        elif spec.get("schedulingGates"):
            why = f"pod {name} has non-empty .spec.schedulingGates"
        if why:
            raise errors.conflict(rt, name, why, qualified="pods/binding")
        spec["nodeName"] = node
        if bmeta.get("annotations"):
            meta(pod).setdefault("annotations", {}).update(bmeta["annotations"])
        set_condition(pod.setdefault("status", {}), "PodScheduled", "True")
        return pod

    store.mutate(rt, namespace, name, assign)
    return clone(SUCCESS_CREATED)


class EvictionGate:
    """Lets a test make evictions fail the way a PodDisruptionBudget does."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._remaining: int | None = 0  # None = block until unblocked

    def block(self, count: int | None) -> None:
        with self._lock:
            self._remaining = count

    def take(self) -> bool:
        with self._lock:
            if self._remaining is None:
                return True
            if self._remaining > 0:
                self._remaining -= 1
                return True
            return False


def pdb_violation() -> errors.ApiError:
    return errors.ApiError(
        429,
        "TooManyRequests",
        "Cannot evict pod as it would violate the pod's disruption budget.",
        {
            "causes": [
                {
                    "reason": "DisruptionBudget",
                    "message": "The disruption budget kube-fake-pdb needs 1 healthy pods and has 1 currently",
                }
            ]
        },
    )


def evict(store: Store, rt: ResourceType, namespace: str, name: str, body: Any, gate: EvictionGate) -> JSON:
    if not isinstance(body, dict):
        raise errors.bad_request("an Eviction object is required")
    emeta = body.get("metadata") or {}
    if emeta.get("name") not in (None, "", name):
        raise errors.bad_request("name in URL does not match name in Eviction object")
    options = body.get("deleteOptions") or {}
    with store.cond:
        pod = store.get(rt, namespace, name)
        if pod["metadata"].get("deletionTimestamp"):
            return clone(SUCCESS_CREATED)  # already terminating: nothing to decide
        terminal = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        if not terminal and gate.take():
            raise pdb_violation()
        store.delete(rt, namespace, name, options)
    return clone(SUCCESS_CREATED)
