"""Behaviour 11: the optional simulated kubelet.

Fake only: no kubelet runs in the real test bed (testbed/kube_real/kubelet.py plays one there).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from testbed.kube_fake import EXIT_CODE, RUN_SECONDS, FakeKubeServer
from testbed.kube_fake.builders import Client, pod_body


@pytest.fixture
def server() -> Iterator[FakeKubeServer]:
    with FakeKubeServer(kubelet=True) as srv:
        srv.create_node("node-1")
        yield srv


@pytest.fixture
def client_core(server: FakeKubeServer) -> Iterator[Client]:
    with server.api_client() as client:
        yield kubernetes.client.CoreV1Api(client)


def _bind(core: Client, pod: str, node: str) -> None:
    body = {"metadata": {"name": pod}, "target": {"kind": "Node", "name": node}}
    core.create_namespaced_pod_binding(pod, "default", body, _preload_content=False)


def _phase_is(server: FakeKubeServer, name: str, phase: str) -> Any:
    def check() -> Any:
        pod = server.get_object("pods", name, "default")
        return pod if pod and pod["status"].get("phase") == phase else None

    return check


def _annotated(name: str, **annotations: str) -> dict[str, Any]:
    body = pod_body(name)
    body["metadata"]["annotations"] = annotations
    return body


def test_bound_pod_runs_then_succeeds(server: FakeKubeServer, client_core: Client) -> None:
    client_core.create_namespaced_pod("default", _annotated("p", **{RUN_SECONDS: "0.2"}))
    _bind(client_core, "p", "node-1")
    running = server.wait_for(_phase_is(server, "p", "Running"))
    conditions = {c["type"]: c["status"] for c in running["status"]["conditions"]}
    assert conditions["Ready"] == conditions["PodScheduled"] == "True"
    (cs,) = running["status"]["containerStatuses"]
    assert cs["ready"]
    assert "running" in cs["state"]
    assert running["status"]["hostIP"] == "127.0.0.1"
    # The status must also satisfy the client's strict models.
    model = client_core.read_namespaced_pod("p", "default")
    assert model.status.container_statuses[0].state.running.started_at is not None
    done = server.wait_for(_phase_is(server, "p", "Succeeded"), timeout=3)
    (cs,) = done["status"]["containerStatuses"]
    assert cs["state"]["terminated"]["exitCode"] == 0
    assert cs["state"]["terminated"]["reason"] == "Completed"
    assert client_core.read_namespaced_pod("p", "default").status.phase == "Succeeded"


def test_exit_code_annotation_fails_pod(server: FakeKubeServer, client_core: Client) -> None:
    client_core.create_namespaced_pod("default", _annotated("p", **{RUN_SECONDS: "0", EXIT_CODE: "3"}))
    _bind(client_core, "p", "node-1")
    failed = server.wait_for(_phase_is(server, "p", "Failed"))
    assert failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3


def test_missing_node_is_left_alone_and_deletion_is_confirmed(
    server: FakeKubeServer, client_core: Client
) -> None:
    client_core.create_namespaced_pod("default", pod_body("orphan"))
    _bind(client_core, "orphan", "no-such-node")
    held = pod_body("held")
    held["metadata"]["finalizers"] = ["x/keep"]
    client_core.create_namespaced_pod("default", held)
    _bind(client_core, "held", "node-1")
    server.wait_for(_phase_is(server, "held", "Running"))
    client_core.delete_namespaced_pod("held", "default")
    # Any later kubelet pass has seen both pods once this marker pod runs.
    client_core.create_namespaced_pod("default", pod_body("marker"))
    _bind(client_core, "marker", "node-1")
    server.wait_for(_phase_is(server, "marker", "Running"))
    assert client_core.read_namespaced_pod("orphan", "default").status.phase == "Pending"
    pod = client_core.read_namespaced_pod("held", "default")
    assert pod.metadata.deletion_timestamp is not None
    assert pod.metadata.deletion_grace_period_seconds == 0  # confirmed; only the finalizer holds it
    client_core.patch_namespaced_pod(
        "held", "default", {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x/keep"]}}
    )
    assert server.get_object("pods", "held", "default") is None


def test_kubelet_is_off_by_default(kube_fake: FakeKubeServer) -> None:
    assert kube_fake.kubelet is None
