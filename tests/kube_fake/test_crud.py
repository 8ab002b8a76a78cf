"""Behaviours 1-4: generic store, metadata on create, 404/409 Status, optimistic concurrency."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
import uuid

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.kube_fake import FakeKubeServer, ResourceType
from tests.kube_fake.builders import Client, error_body, header, pod_body

RFC3339_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def test_pod_create_sets_metadata_and_defaults(core: Client) -> None:
    pod = core.create_namespaced_pod("default", pod_body("p1"))
    meta = pod.metadata
    assert uuid.UUID(meta.uid).version == 4
    raw = json.loads(core.read_namespaced_pod("p1", "default", _preload_content=False).data)
    assert RFC3339_Z.match(raw["metadata"]["creationTimestamp"])
    assert meta.resource_version.isdigit()
    assert meta.generation == 1
    assert meta.namespace == "default"
    assert pod.spec.scheduler_name == "default-scheduler"
    assert pod.status.phase == "Pending"
    assert pod.kind == "Pod"
    assert pod.api_version == "v1"
    # Client-supplied status is discarded on create, as PodStrategy does.
    body = pod_body("p2", schedulerName="slurm-bridge")
    body["status"] = {"phase": "Running"}
    pod2 = core.create_namespaced_pod("default", body)
    assert pod2.spec.scheduler_name == "slurm-bridge"
    assert pod2.status.phase == "Pending"
    assert core.read_namespaced_pod("p2", "default").metadata.uid == pod2.metadata.uid


def test_generate_name(core: Client) -> None:
    body = pod_body("")
    body["metadata"] = {"generateName": "worker-"}
    a = core.create_namespaced_pod("default", body)
    b = core.create_namespaced_pod("default", body)
    assert re.fullmatch(r"worker-[a-z0-9]{5}", a.metadata.name)
    assert a.metadata.name != b.metadata.name
    assert a.metadata.generate_name == "worker-"


def test_resource_version_is_one_global_counter(kube_fake: FakeKubeServer, api_client: Client) -> None:
    core: Client = kubernetes.client.CoreV1Api(api_client)
    apps: Client = kubernetes.client.AppsV1Api(api_client)
    rv1 = int(core.create_namespaced_pod("default", pod_body("a")).metadata.resource_version)
    rv2 = int(core.create_node({"metadata": {"name": "n1"}}).metadata.resource_version)
    deploy = {
        "metadata": {"name": "d"},
        "spec": {
            "selector": {"matchLabels": {"app": "d"}},
            "template": {"metadata": {"labels": {"app": "d"}}, "spec": pod_body("x")["spec"]},
        },
    }
    rv3 = int(apps.create_namespaced_deployment("default", deploy).metadata.resource_version)
    assert rv1 < rv2 < rv3 == kube_fake.store.rv
    listed = core.list_namespaced_pod("default")
    assert listed.metadata.resource_version == str(rv3)


def test_already_exists_and_not_found_are_status_bodies(core: Client) -> None:
    core.create_namespaced_pod("default", pod_body("dup"))
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("default", pod_body("dup"))
    assert exc.value.status == 409
    assert error_body(exc.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "dup" already exists',
        "reason": "AlreadyExists",
        "details": {"name": "dup", "kind": "pods"},
        "code": 409,
    }
    assert header(exc.value, "Content-Type") == "application/json"
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod("missing", "default")
    body = error_body(exc.value)
    assert (exc.value.status, body["reason"], body["message"]) == (
        404,
        "NotFound",
        'pods "missing" not found',
    )
    # The Status also deserialises into the client's strict model.
    status = core.api_client.deserialize(exc.value.body, "V1Status", "application/json")
    assert status.details.name == "missing"


def test_cluster_scoped_and_group_resources(kube_fake: FakeKubeServer, api_client: Client) -> None:
    core: Client = kubernetes.client.CoreV1Api(api_client)
    batch: Client = kubernetes.client.BatchV1Api(api_client)
    custom: Client = kubernetes.client.CustomObjectsApi(api_client)
    events: Client = kubernetes.client.EventsV1Api(api_client)
    node = core.create_node({"metadata": {"name": "node-1", "namespace": "ignored"}})
    assert node.metadata.namespace is None
    assert [n.metadata.name for n in core.list_node().items] == ["node-1"]
    core.create_namespace({"metadata": {"name": "team-a"}})
    assert core.read_namespace("team-a").status.phase == "Active"
    assert {"default", "kube-system", "team-a"} <= {n.metadata.name for n in core.list_namespace().items}
    job = {
        "metadata": {"name": "j"},
        "spec": {"template": {"spec": {**pod_body("x")["spec"], "restartPolicy": "Never"}}},
    }
    assert batch.create_namespaced_job("team-a", job).metadata.namespace == "team-a"
    for group, version, plural, kind in [
        ("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet"),
        ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet"),
        ("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup"),
    ]:
        obj = {"apiVersion": f"{group}/{version}", "kind": kind, "metadata": {"name": "g"}, "spec": {"x": 1}}
        created = custom.create_namespaced_custom_object(group, version, "team-a", plural, obj)
        assert created["metadata"]["resourceVersion"]
        assert created["kind"] == kind
        listed = custom.list_namespaced_custom_object(group, version, "team-a", plural)
        assert listed["kind"] == f"{kind}List"
        assert listed["items"][0]["kind"] == kind
    core.create_namespaced_pod("default", pod_body("p"))
    core.create_namespaced_pod("team-a", pod_body("p"))
    assert sorted(p.metadata.namespace for p in core.list_pod_for_all_namespaces().items) == [
        "default",
        "team-a",
    ]
    core.create_namespaced_event(
        "default", {"metadata": {"name": "e1"}, "involvedObject": {"kind": "Pod", "name": "p"}}
    )
    ev = events.create_namespaced_event(
        "default",
        {"metadata": {"name": "e2"}, "eventTime": "2026-01-01T00:00:00.000000Z", "reason": "Scheduled"},
    )
    assert ev.api_version == "events.k8s.io/v1"
    assert [e.metadata.name for e in core.list_namespaced_event("default").items] == ["e1"]
    # Extra kinds can be registered at runtime.
    kube_fake.register_resource(ResourceType("example.dev", "v1", "widgets", "Widget", False, custom=True))
    custom.create_cluster_custom_object("example.dev", "v1", "widgets", {"metadata": {"name": "w"}})
    assert kube_fake.get_object("widgets.example.dev", "w") is not None


def test_put_and_patch_with_stale_resource_version_conflict(core: Client) -> None:
    pod = core.create_namespaced_pod("default", pod_body("p", labels={"v": "1"}))
    stale_rv = pod.metadata.resource_version
    pod.metadata.labels = {"v": "2"}
    updated = core.replace_namespaced_pod("p", "default", pod)
    assert int(updated.metadata.resource_version) > int(stale_rv)
    pod.metadata.labels = {"v": "3"}
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_pod("p", "default", pod)  # still carries the old RV
    body = error_body(exc.value)
    assert (exc.value.status, body["reason"]) == (409, "Conflict")
    assert body["message"].startswith(
        'Operation cannot be fulfilled on pods "p": the object has been modified'
    )
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod(
            "p", "default", {"metadata": {"resourceVersion": stale_rv, "labels": {"v": "4"}}}
        )
    assert exc.value.status == 409
    # PUT without resourceVersion is unconditional.
    pod.metadata.resource_version = None
    assert core.replace_namespaced_pod("p", "default", pod).metadata.labels == {"v": "3"}
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_pod("other", "default", pod)
    assert exc.value.status == 400


def test_a_foreign_uid_is_a_precondition_for_put_and_immutable_for_patch(core: Client) -> None:
    """What a write naming another pod's uid gets, as kube-apiserver answers it.

    PUT takes the body's uid as a storage precondition (409 Conflict, "Precondition
    failed"); PATCH builds the new object from the stored one and the patch, so a
    different uid fails validation of an immutable field (422 Invalid), unless the
    patch's resourceVersion is stale, which is checked first (409).
    """
    pod = core.create_namespaced_pod("default", pod_body("p", labels={"v": "1"}))
    pod.metadata.uid = "a-namesake"
    pod.metadata.resource_version = None
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_pod("p", "default", pod)
    body = error_body(exc.value)
    assert (exc.value.status, body["reason"]) == (409, "Conflict")
    assert "Precondition failed: UID in precondition: a-namesake" in body["message"]
    for content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
        with pytest.raises(ApiException) as exc:
            core.patch_namespaced_pod(
                "p",
                "default",
                {"metadata": {"uid": "a-namesake", "labels": {"v": "2"}}},
                _content_type=content_type,
            )
        body = error_body(exc.value)
        assert (exc.value.status, body["reason"]) == (422, "Invalid")
        assert 'metadata.uid: Invalid value: "a-namesake": field is immutable' in body["message"]
        assert body["details"]["causes"][0]["field"] == "metadata.uid"
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p", "default", {"metadata": {"uid": "a-namesake", "resourceVersion": "1"}})
    assert exc.value.status == 409  # the stale resourceVersion is found first
    assert core.read_namespaced_pod("p", "default").metadata.labels == {"v": "1"}


def test_main_resource_writes_ignore_status(core: Client) -> None:
    core.create_namespaced_pod("default", pod_body("p"))
    pod = core.read_namespaced_pod("p", "default")
    pod.status.phase = "Running"
    pod.metadata.labels = {"changed": "yes"}
    after = core.replace_namespaced_pod("p", "default", pod)
    assert after.status.phase == "Pending"
    assert after.metadata.labels == {"changed": "yes"}
    after = core.patch_namespaced_pod("p", "default", {"status": {"phase": "Failed"}})
    assert after.status.phase == "Pending"
    node = core.create_node({"metadata": {"name": "n"}, "status": {"capacity": {"cpu": "2"}}})
    assert node.status.capacity == {"cpu": "2"}  # nodes keep status on create
    patched = core.patch_node("n", {"status": {"capacity": {"cpu": "8"}}, "metadata": {"labels": {"a": "b"}}})
    assert patched.status.capacity == {"cpu": "2"}
    assert patched.metadata.labels == {"a": "b"}


def test_pod_spec_is_immutable_except_documented_fields(core: Client) -> None:
    core.create_namespaced_pod("default", pod_body("p", schedulingGates=[{"name": "slurm"}]))
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p", "default", {"spec": {"nodeName": "n1"}})
    body = error_body(exc.value)
    assert (exc.value.status, body["reason"]) == (422, "Invalid")
    assert body["message"].startswith(
        'Pod "p" is invalid: spec: Forbidden: pod updates may not change fields'
    )
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p", "default", {"spec": {"schedulingGates": [{"name": "new-gate"}]}})
    assert "only deletion is allowed" in error_body(exc.value)["message"]
    # Image changes, toleration additions, gate removal and (while gated) nodeSelector additions are allowed.
    patch = {
        "spec": {
            "containers": [{"name": "main", "image": "busybox:1.37"}],
            "tolerations": [{"key": "k", "operator": "Exists"}],
            "nodeSelector": {"zone": "a"},
        }
    }
    pod = core.patch_namespaced_pod("p", "default", patch)
    assert pod.spec.containers[0].image == "busybox:1.37"
    assert pod.spec.node_selector == {"zone": "a"}
    pod = core.patch_namespaced_pod(
        "p",
        "default",
        {
            "spec": {
                "$setElementOrder/schedulingGates": [],
                "schedulingGates": [{"name": "slurm", "$patch": "delete"}],
            }
        },
    )
    assert not pod.spec.scheduling_gates


def test_names_are_validated(core: Client) -> None:
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("default", pod_body("Bad_Name"))
    body = error_body(exc.value)
    assert exc.value.status == 422
    assert body["details"]["causes"][0]["field"] == "metadata.name"
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(
            "default", {"metadata": {"name": "nocontainers"}, "spec": {"containers": []}}
        )
    assert (
        error_body(exc.value)["message"] == 'Pod "nocontainers" is invalid: spec.containers: Required value'
    )


def _raw(url: str, method: str = "GET") -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_unknown_paths_and_methods(kube_fake: FakeKubeServer) -> None:
    code, body = _raw(kube_fake.url + "/api/v1/namespaces/default/widgets")
    assert (code, body["reason"]) == (404, "NotFound")
    code, body = _raw(kube_fake.url + "/api/v1/pods", method="PUT")
    assert (code, body["reason"]) == (405, "MethodNotAllowed")
    code, body = _raw(kube_fake.url + "/api/v1/nodes/n1/binding", method="POST")
    assert code == 404


def test_discovery_version_and_healthz(kube_fake: FakeKubeServer, api_client: Client) -> None:
    assert kubernetes.client.VersionApi(api_client).get_code().git_version.startswith("v1.")
    assert kubernetes.client.CoreApi(api_client).get_api_versions().versions == ["v1"]
    groups: Client = kubernetes.client.ApisApi(api_client).get_api_versions().groups
    assert {"apps", "batch", "jobset.x-k8s.io", "events.k8s.io"} <= {g.name for g in groups}
    resources: Client = kubernetes.client.CoreV1Api(api_client).get_api_resources().resources
    names = {r.name for r in resources}
    assert {"pods", "pods/status", "pods/binding", "pods/eviction", "nodes", "namespaces"} <= names
    assert kubernetes.client.AppsV1Api(api_client).get_api_resources().group_version == "apps/v1"
    with urllib.request.urlopen(kube_fake.url + "/healthz") as resp:
        assert resp.read() == b"ok"
    with urllib.request.urlopen(kube_fake.url + "/apis/batch") as resp:
        assert json.loads(resp.read())["preferredVersion"]["groupVersion"] == "batch/v1"


def test_require_namespaces_option() -> None:
    with FakeKubeServer(require_namespaces=True) as server, server.api_client() as client:
        core: Client = kubernetes.client.CoreV1Api(client)
        with pytest.raises(ApiException) as exc:
            core.create_namespaced_pod("team-b", pod_body("p"))
        assert error_body(exc.value)["message"] == 'namespaces "team-b" not found'
        core.create_namespace({"metadata": {"name": "team-b"}})
        assert core.create_namespaced_pod("team-b", pod_body("p")).metadata.namespace == "team-b"


def test_malformed_query_parameters_are_400(kube_fake: FakeKubeServer) -> None:
    code, body = _raw(kube_fake.url + "/api/v1/pods?watch=true&timeoutSeconds=soon")
    assert (code, body["reason"]) == (400, "BadRequest")
    code, _ = _raw(kube_fake.url + "/api/v1/namespaces/default/pods/x?gracePeriodSeconds=x", method="DELETE")
    assert code == 400
    code, _ = _raw(kube_fake.url + "/api/v1/pods?labelSelector=a%20in%20()")
    assert code == 400
