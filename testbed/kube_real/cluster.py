"""A test's view of the real API server, with the direct-access helpers of `FakeKubeServer`.

The e2e harness drives Kubernetes through `create_object`, `get_object`,
`objects`, `update_object`, `delete_object`, `set_pod_phase`, `create_node`
and `wait_for_async`; `RealCluster` answers the same calls through the real
API server as cluster admin, so one test body runs on both backends.

What a real cluster would do and this one cannot, the test plays and says so:

- the node lifecycle controller: `create_node(ready=True)` writes the Ready
  condition and lifts the `node.kubernetes.io/not-ready:NoSchedule` taint that the
  API server's admission puts on every new Node (only that controller lifts it);
- the kubelet: `set_pod_phase` writes a pod's status; `TestKubelet`
  (testbed/kube_real/kubelet.py) runs bound pods when a test asks for one;
- the namespace controller's set-up: each test namespace gets its `default`
  ServiceAccount, which the ServiceAccount admission plugin needs before a pod.

Waits are event-driven: every resource a test reads is watched (in the test's
namespace, or cluster-wide for cluster-scoped ones), and a predicate is
re-checked on each event.

Its size (about 410 lines) is the fake's helper surface over the real API server, method
for method, so a test runs unchanged on either.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from testbed.kube_fake.builders import node_body
from testbed.kube_real.apiserver import ApiServer

if TYPE_CHECKING:
    from testbed.kube_real.kubelet import RealKubelet

Json = dict[str, Any]
T = TypeVar("T")
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
# Groups of custom resources a test may use: installed on first use (testbed/kube_real/crds.py).
CUSTOM_GROUPS = frozenset(
    {"scheduling.x-k8s.io", "jobset.x-k8s.io", "leaderworkerset.x-k8s.io", "trainer.kubeflow.org"}
)


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
        if sub is not None:
            base += f"/{sub}"
        return base


def _without_status(obj: Json) -> Json:
    return {key: value for key, value in obj.items() if key != "status"}


class ApiFailure(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        self.status = status
        super().__init__(f"{status}: {body[:500]}")


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Changes:
    """A counter bumped by every watch event, and the condition waits block on."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.count = 0

    def wait_past(self, seen: int, timeout: float) -> None:
        """Until an event after the `seen`-th, or `timeout` seconds."""
        with self.cond:
            self.cond.wait_for(lambda: self.count != seen, timeout)

    def bump(self) -> None:
        with self.cond:
            self.count += 1
            self.cond.notify_all()


class RealCluster:
    """The real API server as one test sees it: its namespace, its nodes, admin rights."""

    def __init__(self, server: ApiServer, namespace: str, *, bridge_token: str | None = None) -> None:
        self.server = server
        self.namespace = namespace
        # The token kubeconfig() gives the bridge: the chart's worker account's in the e2e stacks.
        self.bridge_token = bridge_token
        self.http = httpx.Client(
            base_url=server.url,
            verify=server.tls_context(),
            headers={"Authorization": f"Bearer {server.admin_token}"},
            timeout=30,
        )
        self._resources: dict[str, Resource] = {}
        self.changes = _Changes()
        self._watched: set[tuple[str, str | None]] = set()
        self._watch_threads: list[threading.Thread] = []
        self._closing = threading.Event()
        self.created_nodes: set[str] = set()
        self.kubelet: RealKubelet | None = None
        self.ensure_namespace(namespace)

    def start_kubelet(self) -> None:
        """Play the kubelet for this namespace's pods (testbed/kube_real/kubelet.py)."""
        from testbed.kube_real.kubelet import RealKubelet

        self.kubelet = RealKubelet(self).start()

    # -- discovery -------------------------------------------------------------

    def resource(self, name: str) -> Resource:
        """A resource by the fake's spelling: "pods", "leases.coordination.k8s.io", …"""
        if name not in self._resources:
            self._discover()
        if name not in self._resources and name.split(".", 1)[-1] in CUSTOM_GROUPS:
            from testbed.kube_real import crds

            crds.install(self)
            self._discover()
        if name not in self._resources:
            raise KeyError(f"the API server serves no resource {name!r}")
        return self._resources[name]

    def _discover(self) -> None:
        versions = [("", "v1", "/api/v1")]
        groups = self.http.get("/apis").raise_for_status().json()
        for group in groups.get("groups", []):
            preferred = group["preferredVersion"]["version"]
            versions.append((group["name"], preferred, f"/apis/{group['name']}/{preferred}"))
        for group_name, version, path in versions:
            listing = self.http.get(path)
            if listing.status_code != 200:
                continue
            for entry in listing.json().get("resources", []):
                if "/" in entry["name"]:
                    continue  # subresources
                resource = Resource(group_name, version, entry["name"], bool(entry["namespaced"]))
                key = f"{entry['name']}.{group_name}" if group_name else entry["name"]
                self._resources[key] = resource
                # The fake's short spellings for built-in groups the tests use.
                self._resources.setdefault(f"{entry['name']}.{group_name.split('.')[0]}", resource)

    # -- raw calls -------------------------------------------------------------

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        **params: Any,
    ) -> Json:
        response = self.http.request(
            method,
            path,
            content=None if body is None else json.dumps(body),
            headers={"Content-Type": content_type},
            params={k: v for k, v in params.items() if v is not None},
        )
        if response.status_code >= 300:
            raise ApiFailure(response.status_code, response.text)
        return response.json() if response.content else {}

    def ensure_namespace(self, name: str) -> None:
        for path, body in (
            ("/api/v1/namespaces", {"metadata": {"name": name}}),
            (f"/api/v1/namespaces/{name}/serviceaccounts", {"metadata": {"name": "default"}}),
        ):
            with contextlib.suppress(ApiFailure):  # 409: already there
                self.call("POST", path, body)

    # -- the FakeKubeServer surface ---------------------------------------------

    def kubeconfig(self, path: str | Path, *, token: str | None = None, namespace: str = "default") -> Path:
        return self.server.kubeconfig(Path(path), token=token or self.bridge_token, namespace=namespace)

    def objects(self, resource: str, namespace: str | None = None) -> list[Json]:
        rt = self.resource(resource)
        self._watch(rt, namespace)
        listed = self.call("GET", rt.path(namespace))
        return list(listed.get("items", []))

    def get_object(self, resource: str, name: str, namespace: str | None = None) -> Json | None:
        rt = self.resource(resource)
        self._watch(rt, namespace)
        try:
            return self.call("GET", rt.path(namespace, name))
        except ApiFailure as failure:
            if failure.status == 404:
                return None
            raise

    def create_object(
        self, resource: str, obj: Json, namespace: str | None = None, *, keep_status: bool = False
    ) -> Json:
        rt = self.resource(resource)
        ns = namespace or (obj.get("metadata") or {}).get("namespace")
        created = self.call("POST", rt.path(ns), obj)
        if keep_status and obj.get("status"):
            created["status"] = obj["status"]
            created = self.call("PUT", rt.path(ns, created["metadata"]["name"], "status"), created)
        if rt.plural == "nodes":
            self.created_nodes.add(created["metadata"]["name"])
        return created

    def update_object(
        self, resource: str, name: str, fn: Callable[[Json], Json | None], namespace: str | None = None
    ) -> Json:
        """Read-modify-write (spec through the object, status through its subresource), retried on 409."""
        rt = self.resource(resource)
        for _ in range(20):
            current = self.call("GET", rt.path(namespace, name))
            changed = copy.deepcopy(current)
            changed = fn(changed) or changed
            # Decided before any write: a status write changes metadata (resourceVersion,
            # managedFields), which must not pass for a change of the object itself.
            main_changed = _without_status(changed) != _without_status(current)
            try:
                if changed.get("status") != current.get("status"):
                    current = self.call(
                        "PUT", rt.path(namespace, name, "status"), {**current, "status": changed["status"]}
                    )
                    changed["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                if main_changed:
                    current = self.call(
                        "PUT", rt.path(namespace, name), {**changed, "status": current.get("status")}
                    )
                return current
            except ApiFailure as failure:
                if failure.status != 409:
                    raise
        raise RuntimeError(f"update of {resource} {name} kept conflicting")

    def delete_object(
        self,
        resource: str,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
    ) -> Json:
        rt = self.resource(resource)
        body = None if grace_period_seconds is None else {"gracePeriodSeconds": grace_period_seconds}
        return self.call("DELETE", rt.path(namespace, name), body)

    def set_pod_phase(
        self, namespace: str, name: str, phase: str, reason: str | None = None, message: str | None = None
    ) -> Json:
        """Play the kubelet: write `status.phase` (+ reason/message)."""

        def apply(pod: Json) -> None:
            status = pod.setdefault("status", {})
            status["phase"] = phase
            for key, value in (("reason", reason), ("message", message)):
                if value is None:
                    status.pop(key, None)
                else:
                    status[key] = value
            if phase == "Running":
                status.setdefault("startTime", now_rfc3339())

        return self.update_object("pods", name, apply, namespace)

    def create_node(
        self,
        name: str,
        *,
        cpu: str = "4",
        memory: str = "8000Mi",
        ready: bool = True,
        labels: dict[str, str] | None = None,
    ) -> Json:
        """A Node as a kubelet registers it; with `ready`, also what the node lifecycle controller
        does once it is Ready (lift the not-ready taint the API server's admission added)."""
        node = node_body(name, cpu=cpu, memory=memory, ready=ready, labels=labels, now=now_rfc3339())
        created = self.create_object("nodes", node)
        if ready:
            created = self.lift_not_ready_taint(name)
        return created

    def lift_not_ready_taint(self, name: str) -> Json:
        """Play the node lifecycle controller for a node that became Ready."""

        def lift(node: Json) -> None:
            spec = node.setdefault("spec", {})
            taints = [t for t in spec.get("taints") or [] if t.get("key") != NOT_READY_TAINT]
            if taints:
                spec["taints"] = taints
            else:
                spec.pop("taints", None)

        return self.update_object("nodes", name, lift)

    # -- waits -----------------------------------------------------------------

    def wait_for(self, predicate: Callable[[], T], timeout: float = 5.0) -> T:
        """Block until `predicate()` is truthy, re-checked on every event of a watched resource."""
        deadline = time.monotonic() + timeout
        while True:
            with self.changes.cond:
                seen = self.changes.count
            value = predicate()
            if value:
                return value
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"kube_real: condition not met within {timeout}s")
            self.changes.wait_past(seen, remaining)

    async def wait_for_async(self, predicate: Callable[[], T], timeout: float = 5.0) -> T:
        return await asyncio.to_thread(self.wait_for, predicate, timeout)

    def _watch(self, rt: Resource, namespace: str | None) -> None:
        key = (rt.path(namespace if rt.namespaced else None), None)
        if key in self._watched or self._closing.is_set():
            return
        self._watched.add(key)
        started = threading.Event()
        thread = threading.Thread(
            target=self._watch_loop, args=(key[0], started), name=f"kube-real watch {key[0]}", daemon=True
        )
        thread.start()
        self._watch_threads.append(thread)
        # The watch is open before the caller's first check: no event can slip between the two.
        started.wait(10)

    def _watch_loop(self, path: str, started: threading.Event) -> None:
        version = ""
        with httpx.Client(
            base_url=self.server.url,
            verify=self.server.tls_context(),
            headers={"Authorization": f"Bearer {self.server.admin_token}"},
            timeout=httpx.Timeout(10, read=None),
        ) as client:
            while not self._closing.is_set():
                try:
                    if not version:
                        version = client.get(path).json()["metadata"]["resourceVersion"]
                    params = {"watch": "true", "resourceVersion": version, "timeoutSeconds": "30"}
                    with client.stream("GET", path, params=params) as stream:
                        started.set()
                        for line in stream.iter_lines():
                            if self._closing.is_set():
                                return
                            if not line.strip():
                                continue
                            event = json.loads(line)
                            if event.get("type") == "ERROR":
                                version = ""  # 410: list again
                                break
                            version = event["object"]["metadata"].get("resourceVersion") or version
                            self.changes.bump()
                except (httpx.HTTPError, ValueError, KeyError):
                    if self._closing.wait(0.2):
                        return
                    version = ""

    # -- the end of a test ---------------------------------------------------------

    def stop(self) -> None:
        """Remove what the test made: its pods (finalizers dropped first, as a stuck pod needs),
        its nodes; the namespace stays (no namespace controller would ever finish deleting it)."""
        if self.kubelet is not None:
            self.kubelet.stop()
        with contextlib.suppress(ApiFailure, httpx.HTTPError):
            pods = self.call("GET", f"/api/v1/namespaces/{self.namespace}/pods").get("items", [])
            for pod in pods:
                name = pod["metadata"]["name"]
                with contextlib.suppress(ApiFailure):
                    if pod["metadata"].get("finalizers"):
                        self.call(
                            "PATCH",
                            f"/api/v1/namespaces/{self.namespace}/pods/{name}",
                            {"metadata": {"finalizers": None}},
                            content_type="application/merge-patch+json",
                        )
                    self.delete_object("pods", name, self.namespace, grace_period_seconds=0)
        for name in sorted(self.created_nodes):
            with contextlib.suppress(ApiFailure, httpx.HTTPError):
                self.call("DELETE", f"/api/v1/nodes/{name}")
        self.close()

    def close(self) -> None:
        self._closing.set()
        self.http.close()
