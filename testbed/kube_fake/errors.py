"""Kubernetes ``Status`` bodies and the exception that carries them.

Every failure the fake answers with is a ``kind: Status`` object shaped exactly
like the ones k8s.io/apimachinery/pkg/api/errors builds, because the official
client's pydantic models reject unknown fields and callers branch on
``reason``/``code``; except, as on a real server, a path no API serves (an
unserved group), which gets the router's plain-text ``404 page not found``
(handler.py).
"""

from __future__ import annotations

from typing import Any

from .resources import ResourceType

JSON = dict[str, Any]

# Reason used for a bare HTTP code when no better one is known (mirrors
# apimachinery's NewGenericServerResponse table).
DEFAULT_REASONS: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

DEFAULT_MESSAGES: dict[int, str] = {
    400: "the server rejected our request for an unknown reason",
    404: "the server could not find the requested resource",
    405: "the server does not allow this method on the requested resource",
    409: "the server reported a conflict",
    422: "the server rejected our request due to an error in our request",
    429: "the server has received too many requests and has asked us to try again later",
    500: "an error on the server has prevented the request from succeeding",
    503: "the server is currently unable to handle the request",
    504: (
        "the server was unable to return a response in the time allotted, "
        "but may still be processing the request"
    ),
}

PATCH_MEDIA_TYPES = (
    "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json"
)
CUSTOM_PATCH_MEDIA_TYPES = "application/json-patch+json, application/merge-patch+json"


def status_body(
    code: int, reason: str, message: str, details: JSON | None = None, *, success: bool = False
) -> JSON:
    """A ``v1.Status`` in the real server's field order."""
    body: JSON = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if success else "Failure",
    }
    if message:
        body["message"] = message
    if reason:
        body["reason"] = reason
    if details is not None:
        body["details"] = details
    if code:
        body["code"] = code
    return body


class ApiError(Exception):
    """Raised anywhere in the fake; the HTTP layer turns it into a Status reply."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: JSON | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def status(self) -> JSON:
        return status_body(self.code, self.reason, self.message, self.details)


def _details(rt: ResourceType, name: str, **extra: Any) -> JSON:
    details: JSON = {"name": name}
    if rt.group:
        details["group"] = rt.group
    details["kind"] = rt.plural  # apimachinery really puts the resource here
    details.update(extra)
    return details


def generic(code: int, reason: str | None = None, message: str | None = None) -> ApiError:
    return ApiError(
        code,
        reason if reason is not None else DEFAULT_REASONS.get(code, "Unknown"),
        message
        if message is not None
        else DEFAULT_MESSAGES.get(code, f"the server responded with the status code {code}"),
        {},
    )


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.qualified} "{name}" not found', _details(rt, name))


def already_exists(rt: ResourceType, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{rt.qualified} "{name}" already exists', _details(rt, name))


def conflict(rt: ResourceType, name: str, why: str, *, qualified: str | None = None) -> ApiError:
    what = qualified or rt.qualified
    details = _details(rt, name)
    if qualified:
        details["kind"] = qualified.split(".", 1)[0]
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {what} "{name}": {why}', details)


def stale(rt: ResourceType, name: str) -> ApiError:
    return conflict(
        rt,
        name,
        "the object has been modified; please apply your changes to the latest version and try again",
    )


def _storage_key(rt: ResourceType, namespace: str, name: str) -> str:
    """Where kube-apiserver keeps the object in etcd (quoted in storage errors)."""
    prefix = f"{rt.group}/{rt.plural}" if rt.custom else {"nodes": "minions"}.get(rt.plural, rt.plural)
    return f"/registry/{prefix}/{namespace}/{name}" if namespace else f"/registry/{prefix}/{name}"


def storage_precondition_failed(
    rt: ResourceType, namespace: str, name: str, label: str, wanted: Any, found: Any
) -> ApiError:
    """A write whose uid/resourceVersion precondition fails in etcd3's GuaranteedUpdate
    (a PUT naming another uid, a Binding's preconditions): 409 with the storage error's text."""
    return conflict(
        rt,
        name,
        f"StorageError: invalid object, Code: 4, Key: {_storage_key(rt, namespace, name)}, "
        f"ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: {label} in precondition: "
        f"{wanted}, {label} in object meta: {found}",
    )


def delete_precondition_failed(rt: ResourceType, name: str, label: str, wanted: Any, found: Any) -> ApiError:
    """rest.BeforeDelete's early precondition check (DELETE, and eviction's delete): it names the
    object by Kind.group, not by resource."""
    why = (
        "The object might have been deleted and then recreated"
        if label == "UID"
        else "The object might have been modified"
    )
    return conflict(
        rt,
        name,
        f"the {label} in the precondition ({wanted}) does not match the {label} in record ({found}). {why}",
        qualified=f"{rt.kind}.{rt.group}" if rt.group else rt.kind,
    )


def invalid(rt: ResourceType, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """``causes`` are (field, cause reason, message) triples, as in field.ErrorList; the message
    names each distinct one once (ErrorList.ToAggregate), the causes list them all."""
    rendered = list(dict.fromkeys(f"{field}: {msg}" for field, _, msg in causes))
    summary = rendered[0] if len(rendered) == 1 else "[" + ", ".join(rendered) + "]"
    kind = f"{rt.kind}.{rt.group}" if rt.group else rt.kind
    details: JSON = {"name": name}
    if rt.group:
        details["group"] = rt.group
    details["kind"] = rt.kind
    details["causes"] = [{"reason": r, "message": m, "field": f} for f, r, m in causes]
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {summary}', details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def method_not_allowed() -> ApiError:
    return generic(405)


def unsupported_media_type(accepted: str, note: str = "") -> ApiError:
    msg = f"the body of the request was in an unknown format - accepted media types include: {accepted}"
    if note:
        msg += f" ({note})"
    return ApiError(415, "UnsupportedMediaType", msg)


def patch_invalid(detail: str) -> ApiError:
    # The real server discards the RFC 6902 error text; we keep it as a cause
    # so a failing test says what went wrong.
    return ApiError(422, "Invalid", DEFAULT_MESSAGES[422], {"causes": [{"message": detail}]})


def unexpected(message: str) -> ApiError:
    """An error the server did not shape into a Status (a validation ErrorList handed back as
    is): 500 with the text and no reason."""
    return ApiError(500, "", message)


def expired(requested: int, oldest: int) -> ApiError:
    return ApiError(410, "Expired", f"too old resource version: {requested} ({oldest})")
