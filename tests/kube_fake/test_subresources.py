"""Behaviour 6: pods/binding, pods/eviction, pods/status and nodes/status.

The tests taking ``kube_api`` run against the fake and the real kube-apiserver alike
(a PodDisruptionBudget's status is written by the test: no disruption controller runs on
either there). Fake-only: ``block_evictions``, the fake's fault injection.
"""

from __future__ import annotations

import json

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from testbed.kube_fake import FakeKubeServer
from testbed.kube_fake.backend import CustomResource, KubeApi
from testbed.kube_fake.builders import Client, error_body, header, pod_body

SUCCESS_201 = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def _binding(pod: str, node: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod},
        "target": {"kind": "Node", "name": node},
    }


def _eviction(pod: str, **delete_options: object) -> dict[str, object]:
    body: dict[str, object] = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod}}
    if delete_options:
        body["deleteOptions"] = delete_options
    return body


def _status(
    code: int, message: str, reason: str = "", details: dict[str, object] | None = None
) -> dict[str, object]:
    body: dict[str, object] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    body["message"] = message
    if reason:
        body["reason"] = reason
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def test_binding_sets_node_and_scheduled_condition(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    core.create_namespaced_pod(ns, pod_body("p"))
    resp = core.create_namespaced_pod_binding("p", ns, _binding("p", "node-1"), _preload_content=False)
    assert resp.status == 201
    assert json.loads(resp.data) == SUCCESS_201
    pod = core.read_namespaced_pod("p", ns)
    assert pod.spec.node_name == "node-1"
    assert [(c.type, c.status) for c in pod.status.conditions] == [("PodScheduled", "True")]
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_binding("p", ns, _binding("p", "node-2"), _preload_content=False)
    assert error_body(exc.value) == _status(
        409,
        'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "node-1"',
        "Conflict",
        {"name": "p", "kind": "pods/binding"},
    )
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_binding("ghost", ns, _binding("ghost", "n"), _preload_content=False)
    assert error_body(exc.value) == _status(
        404, 'pods "ghost" not found', "NotFound", {"name": "ghost", "kind": "pods"}
    )


def test_a_binding_that_is_not_valid(kube_api: KubeApi) -> None:
    """ValidatePodBinding's errors reach the client as an unexpected error: 500, no reason."""
    kube_api.core.create_namespaced_pod(kube_api.namespace, pod_body("p"))
    path = f"/api/v1/namespaces/{kube_api.namespace}/pods/p/binding"
    named = {"name": "p"}
    cases = [
        (
            {"target": {"kind": "Pod", "name": "n"}},
            'target.kind: Unsupported value: "Pod": supported values: "Node", "<empty>"',
        ),
        ({"target": {"kind": "Node"}}, "target.name: Required value"),
        ({}, "target.name: Required value"),
    ]
    for body, message in cases:
        answer = kube_api.raw("POST", path, {"metadata": named, **body})
        assert (answer.status_code, answer.json()) == (500, _status(500, message)), body
    # The Binding must name the pod of the URL (naming none is no exception).
    for metadata in ({"name": "other"}, {}):
        answer = kube_api.raw("POST", path, {"metadata": metadata, "target": {"name": "n"}})
        assert (answer.status_code, answer.json()) == (
            400,
            _status(400, "name in URL does not match name in Binding object", "BadRequest"),
        )
    answer = kube_api.raw(
        "POST", f"/api/v1/namespaces/{kube_api.namespace}/bindings", {"target": {"name": "n"}}
    )
    assert (answer.status_code, answer.json()) == (
        400,
        _status(400, "Name parameter required.", "BadRequest"),
    )
    assert kube_api.core.read_namespaced_pod("p", kube_api.namespace).spec.node_name is None


def test_binding_refuses_gated_pods_and_honours_uid_precondition(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    core.create_namespaced_pod(ns, pod_body("gated", schedulingGates=[{"name": "g"}]))
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_binding("gated", ns, _binding("gated", "n"), _preload_content=False)
    assert error_body(exc.value) == _status(
        409,
        'Operation cannot be fulfilled on pods/binding "gated": '
        "pod gated has non-empty .spec.schedulingGates",
        "Conflict",
        {"name": "gated", "kind": "pods/binding"},
    )
    uid = core.create_namespaced_pod(ns, pod_body("p")).metadata.uid
    stale = _binding("p", "n")
    stale["metadata"] = {"name": "p", "uid": "not-the-uid"}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_binding("p", ns, stale, _preload_content=False)
    # The Binding's uid is a precondition of the pod's storage update: etcd3's words, on pods.
    assert error_body(exc.value) == _status(
        409,
        f'Operation cannot be fulfilled on pods "p": StorageError: invalid object, Code: 4, '
        f"Key: /registry/pods/{ns}/p, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: "
        f"UID in precondition: not-the-uid, UID in object meta: {uid}",
        "Conflict",
        {"name": "p", "kind": "pods"},
    )
    # Legacy POST .../bindings (pod named in the body) is the same operation.
    resp = core.create_namespaced_binding(ns, _binding("p", "n"), _preload_content=False)
    assert resp.status == 201
    assert json.loads(resp.data) == SUCCESS_201
    assert core.read_namespaced_pod("p", ns).spec.node_name == "n"


def test_binding_copies_its_annotations_and_honours_a_resource_version_precondition(
    kube_api: KubeApi,
) -> None:
    # kube-apiserver's BindingREST: the Binding's annotations land on the pod with the node, in
    # the same write, and metadata.resourceVersion is a precondition like metadata.uid.
    core, ns = kube_api.core, kube_api.namespace
    body = pod_body("p")
    body["metadata"]["annotations"] = {"keep": "me"}
    created = core.create_namespaced_pod(ns, body)
    stale = _binding("p", "n")
    stale["metadata"] = {"name": "p", "resourceVersion": "1", "annotations": {"a": "b"}}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_binding("p", ns, stale, _preload_content=False)
    assert exc.value.status == 409
    assert error_body(exc.value)["message"].endswith(
        "Precondition failed: ResourceVersion in precondition: 1, "
        f"ResourceVersion in object meta: {created.metadata.resource_version}"
    )
    pod = core.read_namespaced_pod("p", ns)
    assert (pod.spec.node_name, pod.metadata.annotations) == (None, {"keep": "me"})
    current = _binding("p", "n")
    current["metadata"] = {
        "name": "p",
        "resourceVersion": created.metadata.resource_version,
        "annotations": {"a": "b"},
    }
    core.create_namespaced_pod_binding("p", ns, current, _preload_content=False)
    pod = core.read_namespaced_pod("p", ns)
    assert pod.spec.node_name == "n"
    assert pod.metadata.annotations == {"keep": "me", "a": "b"}


def _running(kube_api: KubeApi, name: str, *, labels: dict[str, str] | None = None) -> str:
    """A bound, Running and Ready pod, as its kubelet would report it (no kubelet runs here)."""
    body = pod_body(name, labels=labels or {"app": "web"}, nodeName=kube_api.node_name("n1"))
    body["metadata"]["finalizers"] = ["example.com/keep"]  # it stays to be looked at once evicted
    uid = str(kube_api.core.create_namespaced_pod(kube_api.namespace, body).metadata.uid)
    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    kube_api.core.patch_namespaced_pod_status(name, kube_api.namespace, {"status": status})
    return uid


def test_eviction_of_a_pending_pod_deletes_it(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    core.create_namespaced_pod(ns, pod_body("p"))
    resp = core.create_namespaced_pod_eviction("p", ns, _eviction("p"), _preload_content=False)
    assert resp.status == 201
    assert json.loads(resp.data) == SUCCESS_201
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod("p", ns)
    assert exc.value.status == 404
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("ghost", ns, _eviction("ghost"), _preload_content=False)
    assert error_body(exc.value) == _status(
        404, 'pods "ghost" not found', "NotFound", {"name": "ghost", "kind": "pods"}
    )


def test_eviction_honours_a_disruption_budget_s_status(kube_api: KubeApi) -> None:
    """The eviction subresource reads the budget's status; here the test writes it, as the
    disruption controller would (neither server runs one here)."""
    core, ns = kube_api.core, kube_api.namespace
    policy: Client = kubernetes.client.PolicyV1Api(kube_api.api_client)
    _running(kube_api, "a")
    _running(kube_api, "b")
    pdb = {
        "metadata": {"name": "web"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
    }
    policy.create_namespaced_pod_disruption_budget(ns, pdb)
    with pytest.raises(ApiException) as exc:  # a status never written: not yet observed
        core.create_namespaced_pod_eviction("a", ns, _eviction("a"), _preload_content=False)
    assert error_body(exc.value) == _status(
        429,
        "Cannot evict pod as it would violate the pod's disruption budget.",
        "TooManyRequests",
        {
            "causes": [
                {
                    "reason": "DisruptionBudget",
                    "message": "The disruption budget web is still being processed by the server.",
                }
            ],
            "retryAfterSeconds": 10,
        },
    )
    assert header(exc.value, "Retry-After") == "10"
    status = {
        "observedGeneration": 1,
        "disruptionsAllowed": 0,
        "currentHealthy": 2,
        "desiredHealthy": 2,
        "expectedPods": 2,
    }
    policy.patch_namespaced_pod_disruption_budget_status("web", ns, {"status": status})
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("a", ns, _eviction("a"), _preload_content=False)
    assert error_body(exc.value) == _status(
        429,
        "Cannot evict pod as it would violate the pod's disruption budget.",
        "TooManyRequests",
        {
            "causes": [
                {
                    "reason": "DisruptionBudget",
                    "message": "The disruption budget web needs 2 healthy pods and has 2 currently",
                }
            ]
        },
    )
    status.update(disruptionsAllowed=1, desiredHealthy=1)
    policy.patch_namespaced_pod_disruption_budget_status("web", ns, {"status": status})
    resp = core.create_namespaced_pod_eviction("a", ns, _eviction("a"), _preload_content=False)
    assert (resp.status, json.loads(resp.data)) == (201, SUCCESS_201)
    assert core.read_namespaced_pod("a", ns).metadata.deletion_timestamp is not None  # its finalizer holds it
    after = policy.read_namespaced_pod_disruption_budget_status("web", ns).status
    assert (after.disruptions_allowed, list(after.disrupted_pods)) == (0, ["a"])
    assert (after.conditions[0].type, after.conditions[0].status, after.conditions[0].reason) == (
        "DisruptionAllowed",
        "False",
        "InsufficientPods",
    )
    with pytest.raises(ApiException) as exc:  # the one disruption allowed is used up
        core.create_namespaced_pod_eviction("b", ns, _eviction("b"), _preload_content=False)
    assert exc.value.status == 429


def test_block_evictions_answers_like_a_budget(kube_fake: FakeKubeServer, core: Client) -> None:
    """Fake only: ``block_evictions`` is fault injection."""
    held = pod_body("held")
    held["metadata"]["finalizers"] = ["example.com/keep"]
    core.create_namespaced_pod("default", held)
    kube_fake.block_evictions(count=1)
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("held", "default", _eviction("held"), _preload_content=False)
    body = error_body(exc.value)
    assert (exc.value.status, body["reason"]) == (429, "TooManyRequests")
    assert body["details"]["causes"][0]["reason"] == "DisruptionBudget"
    core.create_namespaced_pod_eviction("held", "default", _eviction("held"), _preload_content=False)
    pod = core.read_namespaced_pod("held", "default")
    assert pod.metadata.deletion_timestamp is not None  # finalizer keeps it around
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("ghost", "default", _eviction("ghost"), _preload_content=False)
    assert exc.value.status == 404


def test_eviction_preconditions(kube_api: KubeApi) -> None:
    """A pod under no budget: the precondition is checked as the pod is deleted (for a Pending
    pod the real server retries that for ten seconds first, so the pod here is Running)."""
    core, ns = kube_api.core, kube_api.namespace
    uid = _running(kube_api, "p")
    body = _eviction("p", preconditions={"uid": "wrong"})
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("p", ns, body, _preload_content=False)
    assert error_body(exc.value) == _status(
        409,
        'Operation cannot be fulfilled on Pod "p": the UID in the precondition (wrong) does not match '
        f"the UID in record ({uid}). The object might have been deleted and then recreated",
        "Conflict",
        {"name": "p", "kind": "Pod"},
    )
    assert core.read_namespaced_pod("p", ns).metadata.deletion_timestamp is None
    # (What an eviction that goes through writes: test_disruption.py's delete-options test.)


def test_status_subresources_write_status_and_metadata_not_spec(kube_api: KubeApi) -> None:
    """A built-in kind's status strategy puts the spec back, not the metadata (a pod keeps its
    ownerReferences, a Deployment its labels); a custom resource's /status takes only status."""
    core, ns, node_name = kube_api.core, kube_api.namespace, kube_api.node_name("n")
    body = pod_body("p")
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "u-1"}
    body["metadata"]["ownerReferences"] = [owner]
    core.create_namespaced_pod(ns, body)
    pod = core.read_namespaced_pod_status("p", ns)
    pod.status.phase = "Running"
    pod.spec.containers[0].image = "changed:1"
    pod.metadata.labels = {"written": "yes"}
    pod.metadata.owner_references = None
    after = core.replace_namespaced_pod_status("p", ns, pod)
    assert after.status.phase == "Running"
    assert after.spec.containers[0].image == "busybox:1.36"
    assert after.metadata.labels == {"written": "yes"}
    assert [r.uid for r in after.metadata.owner_references] == ["u-1"]
    after = core.patch_namespaced_pod_status(
        "p", ns, {"spec": {"nodeName": "sneaky"}, "status": {"phase": "Succeeded"}}
    )
    assert after.status.phase == "Succeeded"
    assert after.spec.node_name is None
    core.create_node({"metadata": {"name": node_name}})
    node = core.patch_node_status(
        node_name, {"status": {"allocatable": {"cpu": "4"}}, "spec": {"unschedulable": True}}
    )
    assert node.status.allocatable == {"cpu": "4"}
    assert not node.spec.unschedulable
    node.status.allocatable = {"cpu": "8"}
    assert core.replace_node_status(node_name, node).status.allocatable == {"cpu": "8"}
    assert core.read_node_status(node_name).status.allocatable == {"cpu": "8"}


def test_a_status_write_keeps_what_the_kind_puts_back(kube_api: KubeApi, widgets: CustomResource) -> None:
    ns = kube_api.namespace
    apps: Client = kubernetes.client.AppsV1Api(kube_api.api_client)
    template = {"metadata": {"labels": {"app": "d"}}, "spec": pod_body("x")["spec"]}
    spec = {"selector": {"matchLabels": {"app": "d"}}, "template": template}
    apps.create_namespaced_deployment(ns, {"metadata": {"name": "d", "labels": {"v": "1"}}, "spec": spec})
    patch = {"metadata": {"labels": {"v": "2"}, "annotations": {"a": "b"}}, "status": {"replicas": 1}}
    after = apps.patch_namespaced_deployment_status("d", ns, patch)
    assert (after.metadata.labels, after.metadata.annotations, after.status.replicas) == (
        {"v": "1"},
        {"a": "b"},
        1,
    )
    custom: Client = kubernetes.client.CustomObjectsApi(kube_api.api_client)
    args = (widgets.group, widgets.version, ns, widgets.plural)
    custom.create_namespaced_custom_object(
        *args, {"apiVersion": widgets.api_version, "kind": widgets.kind, "metadata": {"name": "w"}}
    )
    written = custom.patch_namespaced_custom_object_status(
        *args, "w", {"metadata": {"labels": {"v": "2"}}, "spec": {"x": 1}, "status": {"ready": True}}
    )
    assert (written["metadata"].get("labels"), written.get("spec"), written["status"]) == (
        None,
        None,
        {"ready": True},
    )
