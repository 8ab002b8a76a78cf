"""AdmissionReview `admission.k8s.io/v1`: the request the API server sends, the answer it expects.

Unknown fields are ignored (the API server adds fields over releases); the
fields the webhook relies on are checked, so a malformed review is a clear 400
instead of an exception deep inside a decision.
"""

import base64
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

API_VERSION = "admission.k8s.io/v1"
Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
Json = dict[str, Any]


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="ignore",
        frozen=True,
    )


class GroupVersionKind(_Model):
    group: str = ""
    version: str = ""
    kind: str = ""

    def __str__(self) -> str:
        return f"{self.group}/{self.version} {self.kind}" if self.group else f"{self.version} {self.kind}"


class GroupVersionResource(_Model):
    group: str = ""
    version: str = ""
    resource: str = ""


class UserInfo(_Model):
    username: str = ""
    uid: str = ""
    groups: list[str] = Field(default_factory=list)


class AdmissionRequest(_Model):
    uid: str = Field(min_length=1)
    kind: GroupVersionKind
    resource: GroupVersionResource
    sub_resource: str = ""
    name: str = ""
    namespace: str = ""
    operation: Operation
    user_info: UserInfo = Field(default_factory=UserInfo)
    # Raw JSON on purpose: decisions read a few fields of any kind of object,
    # and the typed pieces they need are checked where they are read.
    object: Json | None = None
    old_object: Json | None = None
    dry_run: bool = False

    @property
    def display_name(self) -> str:
        name = self.name or str(((self.object or {}).get("metadata") or {}).get("generateName") or "") + "*"
        return f"{self.namespace}/{name}" if self.namespace else name


class AdmissionReview(_Model):
    api_version: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


class Status(_Model):
    code: int
    message: str
    reason: str = ""


class AdmissionResponse(_Model):
    uid: str
    allowed: bool
    status: Status | None = None
    patch: str | None = None
    patch_type: Literal["JSONPatch"] | None = None
    warnings: list[str] | None = None

    @classmethod
    def allow(
        cls, uid: str, *, patch: list[Json] | None = None, warnings: list[str] | None = None
    ) -> "AdmissionResponse":
        if not patch:
            return cls(uid=uid, allowed=True, warnings=warnings or None)
        encoded = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
        return cls(uid=uid, allowed=True, patch=encoded, patch_type="JSONPatch", warnings=warnings or None)

    @classmethod
    def deny(
        cls, uid: str, message: str, *, code: int = 403, warnings: list[str] | None = None
    ) -> "AdmissionResponse":
        reason = {400: "BadRequest", 403: "Forbidden", 422: "Invalid"}.get(code, "Forbidden")
        return cls(
            uid=uid,
            allowed=False,
            status=Status(code=code, message=message, reason=reason),
            warnings=warnings or None,
        )

    def review(self) -> Json:
        """The full AdmissionReview the API server expects back."""
        return {
            "apiVersion": API_VERSION,
            "kind": "AdmissionReview",
            "response": self.model_dump(exclude_none=True),
        }
