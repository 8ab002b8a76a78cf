"""Plain-dict object builders and error helpers for tests using the fake."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import config as _config
from kubernetes import watch as _watch
from kubernetes.aio import config as _aio_config
from kubernetes.aio import watch as _aio_watch

# The generated client declares every model field Optional and every request
# body as a model class, while these tests send plain dicts and read fields
# the fake guarantees; so tests hold client objects (APIs, models, watches)
# as ``Any`` instead of scattering asserts and casts.
Client = Any
# The client's watch and config modules are unannotated; re-exported as Any.
watch: Client = _watch
aio_watch: Client = _aio_watch
kube_config: Client = _config
aio_kube_config: Client = _aio_config


def pod_body(name: str, *, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A minimal valid Pod as a plain dict (what most tests send)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}], **spec},
    }


def node_body(
    name: str, *, cpu: str, memory: str, ready: bool, labels: dict[str, str] | None, now: str
) -> dict[str, Any]:
    """A Node as a kubelet registers it: capacity, the Ready condition, addresses."""
    resources = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "100Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **(labels or {})},
        },
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "KubeletReady" if ready else "KubeletNotReady",
                    "message": "kubelet is posting ready status" if ready else "kubelet stopped posting",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
        },
    }


def error_body(exc: Any) -> dict[str, Any]:
    """The Status JSON carried by a kubernetes ApiException."""
    body = json.loads(exc.body)
    assert isinstance(body, dict)
    return body


def header(exc: Any, name: str) -> str:
    """A response header of an ApiException (``headers`` is Optional in the client)."""
    headers = exc.headers
    assert headers is not None
    return str(headers[name])
