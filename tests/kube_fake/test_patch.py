"""Behaviour 5: json-patch, merge-patch, strategic-merge-patch, apply rejection, no-op writes.

The tests taking ``kube_api`` run against the fake and the real kube-apiserver alike.
Fake-only: ``$retainKeys`` and server-side apply, which the fake deliberately refuses
(see the package docstring).
"""

from __future__ import annotations

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from testbed.kube_fake.backend import CustomResource, KubeApi
from testbed.kube_fake.builders import Client, error_body, pod_body, watch

MERGE = "application/merge-patch+json"
UNMARSHAL = "error decoding patch: json: cannot unmarshal"
INTO = "into Go value of type"


def test_json_patch_including_test_op(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    core.create_namespaced_pod(ns, pod_body("p", labels={"a": "1"}))
    ops = [
        {"op": "test", "path": "/metadata/labels/a", "value": "1"},
        {"op": "replace", "path": "/metadata/labels/a", "value": "2"},
        {"op": "add", "path": "/metadata/annotations", "value": {"x": "y"}},
    ]
    pod = core.patch_namespaced_pod("p", ns, ops)
    assert pod.metadata.labels == {"a": "2"}
    assert pod.metadata.annotations == {"x": "y"}
    for failing in (
        [{"op": "test", "path": "/metadata/labels/a", "value": "1"}],
        [{"op": "remove", "path": "/metadata/nope"}],
    ):
        with pytest.raises(ApiException) as exc:
            core.patch_namespaced_pod("p", ns, failing)
        body = error_body(exc.value)
        # The real server drops the patch library's text (details: {}); the fake keeps it as a
        # cause, to say what went wrong (a documented difference).
        assert {k: v for k, v in body.items() if k != "details"} == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "the server rejected our request due to an error in our request",
            "reason": "Invalid",
            "code": 422,
        }
        assert set(body["details"]) <= {"causes"}


@pytest.mark.parametrize(
    ("content_type", "body", "message"),
    [
        ("application/json-patch+json", {"op": "add"}, f"{UNMARSHAL} object {INTO} []handlers.jsonPatchOp"),
        (
            "application/merge-patch+json",
            [{"op": "add"}],
            f"{UNMARSHAL} array {INTO} map[string]interface {{}}",
        ),
        # Strategic merge patch says it without the "error decoding patch: " of the two others.
        (
            "application/strategic-merge-patch+json",
            5,
            f"{UNMARSHAL.removeprefix('error decoding patch: ')} number {INTO} map[string]interface {{}}",
        ),
    ],
)
def test_a_patch_of_the_wrong_shape_is_400(
    kube_api: KubeApi, content_type: str, body: object, message: str
) -> None:
    kube_api.core.create_namespaced_pod(kube_api.namespace, pod_body("p"))
    answer = kube_api.raw(
        "PATCH", f"/api/v1/namespaces/{kube_api.namespace}/pods/p", body, content_type=content_type
    )
    assert (answer.status_code, answer.json()) == (
        400,
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": "BadRequest",
            "code": 400,
        },
    )
    # Not JSON at all: the same 400, in the words of each side's JSON parser (a documented difference).
    answer = kube_api.raw(
        "PATCH", f"/api/v1/namespaces/{kube_api.namespace}/pods/p", "{bad", content_type=content_type
    )
    assert (answer.status_code, answer.json()["reason"]) == (400, "BadRequest")


def test_an_unknown_patch_type_is_415(kube_api: KubeApi) -> None:
    kube_api.core.create_namespaced_pod(kube_api.namespace, pod_body("p"))
    answer = kube_api.raw(
        "PATCH",
        f"/api/v1/namespaces/{kube_api.namespace}/pods/p",
        {"metadata": {}},
        content_type="text/plain",
    )
    assert (answer.status_code, answer.json()) == (
        415,
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "415: Unsupported Media Type",
            "reason": "UnsupportedMediaType",
            "details": {},
            "code": 415,
        },
    )


def test_merge_patch_null_deletes_and_lists_replace(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    core.create_namespaced_pod(ns, pod_body("p", labels={"a": "1", "b": "2"}))
    core.patch_namespaced_pod("p", ns, {"metadata": {"finalizers": ["x/a", "x/b"]}}, _content_type=MERGE)
    pod = core.patch_namespaced_pod(
        "p",
        ns,
        {"metadata": {"labels": {"a": None, "c": "3"}, "finalizers": ["x/c"]}},
        _content_type=MERGE,
    )
    assert pod.metadata.labels == {"b": "2", "c": "3"}
    assert pod.metadata.finalizers == ["x/c"]  # RFC 7386 replaces lists


def test_strategic_merge_patch_list_rules(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    body = pod_body("p", tolerations=[{"key": "a", "operator": "Exists"}])
    body["spec"]["containers"].append({"name": "side", "image": "side:1"})
    body["metadata"]["finalizers"] = ["x/a"]
    created = core.create_namespaced_pod(ns, body)
    # The real server's admission adds default tolerations; an update may only add to them.
    tolerations = [t.to_dict() for t in created.spec.tolerations]
    tolerations = [{k: v for k, v in t.items() if v is not None} for t in tolerations]
    pod = core.patch_namespaced_pod(
        "p",
        ns,
        {
            "metadata": {"finalizers": ["x/b", "x/a"]},
            "spec": {
                "containers": [{"name": "side", "image": "side:2"}],
                "tolerations": [*tolerations, {"key": "b", "operator": "Exists"}],
            },
        },
    )
    assert [(c.name, c.image) for c in pod.spec.containers] == [("main", "busybox:1.36"), ("side", "side:2")]
    assert pod.metadata.finalizers == ["x/b", "x/a"]  # set union, in the patch's order
    # An atomic list: replaced by the patch's, in its order, as in k8s.io/api.
    assert [t.key for t in pod.spec.tolerations] == [*(t["key"] for t in tolerations), "b"]
    pod = core.patch_namespaced_pod("p", ns, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x/a"]}})
    assert pod.metadata.finalizers == ["x/b"]
    # status.conditions merge by type through the status subresource.
    core.patch_namespaced_pod_status("p", ns, {"status": {"conditions": [{"type": "A", "status": "True"}]}})
    pod = core.patch_namespaced_pod_status(
        "p",
        ns,
        {"status": {"conditions": [{"type": "B", "status": "False"}, {"type": "A", "status": "False"}]}},
    )
    # Merged by type, in the patch's order (strategicpatch's normalizeElementOrder).
    assert [(c.type, c.status) for c in pod.status.conditions] == [("B", "False"), ("A", "False")]
    # $setElementOrder names the order; an item only the server had stays where it was.
    pod = core.patch_namespaced_pod_status(
        "p",
        ns,
        {
            "status": {
                "$setElementOrder/conditions": [{"type": "C"}, {"type": "B"}],
                "conditions": [{"type": "C", "status": "True"}],
            }
        },
    )
    assert [c.type for c in pod.status.conditions] == ["C", "B", "A"]
    # Taking the last finalizer out leaves none (the field goes, not an empty list).
    pod = core.patch_namespaced_pod("p", ns, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x/b"]}})
    assert pod.metadata.finalizers is None


def test_retain_keys_is_refused(core: Client) -> None:
    """Fake only: the directive is deliberately not implemented (the real server applies it)."""
    core.create_namespaced_pod("default", pod_body("p"))
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p", "default", {"metadata": {"$retainKeys": ["labels"]}})
    assert exc.value.status == 422
    assert "$retainKeys" in str(exc.value.body)


def test_custom_resources_reject_strategic_merge(kube_api: KubeApi, widgets: CustomResource) -> None:
    custom: Client = kubernetes.client.CustomObjectsApi(kube_api.api_client)
    args = (widgets.group, widgets.version, kube_api.namespace, widgets.plural)
    obj = {
        "apiVersion": widgets.api_version,
        "kind": widgets.kind,
        "metadata": {"name": "w"},
        "spec": {"a": 1, "b": 2},
    }
    custom.create_namespaced_custom_object(*args, obj)
    patched = custom.patch_namespaced_custom_object(
        *args, "w", {"spec": {"a": None}}
    )  # merge-patch by default
    assert patched["spec"] == {"b": 2}
    for content_type in ("application/strategic-merge-patch+json", "text/plain"):
        answer = kube_api.raw(
            "PATCH", widgets.path(kube_api.namespace, "w"), {"spec": {"b": 3}}, content_type=content_type
        )
        assert (answer.status_code, answer.json()) == (
            415,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": "the body of the request was in an unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                "reason": "UnsupportedMediaType",
                "code": 415,
            },
        )


def test_server_side_apply_is_rejected(core: Client) -> None:
    """Fake only: server-side apply is deliberately not implemented."""
    core.create_namespaced_pod("default", pod_body("p"))
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod(
            "p", "default", {"metadata": {"labels": {"a": "b"}}}, _content_type="application/apply-patch+yaml"
        )
    body = error_body(exc.value)
    assert exc.value.status == 415
    assert "server-side apply" in body["message"]


def test_noop_write_keeps_resource_version_and_emits_nothing(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    pod = core.create_namespaced_pod(ns, pod_body("p", labels={"a": "1"}))
    rv = pod.metadata.resource_version
    same = core.patch_namespaced_pod("p", ns, {"metadata": {"labels": {"a": "1"}}})
    assert same.metadata.resource_version == rv
    same = core.replace_namespaced_pod("p", ns, same)
    assert same.metadata.resource_version == rv
    if kube_api.fake is not None:
        assert str(kube_api.fake.store.rv) == rv
    core.patch_namespaced_pod("p", ns, {"metadata": {"labels": {"a": "2"}}})
    # Watching from the creation RV, the first event is the real change.
    w: Client = watch.Watch()
    seen = []
    for event in w.stream(core.list_namespaced_pod, ns, resource_version=rv, timeout_seconds=5):
        seen.append((event["type"], event["object"].metadata.labels))
        w.stop()
    assert seen == [("MODIFIED", {"a": "2"})]


def test_generation_tracks_spec_only(kube_api: KubeApi) -> None:
    apps: Client = kubernetes.client.AppsV1Api(kube_api.api_client)
    ns = kube_api.namespace
    spec = {
        "replicas": 1,
        "selector": {"matchLabels": {"app": "d"}},
        "template": {"metadata": {"labels": {"app": "d"}}, "spec": pod_body("x")["spec"]},
    }
    apps.create_namespaced_deployment(ns, {"metadata": {"name": "d"}, "spec": spec})
    d = apps.patch_namespaced_deployment("d", ns, {"metadata": {"labels": {"x": "y"}}})
    assert d.metadata.generation == 1
    d = apps.patch_namespaced_deployment_status("d", ns, {"status": {"replicas": 1}})
    assert d.metadata.generation == 1
    assert d.status.replicas == 1
    d = apps.patch_namespaced_deployment("d", ns, {"spec": {"replicas": 3}})
    assert d.metadata.generation == 2
    assert d.status.replicas == 1
