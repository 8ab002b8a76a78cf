"""Small helpers shared by the store, the HTTP layer and the kubelet."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any, TypeVar

JSON = dict[str, Any]
T = TypeVar("T")


def now_rfc3339(offset_seconds: float = 0.0) -> str:
    """Second-precision UTC timestamp, the format of metav1.Time."""
    moment = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=offset_seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339(timestamp: float) -> str:
    """A POSIX timestamp in the format of metav1.Time."""
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(value: str) -> float:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def clone(value: T) -> T:
    """Stored objects are never mutated in place; everything handed out is a copy."""
    return copy.deepcopy(value)


def meta(obj: JSON) -> JSON:
    m = obj.get("metadata")
    if not isinstance(m, dict):
        m = {}
        obj["metadata"] = m
    return m
