"""In-memory object store: one global resourceVersion, an event log, CRUD.

Semantics mirror the generic registry store of kube-apiserver backed by etcd:

* every successful write bumps one cluster-wide integer resourceVersion;
  writes that change nothing do not (and emit no watch event);
* a write carrying a stale ``metadata.resourceVersion`` is a 409 Conflict;
* DELETE of an object with finalizers only sets ``deletionTimestamp``; the
  write that empties ``finalizers`` removes it (a single DELETED event);
* a bound pod is deleted gracefully: it stays Terminating (finalizers or not)
  until its kubelet confirms — a terminal phase, or a delete with grace 0 —
  as on a real cluster, where a pod on a dead node stays until forced;
* the event log is bounded; watching from before its start is 410 Expired.

Everything is guarded by one re-entrant lock whose condition variable is
notified on every change, which is what ``wait_for`` and watches block on.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from . import errors, patches, validation
from .resources import Registry, ResourceType
from .selectors import (
    FieldRequirement,
    LabelRequirement,
    SelectorError,
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
)
from .util import JSON, clone, meta, now_rfc3339

T = TypeVar("T")
Mode = Literal["main", "status", "direct"]
# Fields of metadata only the server sets; updates cannot change them.
SYSTEM_META = (
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "resourceVersion",
    "generateName",
)
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_NAME_SUFFIX_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # apiserver's SimpleNameGenerator alphabet


@dataclass(frozen=True)
class StoredEvent:
    rv: int
    type: str  # ADDED / MODIFIED / DELETED
    rkey: tuple[str, str]
    namespace: str
    obj: JSON  # never mutated after logging
    prev: JSON | None  # state before the write; lets watches apply selectors to both sides


@dataclass(frozen=True)
class Filter:
    labels: list[LabelRequirement]
    fields: list[FieldRequirement]

    def matches(self, obj: JSON) -> bool:
        return labels_match(self.labels, obj) and fields_match(self.fields, obj)


class Store:
    def __init__(
        self, registry: Registry, history_size: int = 1000, require_namespaces: bool = False
    ) -> None:
        self.registry = registry
        self.cond = threading.Condition(threading.RLock())
        self.require_namespaces = require_namespaces
        self.closing = False
        self.bookmark_seq = 0
        self.watch_drop_seq = 0  # bumped by drop_watches(): every open stream breaks off
        self.active_watches = 0  # open watch streams; tests wait on it instead of sleeping
        self._rv = 0
        self._objects: dict[tuple[str, str], dict[tuple[str, str], JSON]] = {}
        self._log: deque[StoredEvent] = deque()
        self._history_size = history_size
        self._compacted_rv = 0  # highest RV whose event is no longer in the log
        ns_rt = registry.resolve("namespaces")
        for ns in DEFAULT_NAMESPACES:
            self.create(ns_rt, None, {"metadata": {"name": ns}})

    # ----------------------------------------------------------------- reads
    @property
    def rv(self) -> int:
        with self.cond:
            return self._rv

    def _bucket(self, rt: ResourceType) -> dict[tuple[str, str], JSON]:
        return self._objects.setdefault(rt.key, {})

    def _ns(self, rt: ResourceType, namespace: str | None) -> str:
        return (namespace or "") if rt.namespaced else ""

    def peek(self, rt: ResourceType, namespace: str | None, name: str) -> JSON | None:
        with self.cond:
            obj = self._bucket(rt).get((self._ns(rt, namespace), name))
            return rt.served(clone(obj)) if obj is not None else None

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> JSON:
        obj = self.peek(rt, namespace, name)
        if obj is None:
            raise errors.not_found(rt, name)
        return obj

    @staticmethod
    def make_filter(rt: ResourceType, label_selector: str | None, field_selector: str | None) -> Filter:
        try:
            labels = parse_label_selector(label_selector)
            fields = parse_field_selector(field_selector)
        except SelectorError as exc:
            raise errors.bad_request(str(exc)) from exc
        for req in fields:
            if req.field not in rt.field_labels:
                raise errors.bad_request(f"field label not supported: {req.field}")
        return Filter(labels, fields)

    def snapshot(self, rt: ResourceType, namespace: str | None, flt: Filter | None = None) -> list[JSON]:
        """Matching objects in etcd key order (namespace, name)."""
        with self.cond:
            items = [
                obj
                for (ns, _), obj in sorted(self._bucket(rt).items())
                if (namespace is None or ns == namespace) and (flt is None or flt.matches(obj))
            ]
            return [rt.served(obj) for obj in clone(items)]

    def list_objects(self, rt: ResourceType, namespace: str | None, flt: Filter) -> JSON:
        with self.cond:
            items = self.snapshot(rt, namespace, flt)
            rv = self._rv
        if not rt.custom:
            # Typed lists from the real server carry no per-item kind/apiVersion.
            for item in items:
                item.pop("kind", None)
                item.pop("apiVersion", None)
        return {
            "kind": rt.list_kind,
            "apiVersion": rt.api_version,
            "metadata": {"resourceVersion": str(rv)},
            "items": items,
        }

    # ---------------------------------------------------------------- writes
    def _commit(self, rt: ResourceType, ns: str, name: str, new: JSON, old: JSON | None, kind: str) -> JSON:
        """Assign the next resourceVersion, store or remove, log, wake waiters."""
        self._rv += 1
        meta(new)["resourceVersion"] = str(self._rv)
        bucket = self._bucket(rt)
        if kind == "DELETED":
            bucket.pop((ns, name), None)
        else:
            bucket[(ns, name)] = new
        self._log.append(StoredEvent(self._rv, kind, rt.key, ns, new, old))
        while len(self._log) > self._history_size:
            self._compacted_rv = self._log.popleft().rv
        self.cond.notify_all()
        return rt.served(clone(new))

    def create(
        self, rt: ResourceType, namespace: str | None, body: Any, *, keep_status: bool = False
    ) -> JSON:
        if not isinstance(body, dict) or not isinstance(body.get("metadata", {}), dict):
            raise errors.bad_request(
                "the object provided is unrecognized (must be a JSON object with metadata)"
            )
        if body.get("kind") not in (None, "", rt.kind):
            raise errors.bad_request(
                f"the kind in the data ({body['kind']}) does not match the expected kind ({rt.kind})"
            )
        with self.cond:
            src_meta = body.get("metadata") or {}
            ns = self._ns(rt, namespace)
            if rt.namespaced and src_meta.get("namespace") not in (None, "", ns):
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            if rt.namespaced and self.require_namespaces:
                self.get(self.registry.resolve("namespaces"), None, ns)
            name = str(src_meta.get("name") or "")
            if not name and src_meta.get("generateName"):
                name = self._generate_name(rt, ns, str(src_meta["generateName"]))
            validation.validate_name(rt, name)
            if (ns, name) in self._bucket(rt):
                raise errors.already_exists(rt, name)
            obj: JSON = {"kind": rt.kind, "apiVersion": rt.storage_api_version}
            obj.update({k: clone(v) for k, v in body.items() if k not in ("kind", "apiVersion")})
            m = {k: v for k, v in meta(obj).items() if k not in (*SYSTEM_META, "selfLink", "managedFields")}
            m.update(name=name, uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
            if src_meta.get("generateName"):
                m["generateName"] = src_meta["generateName"]
            if rt.namespaced:
                m["namespace"] = ns
            obj["metadata"] = m
            status = obj.get("status")
            validation.prepare_create(rt, obj)
            if keep_status and status is not None:
                obj["status"] = status
            return self._commit(rt, ns, name, obj, None, "ADDED")

    def _generate_name(self, rt: ResourceType, ns: str, prefix: str) -> str:
        for _ in range(16):
            name = prefix[:58] + "".join(random.choices(_NAME_SUFFIX_CHARS, k=5))
            if (ns, name) not in self._bucket(rt):
                return name
        raise errors.already_exists(rt, prefix)

    def update(
        self, rt: ResourceType, namespace: str | None, name: str, body: Any, mode: Mode = "main"
    ) -> JSON:
        """PUT semantics (also the tail of PATCH and of every helper write)."""
        if not isinstance(body, dict) or not isinstance(body.get("metadata", {}), dict):
            raise errors.bad_request(
                "the object provided is unrecognized (must be a JSON object with metadata)"
            )
        with self.cond:
            new_meta = body.get("metadata") or {}
            if new_meta.get("name") not in (None, "", name):
                raise errors.bad_request(
                    f"the name of the object ({new_meta['name']}) does not match the name on the URL ({name})"
                )
            ns = self._ns(rt, namespace)
            old = self._bucket(rt).get((ns, name))
            if old is None:
                raise errors.not_found(rt, name)
            if new_meta.get("resourceVersion") not in (None, "", old["metadata"]["resourceVersion"]):
                raise errors.stale(rt, name)
            if new_meta.get("uid") not in (None, "", old["metadata"]["uid"]):
                raise errors.conflict(
                    rt,
                    name,
                    f"Precondition failed: UID in precondition: {new_meta['uid']}, "
                    f"UID in object meta: {old['metadata']['uid']}",
                )
            new = self._prepare_update(rt, name, old, body, mode)
            if new == old:
                return rt.served(clone(old))  # no-op write: no new resourceVersion, no event
            m = meta(new)
            if m.get("deletionTimestamp") and not m.get("finalizers") and not _awaits_kubelet(rt, new):
                return self._commit(rt, ns, name, new, old, "DELETED")
            return self._commit(rt, ns, name, new, old, "MODIFIED")

    def _prepare_update(self, rt: ResourceType, name: str, old: JSON, body: JSON, mode: Mode) -> JSON:
        if mode == "status":
            new = clone(old)
            if "status" in body:
                new["status"] = clone(body["status"])
            else:
                new.pop("status", None)
            validation.validate_status_update(rt, name, new)
            return new
        new = {"kind": rt.kind, "apiVersion": rt.storage_api_version}
        new.update({k: clone(v) for k, v in body.items() if k not in ("kind", "apiVersion")})
        if mode == "main" and rt.status_subresource:
            if "status" in old:
                new["status"] = clone(old["status"])
            else:
                new.pop("status", None)
        m = {k: v for k, v in meta(new).items() if k not in (*SYSTEM_META, "selfLink", "managedFields")}
        m.update({k: old["metadata"][k] for k in SYSTEM_META if k in old["metadata"]})
        new["metadata"] = m
        if mode == "direct":
            # Server-internal writes (binding, kubelet, test helpers) skip the
            # update strategy: no validation, no generation bump.
            return new
        if rt.key == ("", "pods"):
            validation.validate_pod_update(rt, name, old, new)
        validation.validate_finalizers(rt, name, old, new)
        ignored = ("metadata", "status", "kind", "apiVersion")
        if {k: v for k, v in new.items() if k not in ignored} != {
            k: v for k, v in old.items() if k not in ignored
        }:
            m["generation"] = int(old["metadata"].get("generation", 1)) + 1
        return new

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        content_type: str,
        body: bytes,
        mode: Mode = "main",
    ) -> JSON:
        decoded = patches.decode(content_type, body, custom=rt.custom)
        with self.cond:
            current = self.get(rt, namespace, name)
            patched = patches.apply(decoded, current)
            _check_patched_uid(rt, name, current, patched)
            return self.update(rt, namespace, name, patched, mode)

    def mutate(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        fn: Callable[[JSON], JSON | None],
        mode: Mode = "direct",
    ) -> JSON:
        """Read-modify-write under the lock; ``fn`` edits (or returns) a copy."""
        with self.cond:
            obj = self.get(rt, namespace, name)
            result = fn(obj)
            return self.update(rt, namespace, name, obj if result is None else result, mode)

    def delete(self, rt: ResourceType, namespace: str | None, name: str, options: JSON | None = None) -> JSON:
        """Returns the response body: the object, or a Success Status."""
        opts = options or {}
        with self.cond:
            ns = self._ns(rt, namespace)
            old = self._bucket(rt).get((ns, name))
            if old is None:
                raise errors.not_found(rt, name)
            om = old["metadata"]
            pre = opts.get("preconditions") or {}
            for key, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
                if pre.get(key) and pre[key] != om.get(key):
                    raise errors.conflict(
                        rt,
                        name,
                        f"Precondition failed: {label} in precondition: {pre[key]}, "
                        f"{label} in object meta: {om.get(key)}",
                    )
            bound_pod = rt.key == ("", "pods") and bool((old.get("spec") or {}).get("nodeName"))
            grace = 0
            if bound_pod:
                # A bound pod is deleted gracefully: its kubelet stops it, then confirms
                # (a terminal phase, or its own delete with grace 0). Unbound pods go at once.
                grace = int(
                    opts.get("gracePeriodSeconds", old["spec"].get("terminationGracePeriodSeconds", 30))
                )
            terminating = bool(om.get("deletionTimestamp"))
            if terminating:
                if not (bound_pod and grace == 0):
                    return rt.served(clone(old))
                if om.get("finalizers"):  # forced: gone as soon as the finalizers are
                    new = clone(old)
                    meta(new)["deletionGracePeriodSeconds"] = 0
                    return self._commit(rt, ns, name, new, old, "MODIFIED")
                # The kubelet's confirmation (or a force delete): removed below.
            elif om.get("finalizers") or (bound_pod and grace > 0 and not _terminal(old)):
                new = clone(old)
                m = meta(new)
                m["deletionTimestamp"] = now_rfc3339(grace)
                m["deletionGracePeriodSeconds"] = grace
                m["generation"] = int(m.get("generation", 1)) + 1
                return self._commit(rt, ns, name, new, old, "MODIFIED")
            gone = self._commit(rt, ns, name, clone(old), old, "DELETED")
            if rt.return_deleted_object:
                return gone
            details: JSON = {"name": name}
            if rt.group:
                details["group"] = rt.group
            details.update(kind=rt.plural, uid=om["uid"])
            return errors.status_body(0, "", "", details, success=True)

    # ----------------------------------------------------------------- watch
    def events_after(self, cursor: int) -> list[StoredEvent]:
        """Logged events with rv > cursor (caller holds ``cond``); 410 if some were dropped."""
        if cursor < self._compacted_rv:
            oldest = self._log[0].rv if self._log else self._rv + 1
            raise errors.expired(cursor, oldest)
        out: list[StoredEvent] = []
        for ev in reversed(self._log):
            if ev.rv <= cursor:
                break
            out.append(ev)
        out.reverse()
        return out

    def compact(self) -> None:
        with self.cond:
            self._log.clear()
            self._compacted_rv = self._rv
            self.cond.notify_all()

    def request_bookmarks(self) -> None:
        with self.cond:
            self.bookmark_seq += 1
            self.cond.notify_all()

    def drop_watches(self) -> None:
        with self.cond:
            self.watch_drop_seq += 1
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closing = True
            self.cond.notify_all()

    def wait_for(self, predicate: Callable[[], T], timeout: float = 5.0) -> T:
        """Block until ``predicate()`` is truthy; re-evaluated on every store change."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                value = predicate()
                if value:
                    return value
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"kube_fake: condition not met within {timeout}s")
                self.cond.wait(remaining)


def _terminal(pod: JSON) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _awaits_kubelet(rt: ResourceType, obj: JSON) -> bool:
    """A bound pod in graceful termination stays until its kubelet confirms it stopped.

    The kubelet confirms by reporting a terminal phase (then deleting with grace 0);
    a delete with gracePeriodSeconds=0 (force) sets deletionGracePeriodSeconds to 0.
    """
    if rt.key != ("", "pods") or not (obj.get("spec") or {}).get("nodeName"):
        return False
    return int(meta(obj).get("deletionGracePeriodSeconds") or 0) > 0 and not _terminal(obj)


def _check_patched_uid(rt: ResourceType, name: str, current: JSON, patched: JSON) -> None:
    """A patch that changes the uid fails validation (422), as on kube-apiserver.

    PATCH has no uid precondition: the server builds the new object from the stored
    one and the patch, compares resourceVersions (a stale one: 409, left to `update`),
    then validates, and metadata.uid is immutable. PUT is different: its body's uid
    is a storage precondition (409, "Precondition failed"), checked in `update`.
    """
    old_meta, new_meta = meta(current), patched.get("metadata") or {}
    uid = new_meta.get("uid")
    if uid in (None, "", old_meta.get("uid")):
        return
    if new_meta.get("resourceVersion") not in (None, "", old_meta.get("resourceVersion")):
        return  # the stale resourceVersion is reported first
    raise errors.invalid(
        rt, name, [("metadata.uid", "FieldValueInvalid", f'Invalid value: "{uid}": field is immutable')]
    )
