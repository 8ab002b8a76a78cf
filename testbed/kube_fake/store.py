"""In-memory object store: one global resourceVersion, an event log, CRUD.

Semantics mirror the generic registry store of kube-apiserver backed by etcd:

* every successful write bumps one cluster-wide integer resourceVersion;
  writes that change nothing do not (and emit no watch event);
* a write carrying a stale ``metadata.resourceVersion`` is a 409 Conflict;
* DELETE of an object with finalizers only sets ``deletionTimestamp``; the
  write that empties ``finalizers`` removes it (a single DELETED event, which
  carries the last stored state);
* a pod is always deleted gracefully: ``deletionTimestamp`` first (MODIFIED),
  then, with grace 0 (unbound or finished pods) and no finalizers, the removal
  (DELETED); a bound pod stays Terminating (finalizers or not) until its
  kubelet confirms with a DELETE of grace 0, as on a real cluster, where a pod
  on a dead node stays until forced (a terminal phase alone does not remove it);
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

from bridge.labels import Selector

from . import errors, patches, validation
from .resources import Registry, ResourceType
from .selectors import (
    FieldRequirement,
    SelectorError,
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
)
from .util import JSON, clone, meta, now_rfc3339, parse_rfc3339, rfc3339

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
# Metadata a kind's status strategy takes from the stored object, not the /status write
# (podStatusStrategy: ownerReferences; deploymentStatusStrategy: labels).
_STATUS_KEEPS_OLD: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "pods"): ("ownerReferences",),
    ("apps", "deployments"): ("labels",),
}
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
    labels: Selector
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
        """Matching objects in etcd key order: by "namespace/name" as one string (so namespace
        "a-b" comes before "a", whose key goes on with "/")."""
        with self.cond:
            items = [
                obj
                for (ns, _), obj in sorted(self._bucket(rt).items(), key=lambda kv: f"{kv[0][0]}/{kv[0][1]}")
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
        # An unstructured (custom resource) list always says there is no more to come.
        list_meta = (
            {"continue": "", "resourceVersion": str(rv)} if rt.custom else {"resourceVersion": str(rv)}
        )
        return {"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": list_meta, "items": items}

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
        validation.check_micro_times(rt, body)  # part of decoding the body: before anything else
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
            m.update(name=name, uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339())
            if rt.generation:
                m["generation"] = 1
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
                # The body's uid is a storage precondition, failed in etcd3's words.
                raise errors.storage_precondition_failed(
                    rt, ns, name, "UID", new_meta["uid"], old["metadata"]["uid"]
                )
            new = self._prepare_update(rt, name, old, body, mode)
            if new == old:
                return rt.served(clone(old))  # no-op write: no new resourceVersion, no event
            if _deleted_by_update(new, old):
                # Store.Update deletes instead of writing: the DELETED event carries the last
                # stored state (finalizers and all), the answer the would-be object, never
                # stored, at the version it was computed from.
                self._commit(rt, ns, name, clone(old), old, "DELETED")
                answer = rt.served(clone(new))
                meta(answer)["resourceVersion"] = old["metadata"]["resourceVersion"]
                return answer
            return self._commit(rt, ns, name, new, old, "MODIFIED")

    def _prepare_update(self, rt: ResourceType, name: str, old: JSON, body: JSON, mode: Mode) -> JSON:
        if mode == "status":
            new = clone(old)
            if "status" in body:
                new["status"] = clone(body["status"])
            else:
                new.pop("status", None)
            if not rt.custom:
                # A built-in kind's status strategy resets the spec, not the metadata: labels,
                # annotations and finalizers written through /status stick, except what the
                # kind's strategy puts back (a custom resource's /status takes only status).
                kept = {
                    k: v
                    for k, v in meta(body).items()
                    if k not in (*SYSTEM_META, "selfLink", "managedFields")
                }
                kept.update({k: old["metadata"][k] for k in SYSTEM_META if k in old["metadata"]})
                for key in _STATUS_KEEPS_OLD.get(rt.key, ()):
                    kept.pop(key, None)
                    if key in old["metadata"]:
                        kept[key] = clone(old["metadata"][key])
                new["metadata"] = clone(kept)
                validation.label_namespace(rt, new)
                validation.validate_finalizers(rt, name, old, new)
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
        validation.label_namespace(rt, new)
        if mode == "direct":
            # Server-internal writes (binding, kubelet, test helpers) skip the
            # update strategy: no validation, no generation bump.
            return new
        validation.check_micro_times(rt, new)
        if rt.key == ("", "pods"):
            validation.validate_pod_update(rt, name, old, new)
        validation.validate_finalizers(rt, name, old, new)
        ignored = ("metadata", "status", "kind", "apiVersion")
        spec_changed = {k: v for k, v in new.items() if k not in ignored} != {
            k: v for k, v in old.items() if k not in ignored
        }
        if spec_changed and "generation" in old["metadata"]:
            m["generation"] = int(old["metadata"]["generation"]) + 1
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
        """Returns the response body: the object, or a Success Status.

        As the generic registry store: preconditions first (rest.BeforeDelete's
        words); a pod is always deleted gracefully (pod CheckGracefulDelete):
        deletionTimestamp = now + grace is written first, grace 0 when it is
        unbound or terminal, and with grace 0 and no finalizers it is then removed
        (two events, MODIFIED then DELETED); an object of another kind with
        finalizers is marked deleting (grace 0), one without is removed at once.
        A second DELETE of a terminating pod may only shorten its grace period.
        """
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
                    raise errors.delete_precondition_failed(rt, name, label, pre[key], om.get(key))
            is_pod = rt.key == ("", "pods")
            if om.get("deletionTimestamp"):
                return self._delete_again(rt, ns, name, old, opts)
            new = clone(old)
            m = meta(new)
            if is_pod:
                grace = _pod_grace_period(old, opts)
                m["deletionTimestamp"] = now_rfc3339(grace)
                m["deletionGracePeriodSeconds"] = grace
                _bump_generation(m)
                marked = self._commit(rt, ns, name, new, old, "MODIFIED")
                if grace > 0 or m.get("finalizers"):
                    return marked
                return self._remove(rt, ns, name, new)
            if om.get("finalizers"):
                m["deletionTimestamp"] = now_rfc3339()
                m["deletionGracePeriodSeconds"] = 0
                _bump_generation(m)
                return self._commit(rt, ns, name, new, old, "MODIFIED")
            return self._remove(rt, ns, name, old)

    def _delete_again(self, rt: ResourceType, ns: str, name: str, old: JSON, opts: JSON) -> JSON:
        """DELETE of an object already being deleted: only a shorter grace period changes it
        (the deletion time moves by the difference); reaching 0 without finalizers removes it."""
        om = old["metadata"]
        current = int(om.get("deletionGracePeriodSeconds") or 0)
        if current == 0 or "gracePeriodSeconds" not in opts or int(opts["gracePeriodSeconds"]) >= current:
            return rt.served(clone(old))
        grace = max(int(opts["gracePeriodSeconds"]), 0)
        new = clone(old)
        m = meta(new)
        requested = parse_rfc3339(str(om["deletionTimestamp"])) - current
        m["deletionTimestamp"] = rfc3339(requested + grace)
        m["deletionGracePeriodSeconds"] = grace
        marked = self._commit(rt, ns, name, new, old, "MODIFIED")
        if grace > 0 or m.get("finalizers"):
            return marked
        return self._remove(rt, ns, name, new)

    def _remove(self, rt: ResourceType, ns: str, name: str, last: JSON) -> JSON:
        """Take the object out of storage: the DELETED event, then the answer to the DELETE."""
        gone = self._commit(rt, ns, name, clone(last), last, "DELETED")
        if rt.return_deleted_object:
            return gone
        details: JSON = {"name": name}
        if rt.group:
            details["group"] = rt.group
        details.update(kind=rt.plural, uid=last["metadata"]["uid"])
        return errors.status_body(0, "", "", details, success=True)

    # ----------------------------------------------------------------- watch
    def events_after(self, cursor: int) -> list[StoredEvent]:
        """Logged events with rv > cursor (caller holds ``cond``); 410 if some were dropped."""
        if cursor < self._compacted_rv:
            # The server names the oldest version a watch may still start from (the watch
            # cache's "oldest - 1"): the last one whose event is gone.
            raise errors.expired(cursor, self._compacted_rv)
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


def _bump_generation(metadata: JSON) -> None:
    """Deletion bumps the generation of an object that has one (rest.BeforeDelete, markAsDeleting)."""
    if "generation" in metadata:
        metadata["generation"] = int(metadata["generation"]) + 1


def _terminal(pod: JSON) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _pod_grace_period(pod: JSON, opts: JSON) -> int:
    """podStrategy.CheckGracefulDelete: the request's grace period, else the pod's; 0 for a pod
    not scheduled or already terminated (nothing runs it), 1 for a negative one."""
    spec = pod.get("spec") or {}
    if "gracePeriodSeconds" in opts and opts["gracePeriodSeconds"] is not None:
        grace = int(opts["gracePeriodSeconds"])
    else:
        grace = int(spec.get("terminationGracePeriodSeconds", 30))
    if not spec.get("nodeName") or _terminal(pod):
        grace = 0
    return 1 if grace < 0 else grace


def _deleted_by_update(new: JSON, old: JSON) -> bool:
    """Store.shouldDeleteDuringUpdate: the write takes the last finalizer off an object being
    deleted whose grace period is over (0). A bound pod in graceful deletion keeps its grace
    period until its kubelet confirms with a DELETE of grace 0 (see ``delete``)."""
    old_meta = old.get("metadata") or {}
    if meta(new).get("finalizers") or not old_meta.get("deletionTimestamp"):
        return False
    return int(old_meta.get("deletionGracePeriodSeconds") or 0) == 0


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
    # Twice, as kube-apiserver lists it: rest.BeforeUpdate validates the object meta update,
    # then the kind's ValidateUpdate does so again (the message names it once).
    cause = ("metadata.uid", "FieldValueInvalid", f'Invalid value: "{uid}": field is immutable')
    raise errors.invalid(rt, name, [cause, cause])
