"""What the e2e harness asks of a Kubernetes backend: the fake API server or the real one.

`FakeKubeServer` (testbed/kube_fake) and `RealCluster` (testbed/kube_real) both
answer it, so one test body runs on either. What only the fake can do (fault
injection, holding a request, its clock) stays on `FakeKubeServer` and is
reached through the harness's `fake` property, which such tests use alone.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from testbed.kube_fake import FakeKubeServer

Json = dict[str, Any]
T = TypeVar("T")


class KubeBackend(Protocol):
    def kubeconfig(
        self, path: str | Path, *, token: str | None = None, namespace: str = "default"
    ) -> Path: ...

    def objects(self, resource: str, namespace: str | None = None) -> list[Json]: ...

    def get_object(self, resource: str, name: str, namespace: str | None = None) -> Json | None: ...

    def create_object(
        self, resource: str, obj: Json, namespace: str | None = None, *, keep_status: bool = False
    ) -> Json: ...

    def update_object(
        self, resource: str, name: str, fn: Callable[[Json], Json | None], namespace: str | None = None
    ) -> Json: ...

    def delete_object(
        self,
        resource: str,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
    ) -> Json: ...

    def set_pod_phase(
        self, namespace: str, name: str, phase: str, reason: str | None = None, message: str | None = None
    ) -> Json: ...

    def create_node(
        self,
        name: str,
        *,
        cpu: str = "4",
        memory: str = "8000Mi",
        ready: bool = True,
        labels: dict[str, str] | None = None,
    ) -> Json: ...

    async def wait_for_async(self, predicate: Callable[[], T], timeout: float = 5.0) -> T: ...

    def stop(self) -> None: ...


def fake_of(kube: KubeBackend) -> FakeKubeServer:
    """The fake API server behind a test's Kubernetes, for what only it can do (faults, holds,
    its clock): a test that needs it cannot run on the real server by mistake."""
    if not isinstance(kube, FakeKubeServer):
        raise TypeError("this test needs the fake API server (fault injection): run it on kube_backend fake")
    return kube
