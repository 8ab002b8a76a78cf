"""PodDisruptionBudgets: the disruption controller's status and the eviction check.

``budget_status`` is pkg/controller/disruption's computation: the pods the
selector picks in the PDB's namespace (``nil`` selects none, ``{}`` all),
``expectedPods``/``desiredHealthy`` from ``minAvailable`` (an integer counts
the matching pods; a percentage scales the owning controllers' replicas) or
``maxUnavailable`` (always scaled from the controllers' replicas), rounded
up; ``currentHealthy`` = matching pods that are Ready, not being deleted and
not just evicted (``disruptedPods``, for two minutes); ``disruptionsAllowed``
= currentHealthy - desiredHealthy, never below 0 and 0 while no pod is
expected; the ``DisruptionAllowed`` condition.  A pod owned by a controller
the fake cannot scale (anything but ReplicaSet, Deployment, StatefulSet) makes
the sync fail, which, as upstream, zeroes ``disruptionsAllowed`` with reason
``SyncFailed`` and leaves the rest of the status alone.

``check_and_decrement`` is the eviction subresource's side: 429 while the
status is older than the spec or allows no disruption, else it takes one
disruption and notes the pod in ``disruptedPods``.
"""

from __future__ import annotations

import math
from typing import Any

from bridge.labels import Selector, selector_from_object

from . import errors
from .resources import Registry, ResourceType
from .selectors import labels_match
from .store import Store, StoredEvent
from .util import JSON, now_rfc3339, parse_rfc3339

NAME = "disruption-controller"
DELETION_TIMEOUT = 120.0  # seconds an evicted pod may take to start terminating
MAX_DISRUPTED_PODS = 2000
CONDITION = "DisruptionAllowed"
VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."


class SyncError(ValueError):
    """The budget cannot be computed; the controller fails safe."""


# ------------------------------------------------------------------ selectors
def pod_selector(selector: Any) -> Selector:
    """metav1.LabelSelectorAsSelector for a non-nil selector; ValueError if invalid."""
    if not isinstance(selector, dict):
        raise ValueError("selector must be an object")
    return selector_from_object(selector)


def selects(pdb: JSON, pod: JSON) -> bool:
    """Whether the eviction subresource applies ``pdb`` to ``pod``: an invalid,
    nil or empty selector protects nothing there."""
    try:
        selector = pod_selector((pdb.get("spec") or {}).get("selector"))
    except ValueError:
        return False
    return not selector.empty and labels_match(selector, pod)


def budgets_for_pod(store: Store, registry: Registry, pod: JSON) -> list[JSON]:
    pdbs = store.snapshot(registry.resolve("poddisruptionbudgets.policy"), pod["metadata"]["namespace"])
    return [pdb for pdb in pdbs if selects(pdb, pod)]


def _pods_for(store: Store, registry: Registry, pdb: JSON) -> list[JSON]:
    selector = (pdb.get("spec") or {}).get("selector")
    if selector is None:
        return []  # labels.Nothing()
    try:
        pod_labels = pod_selector(selector)
    except ValueError as exc:
        raise SyncError(str(exc)) from exc
    pods = store.snapshot(registry.resolve("pods"), pdb["metadata"]["namespace"])
    return [pod for pod in pods if labels_match(pod_labels, pod)]


# ------------------------------------------------------------------ arithmetic
def scaled_value(value: Any, total: int, *, round_up: bool) -> int:
    """intstr.GetScaledValueFromIntOrPercent."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value)
    if not text.endswith("%"):
        raise SyncError(f"invalid value for IntOrString: invalid type: string is not a percentage: {text!r}")
    try:
        percent = int(text[:-1])
    except ValueError as exc:
        raise SyncError(f"invalid value for IntOrString: invalid value {text!r}") from exc
    scaled = percent * total / 100
    return math.ceil(scaled) if round_up else math.floor(scaled)


def pod_ready(pod: JSON) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _controller_ref(obj: JSON) -> JSON | None:
    return next((r for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")), None)


def _is(ref: JSON | None, kind: str) -> bool:
    group = str((ref or {}).get("apiVersion", "")).rpartition("/")[0]
    return bool(ref) and (ref or {}).get("kind") == kind and group in ("apps", "extensions")


def _owner(store: Store, registry: Registry, plural: str, namespace: str, ref: JSON) -> JSON | None:
    obj = store.peek(registry.resolve(plural), namespace, str(ref.get("name")))
    return obj if obj is not None and obj["metadata"].get("uid") == ref.get("uid") else None


def _replicas(obj: JSON) -> int:
    replicas = (obj.get("spec") or {}).get("replicas")
    return 1 if replicas is None else int(replicas)  # the API defaults it to 1


def _scale(store: Store, registry: Registry, namespace: str, ref: JSON) -> tuple[str, int] | None:
    """The finders: ReplicaSet (unless a Deployment owns it), Deployment, StatefulSet."""
    if _is(ref, "ReplicaSet"):
        rs = _owner(store, registry, "replicasets.apps", namespace, ref)
        if rs is None:
            return None
        parent = _controller_ref(rs)
        if not _is(parent, "Deployment"):
            return (rs["metadata"]["uid"], _replicas(rs))
        assert parent is not None
        deployment = _owner(store, registry, "deployments.apps", namespace, parent)
        return (deployment["metadata"]["uid"], _replicas(deployment)) if deployment else None
    if _is(ref, "StatefulSet"):
        sts = _owner(store, registry, "statefulsets.apps", namespace, ref)
        return (sts["metadata"]["uid"], _replicas(sts)) if sts else None
    return None


def _expected_scale(store: Store, registry: Registry, pods: list[JSON]) -> int:
    scales: dict[str, int] = {}
    for pod in pods:
        ref = _controller_ref(pod)
        if ref is None or ref.get("uid") in scales:
            continue  # unmanaged pods count for nothing (an Event warns upstream)
        found = _scale(store, registry, pod["metadata"]["namespace"], ref)
        if found is None:
            raise SyncError(f'found no controllers for pod "{pod["metadata"]["name"]}"')
        scales[found[0]] = found[1]
    return sum(scales.values())


def _expected_and_desired(store: Store, registry: Registry, pdb: JSON, pods: list[JSON]) -> tuple[int, int]:
    spec = pdb.get("spec") or {}
    if spec.get("maxUnavailable") is not None:
        expected = _expected_scale(store, registry, pods)
        return expected, max(expected - scaled_value(spec["maxUnavailable"], expected, round_up=True), 0)
    min_available = spec.get("minAvailable")
    if isinstance(min_available, int):
        return len(pods), min_available
    if min_available is not None:
        expected = _expected_scale(store, registry, pods)
        return expected, scaled_value(min_available, expected, round_up=True)
    return 0, 0


# ------------------------------------------------------------------ status
def set_condition(status: JSON, value: str, reason: str, message: str = "") -> None:
    """apimeta.SetStatusCondition for the DisruptionAllowed condition."""
    conditions: list[JSON] = status.setdefault("conditions", [])
    current = next((c for c in conditions if c.get("type") == CONDITION), None)
    if current is None:
        current = {"type": CONDITION, "status": value, "lastTransitionTime": now_rfc3339()}
        conditions.append(current)
    elif current.get("status") != value:
        current.update(status=value, lastTransitionTime=now_rfc3339())
    current.update(reason=reason, message=message)
    # observedGeneration is omitempty in metav1.Condition.
    current.pop("observedGeneration", None)
    if status.get("observedGeneration"):
        current["observedGeneration"] = status["observedGeneration"]


def _allowed_condition(status: JSON) -> None:
    """pdbhelper.UpdateDisruptionAllowedCondition."""
    if status["disruptionsAllowed"] > 0:
        set_condition(status, "True", "SufficientPods")
    else:
        set_condition(status, "False", "InsufficientPods")


def budget_status(store: Store, registry: Registry, pdb: JSON) -> JSON:
    """The status the disruption controller would write now; SyncError if it cannot."""
    pods = _pods_for(store, registry, pdb)
    expected, desired = _expected_and_desired(store, registry, pdb, pods)
    now = parse_rfc3339(now_rfc3339())
    old = pdb.get("status") or {}
    disrupted: dict[str, str] = {}
    for pod in pods:
        since = str((old.get("disruptedPods") or {}).get(pod["metadata"]["name"]) or "")
        pending = since and not pod["metadata"].get("deletionTimestamp")
        if pending and parse_rfc3339(since) + DELETION_TIMEOUT >= now:
            disrupted[pod["metadata"]["name"]] = since
    healthy = sum(
        1
        for pod in pods
        if not pod["metadata"].get("deletionTimestamp")
        and pod["metadata"]["name"] not in disrupted
        and pod_ready(pod)
    )
    allowed = healthy - desired if expected > 0 else 0
    status: JSON = {"observedGeneration": int(pdb["metadata"].get("generation", 1))}
    if disrupted:
        status["disruptedPods"] = disrupted
    status.update(
        disruptionsAllowed=max(allowed, 0),
        currentHealthy=healthy,
        desiredHealthy=desired,
        expectedPods=expected,
        conditions=[dict(c) for c in old.get("conditions") or []],
    )
    _allowed_condition(status)
    return status


def _fail_safe(pdb: JSON, why: str) -> JSON:
    status: JSON = dict(pdb.get("status") or {})
    status["disruptionsAllowed"] = 0
    status["conditions"] = [dict(c) for c in status.get("conditions") or []]
    set_condition(status, "False", "SyncFailed", why)
    return status


def sync_budget(store: Store, registry: Registry, namespace: str, name: str) -> JSON | None:
    """One controller sync: write the budget's status if it changed; the PDB after it."""
    rt = registry.resolve("poddisruptionbudgets.policy")
    pdb = store.peek(rt, namespace, name)
    if pdb is None:
        return None
    try:
        status = budget_status(store, registry, pdb)
    except SyncError as exc:
        status = _fail_safe(pdb, str(exc))
    return _write_status(store, rt, pdb, status)


def _write_status(store: Store, rt: ResourceType, pdb: JSON, status: JSON) -> JSON:
    def apply(obj: JSON) -> None:
        obj["status"] = status

    # A write that changes nothing is dropped by the store: no event, no new RV.
    return store.mutate(rt, pdb["metadata"]["namespace"], pdb["metadata"]["name"], apply, mode="status")


# ------------------------------------------------------------------ eviction side
def too_many_requests(message: str, cause: str, retry_after: int = 0) -> errors.ApiError:
    details: JSON = {"retryAfterSeconds": retry_after} if retry_after else {}
    details["causes"] = [{"reason": "DisruptionBudget", "message": cause}]
    headers = {"Retry-After": str(retry_after)} if retry_after else None
    return errors.ApiError(429, "TooManyRequests", message, details, headers)


def still_processing(pdb_name: str) -> errors.ApiError:
    return too_many_requests(
        VIOLATION, f"The disruption budget {pdb_name} is still being processed by the server.", 10
    )


def _forbidden(name: str, why: str) -> errors.ApiError:
    details = {"name": name, "group": "policy", "kind": "poddisruptionbudget"}
    return errors.ApiError(
        403, "Forbidden", f'poddisruptionbudget.policy "{name}" is forbidden: {why}', details
    )


def check_and_decrement(store: Store, registry: Registry, pdb: JSON, pod_name: str) -> None:
    """EvictionREST.checkAndDecrement (the caller holds the store lock)."""
    name = pdb["metadata"]["name"]
    status: JSON = dict(pdb.get("status") or {})
    if int(status.get("observedGeneration", 0)) < int(pdb["metadata"].get("generation", 1)):
        raise still_processing(name)
    allowed = int(status.get("disruptionsAllowed", 0))
    if allowed < 0:
        raise _forbidden(name, "pdb disruptions allowed is negative")
    if len(status.get("disruptedPods") or {}) > MAX_DISRUPTED_PODS:
        raise _forbidden(
            name, "DisruptedPods map too big - too many evictions not confirmed by PDB controller"
        )
    if allowed == 0:
        raise too_many_requests(
            VIOLATION,
            f"The disruption budget {name} needs {int(status.get('desiredHealthy', 0))} healthy pods "
            f"and has {int(status.get('currentHealthy', 0))} currently",
        )
    status["disruptionsAllowed"] = allowed - 1
    status["conditions"] = [dict(c) for c in status.get("conditions") or []]
    if status["disruptionsAllowed"] == 0:
        _allowed_condition(status)
    status["disruptedPods"] = {**(status.get("disruptedPods") or {}), pod_name: now_rfc3339()}
    _write_status(store, registry.resolve("poddisruptionbudgets.policy"), pdb, status)


# ------------------------------------------------------------------ controller
class DisruptionController:
    """Keeps every PDB's status current: re-syncs a budget when it changes and
    when a pod it selects (before or after the change) changes."""

    name = NAME

    def __init__(self, store: Store, registry: Registry) -> None:
        self.store = store
        self.registry = registry
        self.pdbs = registry.resolve("poddisruptionbudgets.policy")
        self.pods = registry.resolve("pods")

    def resync(self) -> None:
        for pdb in self.store.snapshot(self.pdbs, None):
            sync_budget(self.store, self.registry, pdb["metadata"]["namespace"], pdb["metadata"]["name"])

    def handle(self, event: StoredEvent) -> None:
        if event.rkey == self.pdbs.key and event.type != "DELETED":
            sync_budget(self.store, self.registry, event.namespace, event.obj["metadata"]["name"])
        elif event.rkey == self.pods.key:
            for pdb in self.store.snapshot(self.pdbs, event.namespace):
                if any(p is not None and _covers(pdb, p) for p in (event.obj, event.prev)):
                    sync_budget(self.store, self.registry, event.namespace, pdb["metadata"]["name"])

    def next_due(self) -> float | None:
        return None  # the two-minute disruptedPods recheck is not simulated

    def fire_due(self, now: float) -> None:
        pass


def _covers(pdb: JSON, pod: JSON) -> bool:
    """The controller's own notion of selection ({} selects every pod)."""
    selector = (pdb.get("spec") or {}).get("selector")
    if selector is None:
        return False
    try:
        return labels_match(pod_selector(selector), pod)
    except ValueError:
        return True  # let the sync report the broken selector
