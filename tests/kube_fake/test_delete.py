"""Behaviour 7: deletion, finalizers, preconditions, delete responses.

Every test here runs against the fake and the real kube-apiserver alike (``kube_api``).
No kubelet runs on either: a test plays it where it needs one (a terminal phase, then its
DELETE with grace 0).
"""

from __future__ import annotations

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from testbed.kube_fake.backend import KubeApi
from testbed.kube_fake.builders import Client, error_body, pod_body, watch


def _events(api: KubeApi, rv: str, until: str = "DELETED") -> list[tuple[str, str]]:
    """The pod events after ``rv`` (type, resourceVersion), up to the first of type ``until``."""
    seen: list[tuple[str, str]] = []
    w: Client = watch.Watch()
    for event in w.stream(
        api.core.list_namespaced_pod, api.namespace, resource_version=rv, timeout_seconds=5
    ):
        seen.append((event["type"], event["object"].metadata.resource_version))
        if event["type"] == until:
            w.stop()
    return seen


def _gone(api: KubeApi, name: str) -> bool:
    try:
        api.core.read_namespaced_pod(name, api.namespace)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def test_delete_without_finalizers_removes_and_returns_pod(kube_api: KubeApi) -> None:
    """A pod's deletion is always graceful: even one nothing runs (unbound) is first marked
    (deletionTimestamp now, grace 0), then removed; the answer is the object as removed."""
    core, ns = kube_api.core, kube_api.namespace
    created = core.create_namespaced_pod(ns, pod_body("p"))
    deleted = core.delete_namespaced_pod("p", ns, grace_period_seconds=30)
    assert deleted.metadata.uid == created.metadata.uid
    assert deleted.metadata.deletion_timestamp is not None
    assert deleted.metadata.deletion_grace_period_seconds == 0  # nothing runs it
    assert _gone(kube_api, "p")
    (marked, removed) = _events(kube_api, created.metadata.resource_version)
    assert marked[0] == "MODIFIED"
    assert removed == ("DELETED", deleted.metadata.resource_version)
    assert int(created.metadata.resource_version) < int(marked[1]) < int(removed[1])
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_pod("p", ns)
    assert error_body(exc.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "p" not found',
        "reason": "NotFound",
        "details": {"name": "p", "kind": "pods"},
        "code": 404,
    }


def test_finalizers_defer_deletion_until_removed(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    body = pod_body("p")
    body["metadata"]["finalizers"] = ["slurm-bridge.dev/cleanup"]
    created = core.create_namespaced_pod(ns, body)
    pending = core.delete_namespaced_pod(
        "p", ns, body=kubernetes.client.V1DeleteOptions(grace_period_seconds=5)
    )
    assert pending.metadata.deletion_timestamp is not None
    assert pending.metadata.deletion_grace_period_seconds == 0  # unbound pod: immediate
    assert core.read_namespaced_pod("p", ns).metadata.finalizers == ["slurm-bridge.dev/cleanup"]
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p", ns, {"metadata": {"finalizers": ["another/one"]}})
    status = error_body(exc.value)
    assert (exc.value.status, status["reason"]) == (422, "Invalid")
    assert "Forbidden: no new finalizers can be added if the object is being deleted" in status["message"]
    final = core.patch_namespaced_pod("p", ns, [{"op": "remove", "path": "/metadata/finalizers"}])
    assert _gone(kube_api, "p")
    # The write that removes it answers with the object it computed (never stored, so at the
    # version it started from); the DELETED event carries the last stored state, at a new one.
    assert not final.metadata.finalizers
    assert final.metadata.resource_version == pending.metadata.resource_version
    ((_, marked), (_, removed)) = _events(kube_api, created.metadata.resource_version)
    assert marked == pending.metadata.resource_version
    assert int(removed) > int(marked)
    w: Client = watch.Watch()
    for event in w.stream(core.list_namespaced_pod, ns, resource_version=marked, timeout_seconds=5):
        assert event["type"] == "DELETED"
        assert event["object"].metadata.finalizers == ["slurm-bridge.dev/cleanup"]
        w.stop()


def test_a_strategic_patch_takes_the_last_finalizer_out_and_completes_the_deletion(kube_api: KubeApi) -> None:
    """How the bridge drops its finalizer: no read, a uid precondition, the entry named."""
    core, ns = kube_api.core, kube_api.namespace
    body = pod_body("p")
    body["metadata"]["finalizers"] = ["x/ours"]
    created = core.create_namespaced_pod(ns, body)
    drop = {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x/ours"], "uid": created.metadata.uid}}
    other = {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x/ours"], "uid": "a-namesake"}}
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p", ns, other)
    assert exc.value.status == 422  # another pod of that name: its uid is immutable, it is untouched
    pending = core.delete_namespaced_pod("p", ns)
    assert pending.metadata.deletion_timestamp is not None
    final = core.patch_namespaced_pod("p", ns, drop)
    assert not final.metadata.finalizers
    assert _gone(kube_api, "p")
    events = _events(kube_api, created.metadata.resource_version)
    assert [kind for kind, _ in events] == ["MODIFIED", "DELETED"]
    assert events[0][1] == pending.metadata.resource_version


def test_taking_out_a_finalizer_that_is_not_there_changes_nothing(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    created = core.create_namespaced_pod(ns, pod_body("p"))
    drop = {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x/ours"], "uid": created.metadata.uid}}
    same = core.patch_namespaced_pod("p", ns, drop)
    assert same.metadata.resource_version == created.metadata.resource_version  # no write, no event
    assert not same.metadata.finalizers


def test_bound_pod_deletion_gets_grace_period(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    body = pod_body("p", nodeName="n1")
    body["metadata"]["finalizers"] = ["x/y"]
    core.create_namespaced_pod(ns, body)
    pod = core.delete_namespaced_pod("p", ns, grace_period_seconds=7)
    assert pod.metadata.deletion_grace_period_seconds == 7
    if kube_api.is_fake:
        # Pods carry a generation from Kubernetes 1.33 on (graceful deletion bumps it); the
        # real test bed is 1.28.
        assert pod.metadata.generation == 2
    # Its finalizer gone, the pod still waits for its kubelet (its grace period is not over).
    core.patch_namespaced_pod("p", ns, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x/y"]}})
    assert core.read_namespaced_pod("p", ns).metadata.deletion_grace_period_seconds == 7


def test_delete_preconditions(kube_api: KubeApi) -> None:
    """Checked before anything else (rest.BeforeDelete), in its words: the object is named by
    its kind, not its resource."""
    core, ns = kube_api.core, kube_api.namespace
    pod = core.create_namespaced_pod(ns, pod_body("p"))
    wrong_uid = kubernetes.client.V1DeleteOptions(preconditions=kubernetes.client.V1Preconditions(uid="nope"))
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_pod("p", ns, body=wrong_uid)
    assert error_body(exc.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'Operation cannot be fulfilled on Pod "p": the UID in the precondition (nope) '
        f"does not match the UID in record ({pod.metadata.uid}). "
        "The object might have been deleted and then recreated",
        "reason": "Conflict",
        "details": {"name": "p", "kind": "Pod"},
        "code": 409,
    }
    stale_rv = kubernetes.client.V1DeleteOptions(
        preconditions=kubernetes.client.V1Preconditions(resource_version="1")
    )
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_pod("p", ns, body=stale_rv)
    assert error_body(exc.value)["message"] == (
        'Operation cannot be fulfilled on Pod "p": the ResourceVersion in the precondition (1) '
        f"does not match the ResourceVersion in record ({pod.metadata.resource_version}). "
        "The object might have been modified"
    )
    apps: Client = kubernetes.client.AppsV1Api(kube_api.api_client)
    spec = {
        "selector": {"matchLabels": {"a": "b"}},
        "template": {"metadata": {"labels": {"a": "b"}}, "spec": pod_body("x")["spec"]},
    }
    apps.create_namespaced_deployment(ns, {"metadata": {"name": "d"}, "spec": spec})
    with pytest.raises(ApiException) as exc:
        apps.delete_namespaced_deployment("d", ns, body=wrong_uid)
    body = error_body(exc.value)
    assert body["message"].startswith('Operation cannot be fulfilled on Deployment.apps "d": the UID')
    assert body["details"] == {"name": "d", "group": "apps", "kind": "Deployment"}
    ok = kubernetes.client.V1DeleteOptions(
        preconditions=kubernetes.client.V1Preconditions(
            uid=pod.metadata.uid, resource_version=pod.metadata.resource_version
        ),
        propagation_policy="Background",
    )
    core.delete_namespaced_pod("p", ns, body=ok)
    assert _gone(kube_api, "p")


def test_non_pod_delete_returns_status(kube_api: KubeApi) -> None:
    apps: Client = kubernetes.client.AppsV1Api(kube_api.api_client)
    core, ns = kube_api.core, kube_api.namespace
    spec = {
        "selector": {"matchLabels": {"a": "b"}},
        "template": {"metadata": {"labels": {"a": "b"}}, "spec": pod_body("x")["spec"]},
    }
    d = apps.create_namespaced_deployment(ns, {"metadata": {"name": "d"}, "spec": spec})
    result = apps.delete_namespaced_deployment("d", ns, propagation_policy="Foreground")
    if kube_api.is_fake:
        # No garbage collector: the fake ignores propagationPolicy (a documented difference);
        # the real server, which has no GC running either, keeps the object with the
        # foregroundDeletion finalizer until one would have deleted its dependents.
        assert result == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {"name": "d", "group": "apps", "kind": "deployments", "uid": d.metadata.uid},
        }
    else:
        assert (result["metadata"]["finalizers"], bool(result["metadata"]["deletionTimestamp"])) == (
            ["foregroundDeletion"],
            True,
        )
    config = core.create_namespaced_config_map(ns, {"metadata": {"name": "c"}})
    assert core.delete_namespaced_config_map("c", ns) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": "c", "kind": "configmaps", "uid": config.metadata.uid},
    }
    name = kube_api.node_name("n")
    core.create_node({"metadata": {"name": name}})
    assert core.delete_node(name)["details"]["kind"] == "nodes"


def test_an_object_with_finalizers_is_marked_then_removed_with_its_last_finalizer(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    core.create_namespaced_config_map(ns, {"metadata": {"name": "c", "finalizers": ["x/y"]}})
    marked = core.delete_namespaced_config_map("c", ns, _preload_content=False)
    assert marked.status == 200
    left = core.read_namespaced_config_map("c", ns)
    assert (left.metadata.deletion_grace_period_seconds, left.metadata.finalizers) == (0, ["x/y"])
    core.patch_namespaced_config_map("c", ns, {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_config_map("c", ns)
    assert exc.value.status == 404


def test_a_bound_pod_stays_terminating_until_its_kubelet_confirms(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    core.create_namespaced_pod(ns, pod_body("p", nodeName="n1"))
    pod = core.delete_namespaced_pod("p", ns)
    assert pod.metadata.deletion_timestamp is not None
    assert pod.metadata.deletion_grace_period_seconds == 30
    assert core.read_namespaced_pod("p", ns).metadata.deletion_timestamp is not None
    # The kubelet stopped the containers and says so: the pod is still there...
    core.patch_namespaced_pod_status("p", ns, {"status": {"phase": "Failed"}})
    assert core.read_namespaced_pod("p", ns).metadata.deletion_grace_period_seconds == 30
    # ...until the kubelet's own DELETE with grace 0 confirms it.
    gone = core.delete_namespaced_pod("p", ns, grace_period_seconds=0)
    assert gone.metadata.deletion_grace_period_seconds == 0
    assert _gone(kube_api, "p")


def test_a_force_delete_removes_a_terminating_pod(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    created = core.create_namespaced_pod(ns, pod_body("p", nodeName="n1"))
    first = core.delete_namespaced_pod("p", ns, grace_period_seconds=10)
    again = core.delete_namespaced_pod("p", ns, grace_period_seconds=20)  # only a shorter one counts
    assert again.metadata.resource_version == first.metadata.resource_version
    shorter = core.delete_namespaced_pod("p", ns, grace_period_seconds=4)
    assert shorter.metadata.deletion_grace_period_seconds == 4
    # The deletion time moves by the difference: 6 s earlier.
    moved = first.metadata.deletion_timestamp - shorter.metadata.deletion_timestamp
    assert moved.total_seconds() == 6
    core.delete_namespaced_pod("p", ns, grace_period_seconds=0)
    assert _gone(kube_api, "p")
    kinds = [kind for kind, _ in _events(kube_api, created.metadata.resource_version)]
    assert kinds == ["MODIFIED", "MODIFIED", "MODIFIED", "DELETED"]


def test_an_unbound_or_finished_pod_is_deleted_at_once(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    core.create_namespaced_pod(ns, pod_body("p"))
    core.delete_namespaced_pod("p", ns)
    assert _gone(kube_api, "p")
    core.create_namespaced_pod(ns, pod_body("done", nodeName="n1"))
    core.patch_namespaced_pod_status("done", ns, {"status": {"phase": "Succeeded"}})
    assert core.delete_namespaced_pod("done", ns).metadata.deletion_grace_period_seconds == 0
    assert _gone(kube_api, "done")
