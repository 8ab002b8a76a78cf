"""Behaviour 5: json-patch, merge-patch, strategic-merge-patch, apply rejection, no-op writes."""

from __future__ import annotations

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.kube_fake import FakeKubeServer
from tests.kube_fake.builders import Client, error_body, pod_body, watch

MERGE = "application/merge-patch+json"


def test_json_patch_including_test_op(core: Client) -> None:
    core.create_namespaced_pod("default", pod_body("p", labels={"a": "1"}))
    ops = [
        {"op": "test", "path": "/metadata/labels/a", "value": "1"},
        {"op": "replace", "path": "/metadata/labels/a", "value": "2"},
        {"op": "add", "path": "/metadata/annotations", "value": {"x": "y"}},
    ]
    pod = core.patch_namespaced_pod("p", "default", ops)
    assert pod.metadata.labels == {"a": "2"}
    assert pod.metadata.annotations == {"x": "y"}
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod(
            "p", "default", [{"op": "test", "path": "/metadata/labels/a", "value": "1"}]
        )
    body = error_body(exc.value)
    assert (exc.value.status, body["reason"]) == (422, "Invalid")
    assert body["message"] == "the server rejected our request due to an error in our request"
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p", "default", [{"op": "remove", "path": "/metadata/nope"}])
    assert exc.value.status == 422


def test_merge_patch_null_deletes_and_lists_replace(core: Client) -> None:
    core.create_namespaced_pod("default", pod_body("p", labels={"a": "1", "b": "2"}))
    core.patch_namespaced_pod(
        "p", "default", {"metadata": {"finalizers": ["x/a", "x/b"]}}, _content_type=MERGE
    )
    pod = core.patch_namespaced_pod(
        "p",
        "default",
        {"metadata": {"labels": {"a": None, "c": "3"}, "finalizers": ["x/c"]}},
        _content_type=MERGE,
    )
    assert pod.metadata.labels == {"b": "2", "c": "3"}
    assert pod.metadata.finalizers == ["x/c"]  # RFC 7386 replaces lists


def test_strategic_merge_patch_list_rules(core: Client) -> None:
    body = pod_body("p", tolerations=[{"key": "a", "operator": "Exists"}])
    body["spec"]["containers"].append({"name": "side", "image": "side:1"})
    body["metadata"]["finalizers"] = ["x/a"]
    core.create_namespaced_pod("default", body)
    pod = core.patch_namespaced_pod(
        "p",
        "default",
        {
            "metadata": {"finalizers": ["x/b", "x/a"]},
            "spec": {
                "containers": [{"name": "side", "image": "side:2"}],
                "tolerations": [{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}],
            },
        },
    )
    assert [(c.name, c.image) for c in pod.spec.containers] == [("main", "busybox:1.36"), ("side", "side:2")]
    assert pod.metadata.finalizers == ["x/a", "x/b"]  # set union
    assert [t.key for t in pod.spec.tolerations] == ["a", "b"]  # atomic list: replaced, as in k8s.io/api
    pod = core.patch_namespaced_pod(
        "p", "default", {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x/a"]}}
    )
    assert pod.metadata.finalizers == ["x/b"]
    # status.conditions merge by type through the status subresource.
    core.patch_namespaced_pod_status(
        "p", "default", {"status": {"conditions": [{"type": "A", "status": "True"}]}}
    )
    pod = core.patch_namespaced_pod_status(
        "p",
        "default",
        {"status": {"conditions": [{"type": "B", "status": "False"}, {"type": "A", "status": "False"}]}},
    )
    assert [(c.type, c.status) for c in pod.status.conditions] == [("A", "False"), ("B", "False")]
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p", "default", {"metadata": {"$retainKeys": ["labels"]}})
    assert exc.value.status == 422
    assert "$retainKeys" in str(exc.value.body)


def test_custom_resources_reject_strategic_merge(api_client: Client) -> None:
    custom: Client = kubernetes.client.CustomObjectsApi(api_client)
    args = ("jobset.x-k8s.io", "v1alpha2", "default", "jobsets")
    custom.create_namespaced_custom_object(*args, {"metadata": {"name": "js"}, "spec": {"a": 1, "b": 2}})
    patched = custom.patch_namespaced_custom_object(
        *args, "js", {"spec": {"a": None}}
    )  # merge-patch by default
    assert patched["spec"] == {"b": 2}
    with pytest.raises(ApiException) as exc:
        custom.patch_namespaced_custom_object(
            *args, "js", {"spec": {"b": 3}}, _content_type="application/strategic-merge-patch+json"
        )
    assert (exc.value.status, error_body(exc.value)["reason"]) == (415, "UnsupportedMediaType")


def test_server_side_apply_is_rejected(core: Client) -> None:
    core.create_namespaced_pod("default", pod_body("p"))
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod(
            "p", "default", {"metadata": {"labels": {"a": "b"}}}, _content_type="application/apply-patch+yaml"
        )
    body = error_body(exc.value)
    assert exc.value.status == 415
    assert "server-side apply" in body["message"]


def test_noop_write_keeps_resource_version_and_emits_nothing(kube_fake: FakeKubeServer, core: Client) -> None:
    pod = core.create_namespaced_pod("default", pod_body("p", labels={"a": "1"}))
    rv = pod.metadata.resource_version
    same = core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "1"}}})
    assert same.metadata.resource_version == rv
    same = core.replace_namespaced_pod("p", "default", same)
    assert same.metadata.resource_version == rv
    assert str(kube_fake.store.rv) == rv
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "2"}}})
    # Watching from the creation RV, the first event is the real change.
    w: Client = watch.Watch()
    seen = []
    for event in w.stream(core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=5):
        seen.append((event["type"], event["object"].metadata.labels))
        w.stop()
    assert seen == [("MODIFIED", {"a": "2"})]


def test_generation_tracks_spec_only(api_client: Client) -> None:
    apps: Client = kubernetes.client.AppsV1Api(api_client)
    spec = {
        "replicas": 1,
        "selector": {"matchLabels": {"app": "d"}},
        "template": {"metadata": {"labels": {"app": "d"}}, "spec": pod_body("x")["spec"]},
    }
    apps.create_namespaced_deployment("default", {"metadata": {"name": "d"}, "spec": spec})
    d = apps.patch_namespaced_deployment("d", "default", {"metadata": {"labels": {"x": "y"}}})
    assert d.metadata.generation == 1
    d = apps.patch_namespaced_deployment_status("d", "default", {"status": {"replicas": 1}})
    assert d.metadata.generation == 1
    assert d.status.replicas == 1
    d = apps.patch_namespaced_deployment("d", "default", {"spec": {"replicas": 3}})
    assert d.metadata.generation == 2
    assert d.status.replicas == 1
