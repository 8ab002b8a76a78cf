"""Behaviour 6: pods/binding, pods/eviction, pods/status and nodes/status."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from tests.kube_fake import FakeKubeServer
from tests.kube_fake.builders import Client, error_body, pod_body

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


def test_binding_sets_node_and_scheduled_condition(core: Client) -> None:
    core.create_namespaced_pod("default", pod_body("p"))
    resp = core.create_namespaced_pod_binding("p", "default", _binding("p", "node-1"), _preload_content=False)
    assert resp.status == 201
    assert json.loads(resp.data) == SUCCESS_201
    pod = core.read_namespaced_pod("p", "default")
    assert pod.spec.node_name == "node-1"
    assert [(c.type, c.status) for c in pod.status.conditions] == [("PodScheduled", "True")]
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_binding("p", "default", _binding("p", "node-2"), _preload_content=False)
    body = error_body(exc.value)
    assert (exc.value.status, body["reason"]) == (409, "Conflict")
    assert body["message"] == (
        'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "node-1"'
    )
    assert body["details"] == {"name": "p", "kind": "pods/binding"}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_binding("ghost", "default", _binding("ghost", "n"), _preload_content=False)
    assert exc.value.status == 404


def test_binding_refuses_gated_pods_and_honours_uid_precondition(core: Client) -> None:
    core.create_namespaced_pod("default", pod_body("gated", schedulingGates=[{"name": "g"}]))
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_binding("gated", "default", _binding("gated", "n"), _preload_content=False)
    assert exc.value.status == 409
    assert "non-empty .spec.schedulingGates" in str(exc.value.body)
    core.create_namespaced_pod("default", pod_body("p"))
    stale = _binding("p", "n")
    stale["metadata"] = {"name": "p", "uid": "not-the-uid"}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_binding("p", "default", stale, _preload_content=False)
    assert exc.value.status == 409
    assert "Precondition failed: UID" in str(exc.value.body)
    # Legacy POST .../bindings (pod named in the body) is the same operation.
    resp = core.create_namespaced_binding("default", _binding("p", "n"), _preload_content=False)
    assert resp.status == 201
    assert core.read_namespaced_pod("p", "default").spec.node_name == "n"


def test_binding_copies_its_annotations_and_honours_a_resource_version_precondition(core: Client) -> None:
    # kube-apiserver's BindingREST: the Binding's annotations land on the pod with the node, in
    # the same write, and metadata.resourceVersion is a precondition like metadata.uid.
    body = pod_body("p")
    body["metadata"]["annotations"] = {"keep": "me"}
    created = core.create_namespaced_pod("default", body)
    stale = _binding("p", "n")
    stale["metadata"] = {"name": "p", "resourceVersion": "1", "annotations": {"a": "b"}}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_binding("p", "default", stale, _preload_content=False)
    assert exc.value.status == 409
    assert "Precondition failed: ResourceVersion" in str(exc.value.body)
    pod = core.read_namespaced_pod("p", "default")
    assert (pod.spec.node_name, pod.metadata.annotations) == (None, {"keep": "me"})
    current = _binding("p", "n")
    current["metadata"] = {
        "name": "p",
        "resourceVersion": created.metadata.resource_version,
        "annotations": {"a": "b"},
    }
    core.create_namespaced_pod_binding("p", "default", current, _preload_content=False)
    pod = core.read_namespaced_pod("p", "default")
    assert pod.spec.node_name == "n"
    assert pod.metadata.annotations == {"keep": "me", "a": "b"}


def test_eviction_deletes_honours_finalizers_and_pdb_fault(kube_fake: FakeKubeServer, core: Client) -> None:
    core.create_namespaced_pod("default", pod_body("p"))
    resp = core.create_namespaced_pod_eviction("p", "default", _eviction("p"), _preload_content=False)
    assert resp.status == 201
    assert json.loads(resp.data) == SUCCESS_201
    assert kube_fake.get_object("pods", "p", "default") is None

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


def test_eviction_preconditions(core: Client) -> None:
    core.create_namespaced_pod("default", pod_body("p"))
    body = _eviction("p", preconditions={"uid": "wrong"})
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("p", "default", body, _preload_content=False)
    assert exc.value.status == 409


def test_status_subresources_touch_only_status(core: Client) -> None:
    core.create_namespaced_pod("default", pod_body("p"))
    pod = core.read_namespaced_pod_status("p", "default")
    pod.status.phase = "Running"
    pod.spec.containers[0].image = "changed:1"
    pod.metadata.labels = {"ignored": "yes"}
    after = core.replace_namespaced_pod_status("p", "default", pod)
    assert after.status.phase == "Running"
    assert after.spec.containers[0].image == "busybox:1.36"
    assert not after.metadata.labels
    after = core.patch_namespaced_pod_status(
        "p", "default", {"spec": {"nodeName": "sneaky"}, "status": {"phase": "Succeeded"}}
    )
    assert after.status.phase == "Succeeded"
    assert after.spec.node_name is None
    core.create_node({"metadata": {"name": "n"}})
    node = core.patch_node_status(
        "n", {"status": {"allocatable": {"cpu": "4"}}, "spec": {"unschedulable": True}}
    )
    assert node.status.allocatable == {"cpu": "4"}
    assert not node.spec.unschedulable
    node.status.allocatable = {"cpu": "8"}
    assert core.replace_node_status("n", node).status.allocatable == {"cpu": "8"}
    assert core.read_node_status("n").status.allocatable == {"cpu": "8"}
