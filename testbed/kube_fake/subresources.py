"""``pods/binding`` and ``pods/eviction``: the two verbs a scheduler uses.

Both follow pkg/registry/core/pod/storage: binding refuses a pod that is
already bound, being deleted or still gated (409 on ``pods/binding``), sets
``spec.nodeName`` plus ``PodScheduled=True``.  Eviction (eviction.go) deletes
a terminal, Pending or terminating pod outright; any other pod is checked
against the one PodDisruptionBudget selecting it (two or more: 500), which
may veto with 429 (see ``disruption``); an unready pod may go without using
up the budget.  Before the DELETE (with the Eviction's deleteOptions) it sets
``DisruptionTarget=True`` reason ``EvictionByEvictionAPI`` through the status
path, replacing any earlier DisruptionTarget condition.  Both answer
``Status{Success, 201}``.
"""

from __future__ import annotations

import threading
from typing import Any

from . import disruption, errors
from .resources import ResourceType
from .store import Store
from .util import JSON, clone, meta, now_rfc3339

SUCCESS_CREATED = errors.status_body(201, "", "", None, success=True)
EVICTION_REASON = "EvictionByEvictionAPI"
EVICTION_MESSAGE = "Eviction API: evicting"


def _check_preconditions(rt: ResourceType, namespace: str, name: str, pod: JSON, want: JSON) -> None:
    """BindingREST hands the Binding's uid/resourceVersion to the storage update as
    preconditions: a mismatch is etcd3's precondition error, on the pod."""
    for key, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        if want.get(key) and want[key] != pod["metadata"].get(key):
            raise errors.storage_precondition_failed(
                rt, namespace, name, label, want[key], pod["metadata"].get(key)
            )


def set_condition(
    status: JSON, ctype: str, value: str, reason: str | None = None, message: str | None = None
) -> None:
    """podutil.UpdatePodCondition: the condition is replaced whole (reason,
    message, lastProbeTime included); lastTransitionTime only moves when the
    status flips."""
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
            conditions[i] = new
            return
    conditions.append(new)


def bind(store: Store, rt: ResourceType, namespace: str, name: str, body: Any) -> JSON:
    if not isinstance(body, dict):
        raise errors.bad_request("a Binding object is required")
    target: JSON = body["target"] if isinstance(body.get("target"), dict) else {}
    bmeta = body.get("metadata") or {}
    if bmeta.get("name") != name:  # a Binding must name its pod, even on pods/{name}/binding
        raise errors.bad_request("name in URL does not match name in Binding object")
    # ValidatePodBinding's errors come back as a bare ErrorList: 500 without a reason.
    kind, node = target.get("kind") or "", str(target.get("name") or "")
    if kind not in ("", "Node"):
        raise errors.unexpected(
            f'target.kind: Unsupported value: "{kind}": supported values: "Node", "<empty>"'
        )
    if not node:
        raise errors.unexpected("target.name: Required value")

    def assign(pod: JSON) -> JSON:
        _check_preconditions(rt, namespace, name, pod, bmeta)
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
    """What ``block_evictions`` answers: a budget that allows no disruption."""
    return disruption.too_many_requests(
        disruption.VIOLATION, "The disruption budget kube-fake-pdb needs 1 healthy pods and has 1 currently"
    )


def _can_ignore_budget(pod: JSON) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed", "Pending") or bool(pod["metadata"].get("deletionTimestamp"))


def _with_rv_precondition(options: JSON, rv: str) -> JSON:
    return {**options, "preconditions": {**(options.get("preconditions") or {}), "resourceVersion": rv}}


def evict(
    store: Store,
    rt: ResourceType,
    namespace: str,
    name: str,
    body: Any,
    gate: EvictionGate,
    *,
    sync_budgets: bool = True,
) -> JSON:
    """``sync_budgets``: bring the PDB's status up to date first, as a disruption
    controller that is never behind would have (off: its stored status rules)."""
    if not isinstance(body, dict):
        raise errors.bad_request("an Eviction object is required")
    emeta = body.get("metadata") or {}
    if emeta.get("name") != name:  # an Eviction must name its pod, even on pods/{name}/eviction
        raise errors.bad_request("name in URL does not match name in Eviction object")
    options: JSON = dict(body.get("deleteOptions") or {})
    if options.get("dryRun"):
        raise errors.bad_request("kube_fake: dryRun is not supported")
    rv_unset = not (options.get("preconditions") or {}).get("resourceVersion")
    with store.cond:
        pod = store.get(rt, namespace, name)
        terminal = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        if not terminal and not pod["metadata"].get("deletionTimestamp") and gate.take():
            raise pdb_violation()
        if _can_ignore_budget(pod):
            if not terminal and not pod["metadata"].get("deletionTimestamp") and rv_unset:
                options = _with_rv_precondition(options, pod["metadata"]["resourceVersion"])
            _mark_and_delete(store, rt, namespace, name, options)
            return clone(SUCCESS_CREATED)
        budgets = disruption.budgets_for_pod(store, store.registry, pod)
        if len(budgets) > 1:
            raise errors.ApiError(
                500,
                "",
                "This pod has more than one PodDisruptionBudget, "
                "which the eviction subresource does not support.",
            )
        spare_budget = False  # an unready pod that may go without using up a disruption
        if budgets:
            pdb = budgets[0]
            if sync_budgets:
                pdb = disruption.sync_budget(store, store.registry, namespace, pdb["metadata"]["name"]) or pdb
            status = pdb.get("status") or {}
            if not disruption.pod_ready(pod):
                policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy")
                desired = int(status.get("desiredHealthy", 0))
                spare_budget = policy == "AlwaysAllow" or (
                    int(status.get("currentHealthy", 0)) >= desired and desired > 0
                )
            if not spare_budget:
                disruption.check_and_decrement(store, store.registry, pdb, name)
        if spare_budget:
            options = _with_rv_precondition(options, pod["metadata"]["resourceVersion"])
        try:
            _mark_and_delete(store, rt, namespace, name, options)
        except errors.ApiError as exc:
            if exc.code == 409 and spare_budget and rv_unset:
                raise disruption.still_processing(budgets[0]["metadata"]["name"]) from exc
            raise
    return clone(SUCCESS_CREATED)


def _mark_and_delete(store: Store, rt: ResourceType, namespace: str, name: str, options: JSON) -> None:
    """addConditionAndDeletePod: preconditions are checked against the latest pod,
    the condition goes in through the status path, then the DELETE."""
    pre = options.get("preconditions") or {}

    def mark(pod: JSON) -> None:
        for key, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
            want, have = pre.get(key), pod["metadata"].get(key)
            if want and want != have:
                raise errors.delete_precondition_failed(rt, name, label, want, have)
        set_condition(
            pod.setdefault("status", {}), "DisruptionTarget", "True", EVICTION_REASON, EVICTION_MESSAGE
        )

    updated = store.mutate(rt, namespace, name, mark, mode="status")
    if pre.get("resourceVersion"):
        # Our own status write moved the version the caller (or we) pinned.
        options = _with_rv_precondition(options, updated["metadata"]["resourceVersion"])
    store.delete(rt, namespace, name, options)
