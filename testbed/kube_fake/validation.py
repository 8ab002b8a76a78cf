"""The slice of apiserver defaulting and validation the bridge can trip over.

Implemented because getting them wrong in a fake hides real bugs:
object names must be RFC 1123, pods get the defaults a real server adds,
and pod specs are (almost) immutable after creation, so code that tries to
"schedule" by patching ``spec.nodeName`` fails here just as it would on a
cluster.  Admission plugins (service account token volume, default
tolerations) are not simulated.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from . import dra, errors
from .resources import ResourceType

JSON = dict[str, Any]

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
    r"validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
POD_UPDATE_FORBIDDEN = (
    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to "
    "existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
    "previously negative)"
)


def validate_name(rt: ResourceType, name: str) -> None:
    if not name:
        raise errors.invalid(
            rt,
            "",
            [("metadata.name", "FieldValueRequired", "Required value: name or generateName is required")],
        )
    if rt.plural == "namespaces":
        ok, msg, limit = bool(_LABEL.match(name)), _LABEL_MSG, 63
    else:
        ok, msg, limit = bool(_SUBDOMAIN.match(name)), _SUBDOMAIN_MSG, 253
    if not ok or len(name) > limit:
        raise errors.invalid(
            rt, name, [("metadata.name", "FieldValueInvalid", f'Invalid value: "{name}": {msg}')]
        )


def _default_container(c: JSON) -> None:
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    c.setdefault("resources", {})
    if "imagePullPolicy" not in c:
        image = str(c.get("image", ""))
        tag = image.rsplit("/", 1)[-1]
        c["imagePullPolicy"] = "Always" if ":" not in tag or tag.endswith(":latest") else "IfNotPresent"


def default_pod_spec(spec: JSON) -> None:
    """SetDefaults_PodSpec and friends (the fields clients commonly read back)."""
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or []:
            if isinstance(c, dict):
                _default_container(c)


def qos_class(spec: JSON) -> str:
    containers = [
        c for c in (spec.get("containers") or []) + (spec.get("initContainers") or []) if isinstance(c, dict)
    ]
    any_set = False
    guaranteed = True
    for c in containers:
        res = c.get("resources") or {}
        requests, limits = res.get("requests") or {}, res.get("limits") or {}
        if requests or limits:
            any_set = True
        for r in ("cpu", "memory"):
            if r not in limits or requests.get(r, limits[r]) != limits[r]:
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def prepare_pod_create(rt: ResourceType, obj: JSON) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict) or not spec.get("containers"):
        name = str((obj.get("metadata") or {}).get("name", ""))
        raise errors.invalid(rt, name, [("spec.containers", "FieldValueRequired", "Required value")])
    default_pod_spec(spec)
    # PodStrategy.PrepareForCreate throws away client-supplied status.
    obj["status"] = {"phase": "Pending", "qosClass": qos_class(spec)}


# metav1.MicroTime fields, which the server decodes with a fixed layout: six fractional
# digits, always. (metav1.Time fields take any RFC 3339 time and are not checked.)
MICRO_TIME_FIELDS: dict[tuple[str, str], tuple[tuple[str, ...], ...]] = {
    ("coordination.k8s.io", "leases"): (("spec", "acquireTime"), ("spec", "renewTime")),
    ("events.k8s.io", "events"): (("eventTime",), ("series", "lastObservedTime")),
    ("", "events"): (("eventTime",), ("series", "lastObservedTime")),
}
_MICRO_TIME_LAYOUT = "2006-01-02T15:04:05.000000Z07:00"
_MICRO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)")
_SECONDS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


def check_micro_times(rt: ResourceType, obj: JSON) -> None:
    """A MicroTime the server cannot parse fails decoding of the whole body (400)."""
    for path in MICRO_TIME_FIELDS.get(rt.key, ()):
        value: Any = obj
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        if value is None or (isinstance(value, str) and _MICRO_TIME.fullmatch(value)):
            continue
        text = str(value)
        # Go's time.Parse names the first element that did not match (approximated past the seconds).
        seconds = _SECONDS.match(text)
        rest, element = (text[seconds.end() :], ".000000") if seconds else (text, "2006")
        version = rt.api_version.rsplit("/", 1)[-1]
        raise errors.bad_request(
            f'{rt.kind} in version "{version}" cannot be handled as a {rt.kind}: parsing time "{text}" as '
            f'"{_MICRO_TIME_LAYOUT}": cannot parse "{rest}" as "{element}"'
        )


NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def label_namespace(rt: ResourceType, obj: JSON) -> None:
    """The namespace strategy labels every namespace with its name (on create and update)."""
    if rt.key == ("", "namespaces"):
        metadata = obj.setdefault("metadata", {})
        metadata["labels"] = {**(metadata.get("labels") or {}), NAMESPACE_NAME_LABEL: metadata.get("name")}


def prepare_create(rt: ResourceType, obj: JSON) -> None:
    if rt.reset_status_on_create and rt.status_subresource:
        obj.pop("status", None)
    if rt.key == ("", "pods"):
        prepare_pod_create(rt, obj)
    elif rt.key == ("", "nodes"):
        obj.setdefault("spec", {})  # a non-pointer struct: always serialised
    elif rt.key == ("", "namespaces"):
        obj.setdefault("spec", {"finalizers": ["kubernetes"]})
        obj["status"] = {"phase": "Active"}
        label_namespace(rt, obj)
    elif rt.key == ("policy", "poddisruptionbudgets"):
        # PrepareForCreate resets status to the zero struct (its counts are not omitempty).
        obj["status"] = {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}
    elif rt.group == "resource.k8s.io":
        dra.prepare_create(rt, obj)


def validate_status_update(rt: ResourceType, name: str, new: JSON) -> None:
    """The status-strategy checks the fake has (pods/status, resourceclaims/status)."""
    if rt.key == ("", "pods"):
        dra.validate_pod_claim_statuses(rt, name, new)
        dra.validate_pod_extended_resource_claim_status(rt, name, new)
    elif rt.key == ("resource.k8s.io", "resourceclaims"):
        dra.validate_claim_status(rt, name, new)


def _names(items: Any, key: str = "name") -> list[Any]:
    return [i.get(key) for i in items or [] if isinstance(i, dict)]


def validate_pod_update(rt: ResourceType, name: str, old: JSON, new: JSON) -> None:
    """ValidatePodUpdate's immutability rule, with its documented exceptions."""
    old_spec: JSON = copy.deepcopy(old.get("spec") or {})
    new_spec: JSON = copy.deepcopy(new.get("spec") or {})
    default_pod_spec(new_spec)
    new["spec"] = copy.deepcopy(new_spec)
    causes: list[tuple[str, str, str]] = []

    for key in ("containers", "initContainers"):
        olds, news = old_spec.get(key) or [], new_spec.get(key) or []
        if _names(olds) == _names(news):
            for o, n in zip(olds, news, strict=True):
                if isinstance(n, dict) and isinstance(o, dict) and "image" in o:
                    n["image"] = o["image"]
    for key in ("activeDeadlineSeconds",):
        if key in new_spec and (key not in old_spec or new_spec[key] <= old_spec[key]):
            old_spec[key] = new_spec[key]
    if (
        int(old_spec.get("terminationGracePeriodSeconds", 0)) < 0
        and new_spec.get("terminationGracePeriodSeconds") == 1
    ):
        old_spec["terminationGracePeriodSeconds"] = 1

    old_tol, new_tol = old_spec.get("tolerations") or [], new_spec.get("tolerations") or []
    if all(t in new_tol for t in old_tol):
        old_spec["tolerations"] = new_tol
    else:
        causes.append(
            (
                "spec.tolerations",
                "FieldValueForbidden",
                "Forbidden: existing toleration can not be modified except its tolerationSeconds",
            )
        )
        old_spec["tolerations"] = new_tol

    gated = bool(old_spec.get("schedulingGates"))
    old_gates, new_gates = _names(old_spec.get("schedulingGates")), _names(new_spec.get("schedulingGates"))
    added = [g for g in new_gates if g not in old_gates]
    if added:
        causes.append(
            (
                "spec.schedulingGates",
                "FieldValueForbidden",
                f"Forbidden: only deletion is allowed, but found new scheduling gate '{added[0]}'",
            )
        )
    old_spec["schedulingGates"] = new_spec.get("schedulingGates")
    if gated:
        # Mutable scheduling directives while gated (KEP-3838): nodeSelector may
        # only gain entries; affinity changes are accepted without the
        # "must narrow" check.
        old_sel, new_sel = old_spec.get("nodeSelector") or {}, new_spec.get("nodeSelector") or {}
        if all(new_sel.get(k) == v for k, v in old_sel.items()):
            old_spec["nodeSelector"] = new_spec.get("nodeSelector")
        old_spec["affinity"] = new_spec.get("affinity")
    for spec in (old_spec, new_spec):
        for key in ("tolerations", "schedulingGates", "nodeSelector", "affinity"):
            if spec.get(key) in (None, [], {}):
                spec.pop(key, None)
    if old_spec != new_spec and not causes:
        causes.append(("spec", "FieldValueForbidden", POD_UPDATE_FORBIDDEN))
    if causes:
        raise errors.invalid(rt, name, causes)


def validate_finalizers(rt: ResourceType, name: str, old: JSON, new: JSON) -> None:
    old_meta, new_meta = old.get("metadata") or {}, new.get("metadata") or {}
    if not old_meta.get("deletionTimestamp"):
        return
    added = [f for f in new_meta.get("finalizers") or [] if f not in (old_meta.get("finalizers") or [])]
    if added:
        go_list = "[]string{" + ", ".join(f'"{f}"' for f in added) + "}"
        raise errors.invalid(
            rt,
            name,
            [
                (
                    "metadata.finalizers",
                    "FieldValueForbidden",
                    "Forbidden: no new finalizers can be added if the object is being deleted, "
                    f"found new finalizers {go_list}",
                )
            ],
        )
