"""One behaviour test, two API servers: the fake, and the real kube-apiserver of testbed/kube_real.

The ``kube_api`` fixture (conftest.py) hands a test a ``KubeApi``: the server's URL, the
official client and a raw HTTP client authenticated for it, and a namespace of the test's
own. The same test body then runs against both, so a difference between the fake and
Kubernetes fails a test instead of hiding in the fake.

The fake runs bare here (no taint-eviction or disruption controller), as the real test bed
runs no controller either; a test that needs one writes what it would (a
PodDisruptionBudget's status, say). What only the fake can do (its kubelet, controllers,
fault injection, clock) stays in the fake-only tests, each saying why.

On the real server, which one test session shares: every test gets a fresh namespace
(never deleted: no namespace controller would finish it), node names start with that
namespace (``node_name``) and such nodes are deleted after the test, as are its pods.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import kubernetes.aio.client
import kubernetes.client

from testbed.kube_fake import FakeKubeServer, ResourceType
from testbed.kube_real.apiserver import ApiServer
from testbed.kube_real.cluster import ApiFailure, RealCluster

Backend = Literal["fake", "real"]
JSON = dict[str, Any]


@dataclass(frozen=True)
class CustomResource:
    """A namespaced custom resource both servers serve: a CRD on the real one, a registered
    ``custom`` kind on the fake (strategic merge patch refused, lists keep item kinds)."""

    group: str = "kube-fake.example"
    version: str = "v1"
    plural: str = "widgets"
    kind: str = "Widget"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def path(self, namespace: str, name: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}/namespaces/{namespace}/{self.plural}"
        return base if name is None else f"{base}/{name}"

    def resource_type(self) -> ResourceType:
        return ResourceType(self.group, self.version, self.plural, self.kind, True, custom=True)

    def definition(self) -> JSON:
        return {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{self.plural}.{self.group}"},
            "spec": {
                "group": self.group,
                "scope": "Namespaced",
                "names": {
                    "plural": self.plural,
                    "singular": self.kind.lower(),
                    "kind": self.kind,
                    "listKind": f"{self.kind}List",
                },
                "versions": [
                    {
                        "name": self.version,
                        "served": True,
                        "storage": True,
                        "subresources": {"status": {}},
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            }
                        },
                    }
                ],
            },
        }


WIDGETS = CustomResource()


@dataclass
class KubeApi:
    """A test's handle on one API server (see the module docstring)."""

    backend: Backend
    url: str
    namespace: str
    api_client: kubernetes.client.ApiClient
    http: httpx.Client
    fake: FakeKubeServer | None = None
    real: ApiServer | None = None
    _others: list[str] = field(default_factory=list)

    @property
    def is_fake(self) -> bool:
        return self.backend == "fake"

    @property
    def core(self) -> Any:  # the generated client's APIs are unannotated (see builders.Client)
        return kubernetes.client.CoreV1Api(self.api_client)

    def node_name(self, base: str) -> str:
        """A node name no other test of the session uses; such nodes are deleted after the test."""
        return f"{self.namespace}-{base}"

    def other_namespace(self, suffix: str = "b") -> str:
        """A second namespace of the test's own (created here)."""
        name = f"{self.namespace}-{suffix}"
        self.core.create_namespace({"metadata": {"name": name}})
        if not self.is_fake:
            # The ServiceAccount admission plugin wants it before a pod; no controller makes it.
            self.core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
        self._others.append(name)
        return name

    def raw(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        **params: str,
    ) -> httpx.Response:
        """One request as it goes on the wire, the answer as it comes back (any status)."""
        return self.http.request(
            method,
            path,
            content=None if body is None else body if isinstance(body, (str, bytes)) else json.dumps(body),
            headers={"Content-Type": content_type},
            params=params,
        )

    def aio_api_client(self) -> kubernetes.aio.client.ApiClient:
        """A ``kubernetes.aio`` client for this server; ``await client.close()`` when done."""
        return kubernetes.aio.client.ApiClient(
            _configure(kubernetes.aio.client.Configuration(), self.url, self.real)
        )

    def age_out_watch_history(self) -> None:
        """Make ``resourceVersion`` 1 too old to watch custom resources from.

        On the real server it always is: a custom resource's watch cache starts when its CRD
        is created, long after the server's own first writes. The fake keeps every event
        since its start until its history is compacted.
        """
        if self.fake is not None:
            self.fake.compact_history()


def _configure(cfg: Any, url: str, real: ApiServer | None) -> Any:
    """Point a client Configuration (sync or aio) at a server, with its credentials."""
    cfg.host = url
    if real is not None:
        cfg.ssl_ca_cert = str(real.ca_file)
        cfg.api_key = {"authorization": f"Bearer {real.admin_token}"}
    return cfg


@contextlib.contextmanager
def fake_api() -> Iterator[KubeApi]:
    with FakeKubeServer(taint_manager=False, disruption_controller=False) as server:
        namespace = f"t-{uuid.uuid4().hex[:10]}"
        api_client = server.api_client()
        http = httpx.Client(base_url=server.url, timeout=30)
        api = KubeApi("fake", server.url, namespace, api_client, http, fake=server)
        try:
            api.core.create_namespace({"metadata": {"name": namespace}})
            yield api
        finally:
            http.close()
            api_client.close()  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def real_api(server: ApiServer) -> Iterator[KubeApi]:
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    cluster = RealCluster(server, namespace)  # the namespace and its default ServiceAccount
    api_client = kubernetes.client.ApiClient(
        _configure(kubernetes.client.Configuration(), server.url, server)
    )
    api = KubeApi("real", server.url, namespace, api_client, cluster.http, real=server)
    try:
        yield api
    finally:
        try:
            _remove_what_the_test_left(api, cluster)
        finally:
            cluster.stop()
            api_client.close()  # type: ignore[no-untyped-call]


def _remove_what_the_test_left(api: KubeApi, cluster: RealCluster) -> None:
    """The test's nodes (cluster-scoped: other tests would see them) and the pods of its other
    namespaces; RealCluster.stop removes the pods of its own."""
    for node in cluster.call("GET", "/api/v1/nodes").get("items", []):
        if node["metadata"]["name"].startswith(f"{api.namespace}-"):
            cluster.created_nodes.add(node["metadata"]["name"])
    for namespace in api._others:
        for pod in cluster.call("GET", f"/api/v1/namespaces/{namespace}/pods").get("items", []):
            path = f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}"
            with contextlib.suppress(ApiFailure):
                if pod["metadata"].get("finalizers"):
                    cluster.call(
                        "PATCH",
                        path,
                        {"metadata": {"finalizers": None}},
                        content_type="application/merge-patch+json",
                    )
                cluster.call("DELETE", path, {"gracePeriodSeconds": 0})


def install_custom_resource(server: ApiServer, resource: CustomResource) -> None:
    """Create the CRD on the real server and wait until its resource is served."""
    with httpx.Client(
        base_url=server.url,
        verify=server.tls_context(),
        headers={"Authorization": f"Bearer {server.admin_token}"},
        timeout=30,
    ) as http:
        created = http.post(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=resource.definition()
        )
        if created.status_code not in (201, 409):
            raise RuntimeError(f"the CRD was refused: {created.status_code} {created.text}")
        # Established comes first; the resource's handler answers (rather than 404) a moment
        # later, and nothing announces it: ask, with a deadline, until it does.
        deadline = time.monotonic() + 30
        while http.get(resource.path("default")).status_code != 200:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{resource.plural}.{resource.group} not served 30 s after its CRD")
            time.sleep(0.05)


def uninstall_custom_resource(server: ApiServer, resource: CustomResource) -> None:
    with httpx.Client(
        base_url=server.url,
        verify=server.tls_context(),
        headers={"Authorization": f"Bearer {server.admin_token}"},
        timeout=30,
    ) as http:
        http.delete(
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{resource.plural}.{resource.group}"
        )
