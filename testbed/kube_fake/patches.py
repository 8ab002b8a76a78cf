"""The three PATCH flavours the apiserver accepts, applied to plain JSON.

* ``application/json-patch+json``: RFC 6902 via the ``jsonpatch`` package.
* ``application/merge-patch+json``: RFC 7386.
* ``application/strategic-merge-patch+json``: RFC 7386 plus the list rules
  that the built-in Go types declare with ``patchStrategy``/``patchMergeKey``.
  Which lists merge is decided by field name (table below), which is how the
  built-in kinds we serve happen to be declared; every other list is atomic
  (replaced), e.g. ``spec.tolerations``, ``spec.taints``,
  ``status.containerStatuses`` - exactly as on a real server.
  A merged list comes in the patch's order (``$setElementOrder/<field>``'s when
  given), the items only the server had interleaved where they were.
  Directives: ``$patch: delete|replace|merge`` (maps and keyed list items),
  ``$deleteFromPrimitiveList/<field>`` and ``$setElementOrder/<field>``.
  ``$retainKeys`` is rejected.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

import jsonpatch

from . import errors

JSON = dict[str, Any]

# field name -> patchMergeKey, from k8s.io/api core/apps/batch/meta types.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "schedulingGates": "name",
    "resourceClaims": "name",
    "topologySpreadConstraints": "topologyKey",
    "hostAliases": "ip",
    "conditions": "type",
    "addresses": "type",
    "ownerReferences": "uid",
    "podIPs": "ip",
    "hostIPs": "ip",
    "resourceClaimStatuses": "name",  # PodStatus and PodGroupStatus
    "reservedFor": "uid",  # ResourceClaimStatus
}
# Primitive lists with patchStrategy=merge: union, order kept, no duplicates.
MERGE_SETS = frozenset({"finalizers"})


JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


@dataclass(frozen=True)
class Patch:
    media_type: str
    document: Any


def _json_type(value: Any) -> str:
    """How Go's encoding/json names a JSON value in an unmarshal error."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, bool):
        return "bool"
    return "string" if isinstance(value, str) else "number"


def decode(content_type: str, body: bytes, *, custom: bool) -> Patch:
    """Check the media type (415 like the apiserver) and parse the body (400)."""
    media_type = content_type.split(";", 1)[0].strip().lower()
    if custom and media_type not in (JSON_PATCH, MERGE_PATCH):
        # CRDs have no Go struct tags to drive strategic merge; their handler names what it takes.
        raise errors.unsupported_media_type(
            errors.CUSTOM_PATCH_MEDIA_TYPES + ", application/apply-patch+yaml"
        )
    if "apply-patch" in media_type:
        raise errors.unsupported_media_type(
            errors.PATCH_MEDIA_TYPES, "kube_fake does not implement server-side apply"
        )
    if media_type not in (JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH):
        # Built-in kinds: the router refuses the request before any handler (go-restful's answer).
        raise errors.ApiError(415, "UnsupportedMediaType", "415: Unsupported Media Type", {})
    # The JSON and merge patch handlers prefix their decoding errors; strategic merge does not.
    prefix = "" if media_type == STRATEGIC_PATCH else "error decoding patch: "
    try:
        document = json.loads(body or b"null")
    except ValueError as exc:
        raise errors.bad_request(f"{prefix}{exc}") from exc
    wanted = "[]handlers.jsonPatchOp" if media_type == JSON_PATCH else "map[string]interface {}"
    if document is not None and not isinstance(document, list if media_type == JSON_PATCH else dict):
        raise errors.bad_request(
            f"{prefix}json: cannot unmarshal {_json_type(document)} into Go value of type {wanted}"
        )
    return Patch(media_type, document)


def apply(patch: Patch, current: JSON) -> JSON:
    """The patched object; 400 for a malformed document, 422 if it cannot apply."""
    try:
        if patch.media_type == JSON_PATCH:
            return apply_json_patch(current, patch.document)
        if patch.media_type == MERGE_PATCH:
            if not isinstance(patch.document, dict):
                raise PatchFormatError("merge patch must be a JSON object")
            result: JSON = apply_merge_patch(current, patch.document)
            return result
        return apply_strategic_merge_patch(current, patch.document)
    except PatchFormatError as exc:
        raise errors.bad_request(str(exc)) from exc
    except PatchError as exc:
        raise errors.patch_invalid(str(exc)) from exc


class PatchError(ValueError):
    """The patch could not be applied (answered as 422 Invalid)."""


class PatchFormatError(ValueError):
    """The patch document itself is malformed (answered as 400 BadRequest)."""


def apply_json_patch(doc: JSON, ops: Any) -> JSON:
    if not isinstance(ops, list):
        raise PatchFormatError("json patch must be a JSON array of operations")
    try:
        result = jsonpatch.JsonPatch(ops).apply(doc)
    except jsonpatch.InvalidJsonPatch as exc:
        raise PatchError(f"invalid json patch: {exc}") from exc
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
        # JsonPatchTestFailed, JsonPatchConflict and bad pointers: all 422 upstream.
        raise PatchError(str(exc)) from exc
    if not isinstance(result, dict):
        raise PatchError("json patch must produce a JSON object")
    return result


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


def apply_strategic_merge_patch(target: JSON, patch: Any) -> JSON:
    if not isinstance(patch, dict):
        raise PatchFormatError("strategic merge patch must be a JSON object")
    result = _merge_map(target, patch)
    if not isinstance(result, dict):
        raise PatchError("strategic merge patch deleted the whole object")
    return result


def _merge_map(target: Any, patch: JSON) -> JSON | None:
    directive = patch.get("$patch")
    if directive == "delete":
        return None
    base: JSON = {} if directive == "replace" or not isinstance(target, dict) else copy.deepcopy(target)
    if directive not in (None, "replace", "merge"):
        raise PatchError(f"unknown patch type: {directive!r} in map")
    for key, value in patch.items():
        if key == "$patch" or key.startswith("$setElementOrder/"):
            continue
        if key == "$retainKeys":
            raise PatchError("kube_fake: the $retainKeys directive is not supported")
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if not isinstance(value, list):
                raise PatchError(f"{key} must be a list")
            base[field] = [v for v in base.get(field) or [] if v not in value]
            continue
        if key.startswith("$"):
            raise PatchError(f"kube_fake: unsupported strategic merge directive {key!r}")
        if value is None:
            base.pop(key, None)
        elif isinstance(value, dict):
            merged = _merge_map(base.get(key), value)
            if merged is None:
                base.pop(key, None)
            else:
                base[key] = merged
        elif isinstance(value, list):
            base[key] = _merge_list(key, base.get(key), value, patch.get(f"$setElementOrder/{key}"))
        else:
            base[key] = copy.deepcopy(value)
    # A $deleteFromPrimitiveList that emptied a field leaves nothing behind,
    # like the Go implementation which drops empty lists it produced.
    for key in [k for k, v in base.items() if v == [] and f"$deleteFromPrimitiveList/{k}" in patch]:
        del base[key]
    return base


def _merge_list(field: str, target: Any, patch: list[Any], order: Any = None) -> list[Any]:
    current = copy.deepcopy(target) if isinstance(target, list) else []
    original = copy.deepcopy(current)
    if any(isinstance(p, dict) and p.get("$patch") == "replace" and len(p) == 1 for p in patch):
        return [copy.deepcopy(p) for p in patch if not (isinstance(p, dict) and p.get("$patch") == "replace")]
    if field in MERGE_SETS:
        for item in patch:
            if item not in current:
                current.append(copy.deepcopy(item))
        return _in_patch_order(current, original, patch if order is None else order, None)
    merge_key = MERGE_KEYS.get(field)
    if merge_key is None:
        return copy.deepcopy(patch)  # atomic list: replaced wholesale
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise PatchError(f"map: {item!r} does not contain declared merge key: {merge_key}")
        idx = next(
            (
                i
                for i, cur in enumerate(current)
                if isinstance(cur, dict) and cur.get(merge_key) == item[merge_key]
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if idx is not None:
                del current[idx]
            continue
        if idx is None:
            added = _merge_map({}, item)
            if added is not None:
                current.append(added)
        else:
            merged = _merge_map(current[idx], item)
            if merged is None:
                del current[idx]
            else:
                current[idx] = merged
    return _in_patch_order(current, original, patch if order is None else order, merge_key)


def _in_patch_order(merged: list[Any], original: list[Any], order: Any, merge_key: str | None) -> list[Any]:
    """strategicpatch's normalizeElementOrder: the items the patch names (in ``order``: its
    ``$setElementOrder`` list, else the patch's own) come in that order; the items only the
    server had keep theirs, and go before a patch item the server had after them."""

    def key(item: Any) -> Any:
        return item.get(merge_key) if merge_key is not None and isinstance(item, dict) else item

    def position(keys: list[Any], item: Any) -> int:
        return keys.index(key(item)) if key(item) in keys else -1

    order_keys = [key(o) for o in order] if isinstance(order, list) else []
    original_keys = [key(o) for o in original]
    named = sorted((m for m in merged if key(m) in order_keys), key=lambda m: position(order_keys, m))
    server_only = [m for m in merged if key(m) not in order_keys]
    result: list[Any] = []
    i = j = 0
    while i < len(server_only) or j < len(named):
        if j >= len(named):
            result.append(server_only[i])
            i += 1
        elif i >= len(server_only):
            result.append(named[j])
            j += 1
        else:
            left, right = position(original_keys, server_only[i]), position(original_keys, named[j])
            if 0 <= left < right:
                result.append(server_only[i])
                i += 1
            else:
                result.append(named[j])
                j += 1
    return result
