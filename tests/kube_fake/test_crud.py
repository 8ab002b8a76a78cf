"""Behaviours 1-4: generic store, metadata on create, 404/409 Status, optimistic concurrency.

The tests taking ``kube_api`` run against the fake and the real kube-apiserver alike;
the others are about the fake alone (its registered custom resources and options).
"""

from __future__ import annotations

import json
import re
import uuid

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from testbed.kube_fake import FakeKubeServer, ResourceType
from testbed.kube_fake.backend import KubeApi
from testbed.kube_fake.builders import Client, error_body, header, pod_body

RFC3339_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def test_pod_create_sets_metadata_and_defaults(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    pod = core.create_namespaced_pod(ns, pod_body("p1"))
    meta = pod.metadata
    assert uuid.UUID(meta.uid).version == 4
    raw = json.loads(core.read_namespaced_pod("p1", ns, _preload_content=False).data)
    assert RFC3339_Z.match(raw["metadata"]["creationTimestamp"])
    assert meta.resource_version.isdigit()
    if kube_api.is_fake:
        # Pods carry a generation from Kubernetes 1.33 on; the real test bed is 1.28.
        assert meta.generation == 1
    assert meta.namespace == ns
    assert pod.spec.scheduler_name == "default-scheduler"
    assert pod.status.phase == "Pending"
    assert pod.kind == "Pod"
    assert pod.api_version == "v1"
    # Client-supplied status is discarded on create, as PodStrategy does.
    body = pod_body("p2", schedulerName="slurm-bridge")
    body["status"] = {"phase": "Running"}
    pod2 = core.create_namespaced_pod(ns, body)
    assert pod2.spec.scheduler_name == "slurm-bridge"
    assert pod2.status.phase == "Pending"
    assert core.read_namespaced_pod("p2", ns).metadata.uid == pod2.metadata.uid


def test_generate_name(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    body = pod_body("")
    body["metadata"] = {"generateName": "worker-"}
    a = core.create_namespaced_pod(ns, body)
    b = core.create_namespaced_pod(ns, body)
    assert re.fullmatch(r"worker-[a-z0-9]{5}", a.metadata.name)
    assert a.metadata.name != b.metadata.name
    assert a.metadata.generate_name == "worker-"


def test_resource_version_is_one_global_counter(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    apps: Client = kubernetes.client.AppsV1Api(kube_api.api_client)
    rv1 = int(core.create_namespaced_pod(ns, pod_body("a")).metadata.resource_version)
    rv2 = int(core.create_node({"metadata": {"name": kube_api.node_name("n1")}}).metadata.resource_version)
    deploy = {
        "metadata": {"name": "d"},
        "spec": {
            "selector": {"matchLabels": {"app": "d"}},
            "template": {"metadata": {"labels": {"app": "d"}}, "spec": pod_body("x")["spec"]},
        },
    }
    rv3 = int(apps.create_namespaced_deployment(ns, deploy).metadata.resource_version)
    assert rv1 < rv2 < rv3
    # A list answers at the current version of everything (the real server's own writes,
    # such as its lease renewals, may have come since).
    listed = int(core.list_namespaced_pod(ns).metadata.resource_version)
    assert listed >= rv3
    if kube_api.fake is not None:
        assert listed == rv3 == kube_api.fake.store.rv


def test_already_exists_and_not_found_are_status_bodies(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    core.create_namespaced_pod(ns, pod_body("dup"))
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(ns, pod_body("dup"))
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
        core.read_namespaced_pod("missing", ns)
    assert error_body(exc.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "missing" not found',
        "reason": "NotFound",
        "details": {"name": "missing", "kind": "pods"},
        "code": 404,
    }
    with pytest.raises(ApiException) as exc:
        kubernetes.client.BatchV1Api(kube_api.api_client).read_namespaced_job("missing", ns)
    assert error_body(exc.value)["details"] == {"name": "missing", "group": "batch", "kind": "jobs"}
    assert error_body(exc.value)["message"] == 'jobs.batch "missing" not found'
    # The Status also deserialises into the client's strict model.
    status = core.api_client.deserialize(exc.value.body, "V1Status", "application/json")
    assert status.details.name == "missing"


def test_cluster_scoped_and_group_resources(kube_fake: FakeKubeServer, api_client: Client) -> None:
    """Fake only: the custom resources the fake registers (the real test bed has no CRDs but
    the tests' own) and registration at runtime."""
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
        # A MicroTime whose fraction is not zero: the client would re-encode a zero one without it.
        {"metadata": {"name": "e2"}, "eventTime": "2026-01-01T00:00:00.000001Z", "reason": "Scheduled"},
    )
    assert ev.api_version == "events.k8s.io/v1"
    assert [e.metadata.name for e in core.list_namespaced_event("default").items] == ["e1"]
    # Extra kinds can be registered at runtime.
    kube_fake.register_resource(ResourceType("example.dev", "v1", "widgets", "Widget", False, custom=True))
    custom.create_cluster_custom_object("example.dev", "v1", "widgets", {"metadata": {"name": "w"}})
    assert kube_fake.get_object("widgets.example.dev", "w") is not None


def test_put_and_patch_with_stale_resource_version_conflict(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    pod = core.create_namespaced_pod(ns, pod_body("p", labels={"v": "1"}))
    stale_rv = pod.metadata.resource_version
    pod.metadata.labels = {"v": "2"}
    updated = core.replace_namespaced_pod("p", ns, pod)
    assert int(updated.metadata.resource_version) > int(stale_rv)
    pod.metadata.labels = {"v": "3"}
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_pod("p", ns, pod)  # still carries the old RV
    assert error_body(exc.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'Operation cannot be fulfilled on pods "p": the object has been modified; '
        "please apply your changes to the latest version and try again",
        "reason": "Conflict",
        "details": {"name": "p", "kind": "pods"},
        "code": 409,
    }
    for content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
        with pytest.raises(ApiException) as exc:
            core.patch_namespaced_pod(
                "p",
                ns,
                {"metadata": {"resourceVersion": stale_rv, "labels": {"v": "4"}}},
                _content_type=content_type,
            )
        assert (exc.value.status, error_body(exc.value)["reason"]) == (409, "Conflict")
    ops = [{"op": "replace", "path": "/metadata/resourceVersion", "value": stale_rv}]
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p", ns, ops, _content_type="application/json-patch+json")
    assert exc.value.status == 409
    # PUT without resourceVersion is unconditional.
    pod.metadata.resource_version = None
    assert core.replace_namespaced_pod("p", ns, pod).metadata.labels == {"v": "3"}
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_pod("other", ns, pod)
    assert error_body(exc.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "the name of the object (p) does not match the name on the URL (other)",
        "reason": "BadRequest",
        "code": 400,
    }


def test_a_foreign_uid_is_a_precondition_for_put_and_immutable_for_patch(kube_api: KubeApi) -> None:
    """What a write naming another pod's uid gets, as kube-apiserver answers it.

    PUT takes the body's uid as a storage precondition (409 Conflict, etcd3's
    "Precondition failed"); PATCH builds the new object from the stored one and the
    patch, so a different uid fails validation of an immutable field (422 Invalid,
    the cause listed twice: generic and kind validation both check it), unless the
    patch's resourceVersion is stale, which is checked first (409).
    """
    core, ns = kube_api.core, kube_api.namespace
    pod = core.create_namespaced_pod(ns, pod_body("p", labels={"v": "1"}))
    uid = pod.metadata.uid
    pod.metadata.uid = "a-namesake"
    pod.metadata.resource_version = None
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_pod("p", ns, pod)
    assert error_body(exc.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'Operation cannot be fulfilled on pods "p": StorageError: invalid object, Code: 4, '
        f"Key: /registry/pods/{ns}/p, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: "
        f"UID in precondition: a-namesake, UID in object meta: {uid}",
        "reason": "Conflict",
        "details": {"name": "p", "kind": "pods"},
        "code": 409,
    }
    immutable = {
        "reason": "FieldValueInvalid",
        "message": 'Invalid value: "a-namesake": field is immutable',
        "field": "metadata.uid",
    }
    patches = [
        ("application/merge-patch+json", {"metadata": {"uid": "a-namesake", "labels": {"v": "2"}}}),
        ("application/strategic-merge-patch+json", {"metadata": {"uid": "a-namesake", "labels": {"v": "2"}}}),
        ("application/json-patch+json", [{"op": "replace", "path": "/metadata/uid", "value": "a-namesake"}]),
    ]
    for content_type, patch in patches:
        with pytest.raises(ApiException) as exc:
            core.patch_namespaced_pod("p", ns, patch, _content_type=content_type)
        assert error_body(exc.value) == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": 'Pod "p" is invalid: metadata.uid: Invalid value: "a-namesake": field is immutable',
            "reason": "Invalid",
            "details": {"name": "p", "kind": "Pod", "causes": [immutable, immutable]},
            "code": 422,
        }
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p", ns, {"metadata": {"uid": "a-namesake", "resourceVersion": "1"}})
    assert exc.value.status == 409  # the stale resourceVersion is found first
    assert core.read_namespaced_pod("p", ns).metadata.labels == {"v": "1"}


def test_main_resource_writes_ignore_status(kube_api: KubeApi) -> None:
    core, ns, node_name = kube_api.core, kube_api.namespace, kube_api.node_name("n")
    core.create_namespaced_pod(ns, pod_body("p"))
    pod = core.read_namespaced_pod("p", ns)
    pod.status.phase = "Running"
    pod.metadata.labels = {"changed": "yes"}
    after = core.replace_namespaced_pod("p", ns, pod)
    assert after.status.phase == "Pending"
    assert after.metadata.labels == {"changed": "yes"}
    after = core.patch_namespaced_pod("p", ns, {"status": {"phase": "Failed"}})
    assert after.status.phase == "Pending"
    node = core.create_node({"metadata": {"name": node_name}, "status": {"capacity": {"cpu": "2"}}})
    assert node.status.capacity == {"cpu": "2"}  # nodes keep status on create
    patched = core.patch_node(
        node_name, {"status": {"capacity": {"cpu": "8"}}, "metadata": {"labels": {"a": "b"}}}
    )
    assert patched.status.capacity == {"cpu": "2"}
    assert patched.metadata.labels == {"a": "b"}


def test_pod_spec_is_immutable_except_documented_fields(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    core.create_namespaced_pod(ns, pod_body("p", schedulingGates=[{"name": "slurm"}]))
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p", ns, {"spec": {"nodeName": "n1"}})
    body = error_body(exc.value)
    assert (exc.value.status, body["reason"]) == (422, "Invalid")
    # The real message goes on with a diff of the two specs, which the fake leaves out.
    assert body["message"].startswith(
        'Pod "p" is invalid: spec: Forbidden: pod updates may not change fields'
    )
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p", ns, {"spec": {"schedulingGates": [{"name": "new-gate"}]}})
    assert "only deletion is allowed" in error_body(exc.value)["message"]
    # Image changes, toleration additions, gate removal and (while gated) nodeSelector additions are allowed.
    patch = {
        "spec": {
            "containers": [{"name": "main", "image": "busybox:1.37"}],
            "tolerations": [{"key": "k", "operator": "Exists"}],
            "nodeSelector": {"zone": "a"},
        }
    }
    pod = core.patch_namespaced_pod("p", ns, patch)
    assert pod.spec.containers[0].image == "busybox:1.37"
    assert pod.spec.node_selector == {"zone": "a"}
    pod = core.patch_namespaced_pod(
        "p",
        ns,
        {
            "spec": {
                "$setElementOrder/schedulingGates": [],
                "schedulingGates": [{"name": "slurm", "$patch": "delete"}],
            }
        },
    )
    assert not pod.spec.scheduling_gates


def test_names_are_validated(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(ns, pod_body("Bad_Name"))
    body = error_body(exc.value)
    assert exc.value.status == 422
    assert body["details"]["causes"][0]["field"] == "metadata.name"
    assert body["message"].startswith('Pod "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": ')
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(ns, {"metadata": {"name": "nocontainers"}, "spec": {"containers": []}})
    assert (
        error_body(exc.value)["message"] == 'Pod "nocontainers" is invalid: spec.containers: Required value'
    )


GENERIC_404 = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "the server could not find the requested resource",
    "reason": "NotFound",
    "details": {},
    "code": 404,
}


def test_unknown_paths_and_methods(kube_api: KubeApi) -> None:
    ns = kube_api.namespace
    # A served group (or the core API) with an unknown resource or version: a Status.
    for path in (
        f"/api/v1/namespaces/{ns}/widgets",
        "/api/v2/pods",
        "/apis/apps/v9/deployments",
        "/apis/apps/v9",
    ):
        answer = kube_api.raw("GET", path)
        assert (answer.status_code, answer.headers["content-type"], answer.json()) == (
            404,
            "application/json",
            GENERIC_404,
        ), path
    answer = kube_api.raw("POST", "/api/v1/nodes/n1/binding", {})
    assert (answer.status_code, answer.json()) == (404, GENERIC_404)
    answer = kube_api.raw("PUT", "/api/v1/pods", {})
    assert (answer.status_code, answer.json()["reason"], answer.json()["code"]) == (
        405,
        "MethodNotAllowed",
        405,
    )
    # A group the server does not serve at all, or no API path: the router's plain-text 404.
    for path in ("/apis/not-served.example.com/v1/widgets", "/apis/not-served.example.com", "/no-such-path"):
        answer = kube_api.raw("GET", path)
        assert (answer.status_code, answer.headers["content-type"], answer.text) == (
            404,
            "text/plain; charset=utf-8",
            "404 page not found\n",
        ), path
    # The client raises it as any other 404, with the text as its body.
    custom: Client = kubernetes.client.CustomObjectsApi(kube_api.api_client)
    with pytest.raises(ApiException) as exc:
        custom.list_namespaced_custom_object("not-served.example.com", "v1", ns, "widgets")
    assert (exc.value.status, exc.value.body) == (404, "404 page not found\n")


def test_discovery_version_and_healthz(kube_api: KubeApi) -> None:
    api_client = kube_api.api_client
    assert kubernetes.client.VersionApi(api_client).get_code().git_version.startswith("v1.")
    assert kubernetes.client.CoreApi(api_client).get_api_versions().versions == ["v1"]
    groups: Client = kubernetes.client.ApisApi(api_client).get_api_versions().groups
    assert {"apps", "batch", "events.k8s.io", "policy", "coordination.k8s.io"} <= {g.name for g in groups}
    resources: Client = kubernetes.client.CoreV1Api(api_client).get_api_resources().resources
    names = {r.name for r in resources}
    assert {"pods", "pods/status", "pods/binding", "pods/eviction", "nodes", "namespaces"} <= names
    assert kubernetes.client.AppsV1Api(api_client).get_api_resources().group_version == "apps/v1"
    answer = kube_api.raw("GET", "/healthz")
    assert (answer.status_code, answer.text) == (200, "ok")
    answer = kube_api.raw("GET", "/apis/batch")
    assert answer.json()["preferredVersion"]["groupVersion"] == "batch/v1"


def test_the_fake_serves_its_custom_resources_in_discovery(api_client: Client) -> None:
    """The CRD-backed kinds the bridge uses are registered in the fake (no CRDs on the real bed)."""
    groups: Client = kubernetes.client.ApisApi(api_client).get_api_versions().groups
    assert {"jobset.x-k8s.io", "leaderworkerset.x-k8s.io", "scheduling.x-k8s.io"} <= {g.name for g in groups}


def test_require_namespaces_option() -> None:
    """Fake only: an option of the fake (the real server always requires the namespace)."""
    with FakeKubeServer(require_namespaces=True) as server, server.api_client() as client:
        core: Client = kubernetes.client.CoreV1Api(client)
        with pytest.raises(ApiException) as exc:
            core.create_namespaced_pod("team-b", pod_body("p"))
        assert error_body(exc.value)["message"] == 'namespaces "team-b" not found'
        core.create_namespace({"metadata": {"name": "team-b"}})
        assert core.create_namespaced_pod("team-b", pod_body("p")).metadata.namespace == "team-b"


def test_malformed_query_parameters_are_400(kube_api: KubeApi) -> None:
    bad_int = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'strconv.ParseInt: parsing "soon": invalid syntax',
        "reason": "BadRequest",
        "code": 400,
    }
    for watching in ("true", "false"):
        answer = kube_api.raw("GET", "/api/v1/pods", watch=watching, timeoutSeconds="soon")
        assert (answer.status_code, answer.json()) == (400, bad_int)
    kube_api.core.create_namespaced_pod(kube_api.namespace, pod_body("x"))
    answer = kube_api.raw(
        "DELETE", f"/api/v1/namespaces/{kube_api.namespace}/pods/x", gracePeriodSeconds="soon"
    )
    assert (answer.status_code, answer.json()) == (400, bad_int)
    answer = kube_api.raw("GET", "/api/v1/pods", labelSelector="a in (b")
    assert (answer.status_code, answer.json()["message"]) == (
        400,
        "unable to parse requirement: found '', expected: ',' or ')'",
    )


def test_only_kinds_whose_strategy_sets_one_have_a_generation(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    policy: Client = kubernetes.client.PolicyV1Api(kube_api.api_client)
    config = core.create_namespaced_config_map(ns, {"metadata": {"name": "c"}, "data": {"a": "1"}})
    assert config.metadata.generation is None
    assert core.patch_namespaced_config_map("c", ns, {"data": {"a": "2"}}).metadata.generation is None
    assert core.create_namespaced_secret(ns, {"metadata": {"name": "s"}}).metadata.generation is None
    assert core.create_node({"metadata": {"name": kube_api.node_name("n")}}).metadata.generation is None
    pdb = {"metadata": {"name": "b"}, "spec": {"minAvailable": 1}}
    assert policy.create_namespaced_pod_disruption_budget(ns, pdb).metadata.generation == 1
