"""The taint-eviction controller (kube-controller-manager's "taint manager").

Follows pkg/controller/tainteviction:

* only ``NoExecute`` taints count; a pod bound (``spec.nodeName``) to a node
  with one it does not tolerate is deleted at once;
* if every such taint is tolerated, the matching tolerations' smallest
  ``tolerationSeconds`` delays the deletion (none set: tolerated forever;
  zero or negative: at once), counted from when the controller noticed;
* a scheduled deletion is cancelled when the taints go away, the tolerations
  become unbounded or the pod is deleted; a pending one is not pushed back by
  later updates;
* it reacts only to pods whose tolerations or node changed and to nodes whose
  NoExecute taints changed, like the real informer handlers;
* the deletion adds condition ``DisruptionTarget=True`` (reason
  ``DeletionByTaintManager``) through pods/status, then DELETEs with empty
  options - the normal graceful path, so finalizers hold the pod - and
  records Events ``TaintManagerEviction``.

Toleration matching is ``Toleration.ToleratesTaint``, the node rules' own
(``bridge.matching``): an empty effect matches every effect, an empty key (only
valid with ``Exists``) every key, an empty operator means ``Equal``.  The alpha
``Lt``/``Gt`` operators (feature gate TaintTolerationComparisonOperators, off by
default) never match.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from bridge.labels import Selector
from bridge.matching import toleration_tolerates

from . import errors
from .clock import Clock
from .controllers import record_event
from .resources import Registry
from .selectors import FieldRequirement
from .store import Filter, Store, StoredEvent
from .subresources import set_condition
from .util import JSON

NAME = "taint-eviction-controller"
NO_EXECUTE = "NoExecute"
REASON = "DeletionByTaintManager"
MESSAGE = "Taint manager: deleting due to NoExecute taint"
FOREVER = -1.0

PodKey = tuple[str, str]  # (namespace, name)


def tolerates(toleration: JSON, taint: JSON) -> bool:
    """Toleration.ToleratesTaint as the controller calls it, with the comparison operators' gate off."""
    return toleration_tolerates(toleration, taint, comparison_operators=False)


def matching_tolerations(taints: list[JSON], tolerations: list[JSON]) -> list[JSON] | None:
    """The first toleration matching each taint, or None if some taint is not tolerated."""
    used: list[JSON] = []
    for taint in taints:
        match = next((t for t in tolerations if tolerates(t, taint)), None)
        if match is None:
            return None
        used.append(match)
    return used


def min_toleration_seconds(used: list[JSON]) -> float:
    """getMinTolerationTime: 0 = now, FOREVER = never, else the smallest bound."""
    if not used:
        return 0.0
    bounds = [int(t["tolerationSeconds"]) for t in used if t.get("tolerationSeconds") is not None]
    if not bounds:
        return FOREVER
    return float(max(min(bounds), 0))


def no_execute_taints(node: JSON | None) -> list[JSON]:
    taints = ((node or {}).get("spec") or {}).get("taints") or []
    return [t for t in taints if isinstance(t, dict) and t.get("effect") == NO_EXECUTE]


def _tolerations(pod: JSON | None) -> list[JSON]:
    return [t for t in ((pod or {}).get("spec") or {}).get("tolerations") or [] if isinstance(t, dict)]


def _node_name(pod: JSON | None) -> str:
    return str(((pod or {}).get("spec") or {}).get("nodeName") or "")


def _key(pod: JSON) -> PodKey:
    return (str(pod["metadata"].get("namespace") or ""), str(pod["metadata"]["name"]))


@dataclass
class _Work:
    created: float
    fire_at: float

    @property
    def timer(self) -> bool:
        """Upstream keeps a worker only for delayed work; immediate work is a nil
        entry, which cannot be looked up or cancelled with an Event."""
        return self.fire_at > self.created


class TaintEvictionController:
    name = NAME

    def __init__(self, store: Store, registry: Registry, clock: Clock) -> None:
        self.store = store
        self.registry = registry
        self.clock = clock
        self.pods = registry.resolve("pods")
        self.nodes = registry.resolve("nodes")
        self._tainted: dict[str, list[JSON]] = {}  # node -> its NoExecute taints
        self._work: dict[PodKey, _Work] = {}  # scheduled deletions (TimedWorkerQueue)

    # ------------------------------------------------------------- Controller
    def resync(self) -> None:
        self._tainted = {}
        for node in self.store.snapshot(self.nodes, None):
            if taints := no_execute_taints(node):
                self._tainted[node["metadata"]["name"]] = taints
        now = self.clock.now()
        alive: set[PodKey] = set()
        for pod in self.store.snapshot(self.pods, None):
            key = _key(pod)
            alive.add(key)
            on_tainted = self._tainted.get(_node_name(pod))
            if on_tainted:
                self._process(key, _tolerations(pod), on_tainted, now)
            elif _node_name(pod):
                self._cancel(key)
        for key in [k for k in self._work if k not in alive]:
            self._cancel(key)

    def handle(self, event: StoredEvent) -> None:
        if event.rkey == self.nodes.key:
            self._node_event(event)
        elif event.rkey == self.pods.key:
            self._pod_event(event)

    def next_due(self) -> float | None:
        return min((w.fire_at for w in self._work.values()), default=None)

    def fire_due(self, now: float) -> None:
        for key, work in list(self._work.items()):
            if work.fire_at <= now:
                del self._work[key]  # done either way, as the queue forgets a fired worker
                self._delete_pod(key)

    # ---------------------------------------------------------------- events
    def _node_event(self, event: StoredEvent) -> None:
        name = str(event.obj["metadata"]["name"])
        node = None if event.type == "DELETED" else event.obj
        if event.type == "MODIFIED" and no_execute_taints(event.prev) == no_execute_taints(node):
            return
        if node is None:
            # Like the real controller: forget the taints, keep scheduled deletions.
            self._tainted.pop(name, None)
            return
        taints = no_execute_taints(node)
        if taints:
            self._tainted[name] = taints
        else:
            self._tainted.pop(name, None)
        on_node = Filter(Selector(), [FieldRequirement("spec.nodeName", False, name)])
        pods = self.store.snapshot(self.pods, None, on_node)
        now = self.clock.now()
        for pod in pods:
            if taints:
                self._process(_key(pod), _tolerations(pod), taints, now)
            else:
                self._cancel(_key(pod))

    def _pod_event(self, event: StoredEvent) -> None:
        key = _key(event.obj)
        if event.type == "DELETED":
            self._cancel(key)
            return
        if event.type == "MODIFIED" and (
            _tolerations(event.prev) == _tolerations(event.obj)
            and _node_name(event.prev) == _node_name(event.obj)
        ):
            return
        taints = self._tainted.get(_node_name(event.obj))
        if taints:
            self._process(key, _tolerations(event.obj), taints, self.clock.now())

    # ------------------------------------------------------------ scheduling
    def _process(self, key: PodKey, tolerations: list[JSON], taints: list[JSON], now: float) -> None:
        """processPodOnNode."""
        used = matching_tolerations(taints, tolerations)
        if used is None:
            self._cancel(key)
            self._add(key, now, now)
            return
        seconds = min_toleration_seconds(used)
        if seconds == FOREVER:
            self._cancel(key)
            return
        start, trigger = now, now + seconds
        scheduled = self._work.get(key)
        if scheduled is not None and scheduled.timer:
            start = scheduled.created
            if start + seconds < trigger:
                return  # the earlier deadline stands
            self._cancel(key)
        self._add(key, start, trigger)

    def _add(self, key: PodKey, created: float, fire_at: float) -> None:
        if key not in self._work:  # AddWork ignores a key it already holds
            self._work[key] = _Work(created, fire_at)

    def _cancel(self, key: PodKey) -> None:
        work = self._work.pop(key, None)
        if work is not None and work.timer:
            self._event(key, f"Cancelling deletion of Pod {key[0]}/{key[1]}")

    # --------------------------------------------------------------- effects
    def _delete_pod(self, key: PodKey) -> None:
        namespace, name = key
        self._event(key, f"Marking for deletion Pod {namespace}/{name}")
        # A pod already gone (404) is the only failure possible here; upstream logs it.
        with contextlib.suppress(errors.ApiError):
            self.store.mutate(self.pods, namespace, name, _mark_disruption_target, mode="status")
            self.store.delete(self.pods, namespace, name, {})

    def _event(self, key: PodKey, message: str) -> None:
        ref = {"kind": "Pod", "namespace": key[0], "name": key[1], "apiVersion": "v1"}
        record_event(self.store, self.registry, ref, "TaintManagerEviction", message, NAME)

    def scheduled(self) -> dict[PodKey, float]:
        """Pending deletions and when they fire (clock seconds); for tests."""
        with self.store.cond:
            return {k: w.fire_at for k, w in self._work.items()}


def _mark_disruption_target(pod: JSON) -> None:
    set_condition(pod.setdefault("status", {}), "DisruptionTarget", "True", REASON, MESSAGE)
