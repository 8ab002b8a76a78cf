"""Behaviour 12: the taint-eviction controller deletes pods from NoExecute-tainted nodes.

Fake only: the controller is the fake's (the real test bed runs no controller-manager).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from testbed.kube_fake import FakeClock, FakeKubeServer
from testbed.kube_fake.builders import Client, pod_body
from testbed.kube_fake.taint_eviction import tolerates

KEEP = "example.com/keep"  # a finalizer, so a deleted pod stays readable


@pytest.fixture
def clocked() -> Iterator[FakeKubeServer]:
    with FakeKubeServer(clock=FakeClock()) as srv:
        yield srv


def _pod(core: Client, name: str, *, tolerations: list[dict[str, Any]] | None = None, node: str = "") -> None:
    body = pod_body(name, tolerations=tolerations or [])
    body["metadata"]["finalizers"] = [KEEP]
    core.create_namespaced_pod("default", body)
    if node:
        binding = {"metadata": {"name": name}, "target": {"kind": "Node", "name": node}}
        core.create_namespaced_pod_binding(name, "default", binding, _preload_content=False)


def _taint(core: Client, node: str, *taints: dict[str, str]) -> None:
    core.patch_node(node, {"spec": {"taints": list(taints)}})


def _terminating(server: FakeKubeServer, name: str) -> Any:
    def check() -> Any:
        pod = server.get_object("pods", name, "default")
        return pod if pod and pod["metadata"].get("deletionTimestamp") else None

    return check


def _condition(pod: Any, ctype: str) -> Any:
    return next((c for c in pod.status.conditions or [] if c.type == ctype), None)


def test_untolerated_no_execute_taint_deletes_bound_pods(kube_fake: FakeKubeServer, core: Client) -> None:
    kube_fake.create_node("n1")
    kube_fake.create_node("n2")
    _pod(core, "victim", node="n1")
    _pod(core, "elsewhere", node="n2")
    _pod(core, "unbound")
    _taint(core, "n1", {"key": "example.com/soft", "effect": "NoSchedule"})
    kube_fake.settle()
    assert core.read_namespaced_pod("victim", "default").metadata.deletion_timestamp is None

    _taint(core, "n1", {"key": "example.com/broken", "value": "yes", "effect": "NoExecute"})
    kube_fake.wait_for(_terminating(kube_fake, "victim"))
    victim = core.read_namespaced_pod("victim", "default")
    cond = _condition(victim, "DisruptionTarget")
    assert (cond.status, cond.reason, cond.message) == (
        "True",
        "DeletionByTaintManager",
        "Taint manager: deleting due to NoExecute taint",
    )
    assert victim.metadata.finalizers == [KEEP]  # the normal graceful DELETE: finalizers hold it
    assert victim.metadata.deletion_grace_period_seconds == 30
    kube_fake.settle()
    for name in ("elsewhere", "unbound"):
        assert core.read_namespaced_pod(name, "default").metadata.deletion_timestamp is None
    events = core.list_namespaced_event("default", field_selector="involvedObject.name=victim").items
    assert [(e.reason, e.message, e.source.component) for e in events] == [
        ("TaintManagerEviction", "Marking for deletion Pod default/victim", "taint-eviction-controller")
    ]


def test_binding_to_an_already_tainted_node_deletes_the_pod(kube_fake: FakeKubeServer, core: Client) -> None:
    kube_fake.create_node("n1")
    _taint(core, "n1", {"key": "example.com/broken", "effect": "NoExecute"})
    core.create_namespaced_pod("default", pod_body("plain"))  # no finalizer; no kubelet confirms
    binding = {"metadata": {"name": "plain"}, "target": {"kind": "Node", "name": "n1"}}
    core.create_namespaced_pod_binding("plain", "default", binding, _preload_content=False)
    kube_fake.wait_for(_terminating(kube_fake, "plain"))  # Terminating until a kubelet confirms
    # A pod tolerating the taint forever stays, even when it is bound later.
    _pod(core, "tolerant", tolerations=[{"key": "example.com/broken", "operator": "Exists"}], node="n1")
    kube_fake.settle()
    assert core.read_namespaced_pod("tolerant", "default").metadata.deletion_timestamp is None


@pytest.mark.parametrize(
    ("toleration", "expected"),
    [
        ({"operator": "Exists"}, True),  # empty key + Exists: every taint
        ({"key": "k", "operator": "Exists"}, True),
        ({"key": "k", "operator": "Equal", "value": "v"}, True),
        ({"key": "k", "value": "v"}, True),  # empty operator means Equal
        ({"key": "k", "operator": "Equal", "value": "w"}, False),
        ({"key": "k", "operator": "Exists", "effect": "NoExecute"}, True),
        ({"key": "k", "operator": "Exists", "effect": "NoSchedule"}, False),
        ({"key": "other", "operator": "Exists"}, False),
        ({"key": "k", "operator": "Lt", "value": "9"}, False),  # comparison operators are alpha, off
    ],
)
def test_toleration_matching(toleration: dict[str, str], expected: bool) -> None:
    assert tolerates(toleration, {"key": "k", "value": "v", "effect": "NoExecute"}) is expected


def test_every_no_execute_taint_must_be_tolerated(kube_fake: FakeKubeServer, core: Client) -> None:
    kube_fake.create_node("n1")
    cases = {
        "all": [{"operator": "Exists"}],
        "both": [{"key": "a", "value": "x"}, {"key": "b", "operator": "Exists", "effect": "NoExecute"}],
        "only-a": [{"key": "a", "operator": "Equal", "value": "x"}],
        "wrong-effect": [{"operator": "Exists", "effect": "NoSchedule"}],
    }
    for name, tolerations in cases.items():
        _pod(core, name, tolerations=tolerations, node="n1")
    _taint(
        core,
        "n1",
        {"key": "a", "value": "x", "effect": "NoExecute"},
        {"key": "b", "effect": "NoExecute"},
        {"key": "c", "effect": "NoSchedule"},  # not the taint manager's business
    )
    kube_fake.wait_for(_terminating(kube_fake, "only-a"))
    kube_fake.wait_for(_terminating(kube_fake, "wrong-effect"))
    kube_fake.settle()
    for name in ("all", "both"):
        assert core.read_namespaced_pod(name, "default").metadata.deletion_timestamp is None


def test_toleration_seconds_delays_the_deletion(clocked: FakeKubeServer) -> None:
    with clocked.api_client() as api:
        core: Client = kubernetes.client.CoreV1Api(api)
        clocked.create_node("n1")
        clocked.create_node("n2")
        bounded = [{"key": "gone", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}]
        _pod(core, "patient", tolerations=bounded, node="n1")
        _pod(core, "reprieved", tolerations=bounded, node="n2")
        for node in ("n1", "n2"):
            _taint(core, node, {"key": "gone", "effect": "NoExecute"})
        clocked.settle()
        assert clocked.taint_manager is not None
        assert sorted(clocked.taint_manager.scheduled()) == [("default", "patient"), ("default", "reprieved")]
        _taint(core, "n2")  # taint removed before the deadline: the deletion is cancelled
        clocked.advance_clock(20)
        # A later update does not push the deadline back...
        more = [*bounded, {"key": "other", "operator": "Exists", "tolerationSeconds": 300}]
        core.patch_namespaced_pod("patient", "default", {"spec": {"tolerations": more}})
        # ...and a pod that goes away takes its scheduled deletion with it.
        core.create_namespaced_pod("default", pod_body("brief", tolerations=bounded, nodeName="n1"))
        clocked.settle()
        assert ("default", "brief") in clocked.taint_manager.scheduled()
        core.delete_namespaced_pod("brief", "default", grace_period_seconds=0)  # gone for good
        clocked.settle()
        assert sorted(clocked.taint_manager.scheduled()) == [("default", "patient")]
        clocked.advance_clock(9)
        clocked.settle()
        for name in ("patient", "reprieved"):
            assert core.read_namespaced_pod(name, "default").metadata.deletion_timestamp is None
        clocked.advance_clock(1)
        clocked.wait_for(_terminating(clocked, "patient"))
        clocked.advance_clock(3600)
        clocked.settle()
        assert core.read_namespaced_pod("reprieved", "default").metadata.deletion_timestamp is None
        events = core.list_namespaced_event("default", field_selector="involvedObject.name=reprieved").items
        assert [e.message for e in events] == ["Cancelling deletion of Pod default/reprieved"]


def test_toleration_seconds_on_the_real_clock(kube_fake: FakeKubeServer, core: Client) -> None:
    kube_fake.create_node("n1")
    _pod(core, "p", tolerations=[{"operator": "Exists", "tolerationSeconds": 1}], node="n1")
    _taint(core, "n1", {"key": "gone", "effect": "NoExecute"})
    kube_fake.settle()
    assert core.read_namespaced_pod("p", "default").metadata.deletion_timestamp is None
    kube_fake.wait_for(_terminating(kube_fake, "p"), timeout=5)


def test_taint_manager_can_be_switched_off() -> None:
    with FakeKubeServer(taint_manager=False) as srv, srv.api_client() as api:
        core: Client = kubernetes.client.CoreV1Api(api)
        srv.create_node("n1")
        _pod(core, "p", node="n1")
        _taint(core, "n1", {"key": "gone", "effect": "NoExecute"})
        srv.settle()  # the disruption controller still runs and has seen everything
        assert srv.taint_manager is None
        assert core.read_namespaced_pod("p", "default").metadata.deletion_timestamp is None
