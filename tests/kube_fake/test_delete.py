"""Behaviour 7: deletion, finalizers, preconditions, delete responses."""

from __future__ import annotations

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.kube_fake import FakeKubeServer
from tests.kube_fake.builders import Client, error_body, pod_body, watch


def _events(core: Client, rv: str, count: int) -> list[tuple[str, str]]:
    """The next ``count`` (type, resourceVersion) pod events after ``rv``."""
    seen: list[tuple[str, str]] = []
    w: Client = watch.Watch()
    for event in w.stream(core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=5):
        seen.append((event["type"], event["object"].metadata.resource_version))
        if len(seen) == count:
            w.stop()
    return seen


def test_delete_without_finalizers_removes_and_returns_pod(kube_fake: FakeKubeServer, core: Client) -> None:
    created = core.create_namespaced_pod("default", pod_body("p"))
    deleted = core.delete_namespaced_pod("p", "default", grace_period_seconds=0)
    assert deleted.metadata.uid == created.metadata.uid
    assert kube_fake.get_object("pods", "p", "default") is None
    events = _events(core, created.metadata.resource_version, 1)
    assert events == [("DELETED", deleted.metadata.resource_version)]
    assert int(deleted.metadata.resource_version) > int(created.metadata.resource_version)
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_pod("p", "default")
    assert exc.value.status == 404


def test_finalizers_defer_deletion_until_removed(kube_fake: FakeKubeServer, core: Client) -> None:
    body = pod_body("p")
    body["metadata"]["finalizers"] = ["slurm-bridge.dev/cleanup"]
    created = core.create_namespaced_pod("default", body)
    pending = core.delete_namespaced_pod(
        "p", "default", body=kubernetes.client.V1DeleteOptions(grace_period_seconds=5)
    )
    assert pending.metadata.deletion_timestamp is not None
    assert pending.metadata.deletion_grace_period_seconds == 0  # unbound pod: immediate
    assert core.read_namespaced_pod("p", "default").metadata.finalizers == ["slurm-bridge.dev/cleanup"]
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p", "default", {"metadata": {"finalizers": ["another/one"]}})
    status = error_body(exc.value)
    assert (exc.value.status, status["reason"]) == (422, "Invalid")
    assert "Forbidden: no new finalizers can be added if the object is being deleted" in status["message"]
    final = core.patch_namespaced_pod("p", "default", [{"op": "remove", "path": "/metadata/finalizers"}])
    assert kube_fake.get_object("pods", "p", "default") is None
    assert _events(core, created.metadata.resource_version, 2) == [
        ("MODIFIED", pending.metadata.resource_version),
        ("DELETED", final.metadata.resource_version),
    ]


def test_a_strategic_patch_takes_the_last_finalizer_out_and_completes_the_deletion(
    kube_fake: FakeKubeServer, core: Client
) -> None:
    """How the bridge drops its finalizer: no read, a uid precondition, the entry named."""
    body = pod_body("p")
    body["metadata"]["finalizers"] = ["x/ours"]
    created = core.create_namespaced_pod("default", body)
    drop = {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x/ours"], "uid": created.metadata.uid}}
    other = {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x/ours"], "uid": "a-namesake"}}
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p", "default", other)
    assert exc.value.status == 422  # another pod of that name: its uid is immutable, it is untouched
    pending = core.delete_namespaced_pod("p", "default")
    assert pending.metadata.deletion_timestamp is not None
    final = core.patch_namespaced_pod("p", "default", drop)
    assert not final.metadata.finalizers
    assert kube_fake.get_object("pods", "p", "default") is None
    assert _events(core, created.metadata.resource_version, 2) == [
        ("MODIFIED", pending.metadata.resource_version),
        ("DELETED", final.metadata.resource_version),
    ]


def test_taking_out_a_finalizer_that_is_not_there_changes_nothing(core: Client) -> None:
    created = core.create_namespaced_pod("default", pod_body("p"))
    drop = {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x/ours"], "uid": created.metadata.uid}}
    same = core.patch_namespaced_pod("p", "default", drop)
    assert same.metadata.resource_version == created.metadata.resource_version  # no write, no event
    assert not same.metadata.finalizers


def test_bound_pod_deletion_gets_grace_period(core: Client) -> None:
    body = pod_body("p", nodeName="n1")
    body["metadata"]["finalizers"] = ["x/y"]
    core.create_namespaced_pod("default", body)
    pod = core.delete_namespaced_pod("p", "default", grace_period_seconds=7)
    assert pod.metadata.deletion_grace_period_seconds == 7
    assert pod.metadata.generation == 2


def test_delete_preconditions(core: Client) -> None:
    pod = core.create_namespaced_pod("default", pod_body("p"))
    wrong_uid = kubernetes.client.V1DeleteOptions(preconditions=kubernetes.client.V1Preconditions(uid="nope"))
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_pod("p", "default", body=wrong_uid)
    body = error_body(exc.value)
    assert (exc.value.status, body["reason"]) == (409, "Conflict")
    assert "Precondition failed: UID in precondition: nope" in body["message"]
    stale_rv = kubernetes.client.V1DeleteOptions(
        preconditions=kubernetes.client.V1Preconditions(resource_version="1")
    )
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_pod("p", "default", body=stale_rv)
    assert exc.value.status == 409
    ok = kubernetes.client.V1DeleteOptions(
        preconditions=kubernetes.client.V1Preconditions(
            uid=pod.metadata.uid, resource_version=pod.metadata.resource_version
        ),
        propagation_policy="Background",
    )
    core.delete_namespaced_pod("p", "default", body=ok)


def test_non_pod_delete_returns_status(api_client: Client) -> None:
    apps: Client = kubernetes.client.AppsV1Api(api_client)
    core: Client = kubernetes.client.CoreV1Api(api_client)
    spec = {
        "selector": {"matchLabels": {"a": "b"}},
        "template": {"metadata": {"labels": {"a": "b"}}, "spec": pod_body("x")["spec"]},
    }
    d = apps.create_namespaced_deployment("default", {"metadata": {"name": "d"}, "spec": spec})
    result = apps.delete_namespaced_deployment("d", "default", propagation_policy="Foreground")
    assert result == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": "d", "group": "apps", "kind": "deployments", "uid": d.metadata.uid},
    }
    core.create_node({"metadata": {"name": "n"}})
    assert core.delete_node("n")["details"]["kind"] == "nodes"


def test_a_bound_pod_stays_terminating_until_its_kubelet_confirms(core: Client) -> None:
    core.create_namespaced_pod("default", pod_body("p", nodeName="n1"))
    pod = core.delete_namespaced_pod("p", "default")
    assert pod.metadata.deletion_timestamp is not None
    assert pod.metadata.deletion_grace_period_seconds == 30
    assert core.read_namespaced_pod("p", "default").metadata.deletion_timestamp is not None

    # The kubelet stopped the containers: a terminal phase, and the object is gone.
    status = {"status": {"phase": "Failed"}}
    core.patch_namespaced_pod_status("p", "default", status)
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod("p", "default")
    assert exc.value.status == 404


def test_a_force_delete_removes_a_terminating_pod(core: Client) -> None:
    core.create_namespaced_pod("default", pod_body("p", nodeName="n1"))
    core.delete_namespaced_pod("p", "default", grace_period_seconds=10)
    core.delete_namespaced_pod("p", "default", grace_period_seconds=0)
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod("p", "default")
    assert exc.value.status == 404


def test_an_unbound_pod_is_deleted_at_once(core: Client) -> None:
    core.create_namespaced_pod("default", pod_body("p"))
    core.delete_namespaced_pod("p", "default")
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod("p", "default")
    assert exc.value.status == 404
