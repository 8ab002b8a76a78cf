"""Behaviour 14: built-in gang scheduling objects, scheduling.k8s.io.

By default as Kubernetes 1.36 serves them (v1alpha2): the installed client
(37.x) only has typed models for v1alpha3/v1beta1, so these go through
CustomObjectsApi, as any client of v1alpha2 must. After
``serve_scheduling_versions``, as Kubernetes 1.37 serves them (v1beta1 and/or
v1alpha3, one schema), read and written with the client's typed models.

Fake only: the real test bed's Kubernetes 1.28 serves none of these versions.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from testbed.kube_fake import FakeKubeServer
from testbed.kube_fake.builders import Client, pod_body, watch

GROUP, VERSION = "scheduling.k8s.io", "v1alpha2"


@pytest.fixture
def custom(api_client: Client) -> Client:
    return kubernetes.client.CustomObjectsApi(api_client)


def _workload() -> dict[str, object]:
    template = {"name": "workers", "schedulingPolicy": {"gang": {"minCount": 4}}}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workload",
        "metadata": {"name": "train", "annotations": {"slurmjob.slinky.slurm.net/partition": "gpu"}},
        "spec": {"podGroupTemplates": [template]},
    }


def _pod_group() -> dict[str, object]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PodGroup",
        "metadata": {"name": "train-0"},
        "spec": {
            "podGroupTemplateRef": {"workload": {"workloadName": "train", "podGroupTemplateName": "workers"}},
            "schedulingPolicy": {"gang": {"minCount": 4}},
        },
        "status": {"conditions": [{"type": "Ignored"}]},
    }


def test_workloads_and_pod_groups_are_served(custom: Client, api_client: Client) -> None:
    workload = custom.create_namespaced_custom_object(GROUP, VERSION, "default", "workloads", _workload())
    assert (workload["apiVersion"], workload["kind"]) == ("scheduling.k8s.io/v1alpha2", "Workload")
    group = custom.create_namespaced_custom_object(GROUP, VERSION, "default", "podgroups", _pod_group())
    assert "status" not in group  # a client cannot set status on create
    got = custom.get_namespaced_custom_object(GROUP, VERSION, "default", "podgroups", "train-0")
    assert got["spec"]["podGroupTemplateRef"]["workload"]["workloadName"] == "train"
    listed = custom.list_namespaced_custom_object(GROUP, VERSION, "default", "workloads")
    assert [w["metadata"]["name"] for w in listed["items"]] == ["train"]
    # Distinct from the coscheduling plugin's CRD of the same plural.
    assert (
        custom.list_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", "default", "podgroups")[
            "items"
        ]
        == []
    )
    # A pod joins the group through spec.schedulingGroup, which the typed client knows.
    core: Client = kubernetes.client.CoreV1Api(api_client)
    core.create_namespaced_pod("default", pod_body("w0", schedulingGroup={"podGroupName": "train-0"}))
    assert core.read_namespaced_pod("w0", "default").spec.scheduling_group.pod_group_name == "train-0"


def test_pod_group_status_is_a_subresource(custom: Client) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "podgroups", _pod_group())
    condition = {
        "type": "PodGroupScheduled",
        "status": "True",
        "reason": "Scheduled",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    after = custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", "podgroups", "train-0", {"status": {"conditions": [condition]}}
    )
    assert after["status"]["conditions"] == [condition]
    # The main resource ignores status, and the status path ignores spec.
    ignored = custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", "podgroups", "train-0", {"status": {"conditions": []}}
    )
    assert ignored["status"]["conditions"] == [condition]
    assert ignored["metadata"]["generation"] == 1
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", "podgroups", "train-0", {"spec": {"schedulingPolicy": {"basic": {}}}}
    )
    got = custom.get_namespaced_custom_object(GROUP, VERSION, "default", "podgroups", "train-0")
    assert got["spec"]["schedulingPolicy"] == {"gang": {"minCount": 4}}


def test_workload_has_no_status_subresource(custom: Client) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "workloads", _workload())
    with pytest.raises(ApiException) as exc:
        custom.get_namespaced_custom_object_status(GROUP, VERSION, "default", "workloads", "train")
    assert exc.value.status == 404
    resources = custom.get_api_resources(GROUP, VERSION).resources
    assert sorted(r.name for r in resources) == ["podgroups", "podgroups/status", "workloads"]
    assert all(r.namespaced for r in resources)


# -- Kubernetes 1.37: v1beta1 and v1alpha3 ------------------------------------------------


@pytest.fixture
def k137(kube_fake: FakeKubeServer) -> FakeKubeServer:
    kube_fake.serve_scheduling_versions("v1beta1", "v1alpha3")
    return kube_fake


def _discovery(kube: FakeKubeServer, path: str) -> Any:
    with urllib.request.urlopen(kube.url + path) as response:
        return json.loads(response.read())


def _pod_group_137(version: str = "v1beta1") -> dict[str, object]:
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "PodGroup",
        "metadata": {"name": "train-0"},
        "spec": {
            "workloadRef": {"workloadName": "train", "templateName": "workers"},
            "schedulingPolicy": {"gang": {"minCount": 4}},
        },
    }


def test_1_37_serves_v1beta1_and_v1alpha3_and_no_longer_v1alpha2(k137: FakeKubeServer) -> None:
    group = _discovery(k137, "/apis/scheduling.k8s.io")
    assert [v["version"] for v in group["versions"]] == ["v1", "v1beta1", "v1alpha3"]
    # As on a real cluster, the preferred version is PriorityClass's, which has no PodGroups.
    assert group["preferredVersion"]["version"] == "v1"
    assert [r["name"] for r in _discovery(k137, "/apis/scheduling.k8s.io/v1")["resources"]] == [
        "priorityclasses"
    ]
    for version in ("v1beta1", "v1alpha3"):
        names = sorted(r["name"] for r in _discovery(k137, f"/apis/scheduling.k8s.io/{version}")["resources"])
        assert names == ["podgroups", "podgroups/status", "workloads"]
    with pytest.raises(urllib.error.HTTPError) as gone:
        _discovery(k137, "/apis/scheduling.k8s.io/v1alpha2")
    assert gone.value.code == 404


def test_1_37_objects_are_typed_and_one_object_is_served_at_both_versions(
    k137: FakeKubeServer, api_client: Client
) -> None:
    beta: Client = kubernetes.client.SchedulingV1beta1Api(api_client)
    alpha: Client = kubernetes.client.SchedulingV1alpha3Api(api_client)
    made = beta.create_namespaced_pod_group("default", _pod_group_137())
    assert (made.api_version, made.spec.workload_ref.workload_name) == ("scheduling.k8s.io/v1beta1", "train")
    got = alpha.read_namespaced_pod_group("train-0", "default")
    assert got.api_version == "scheduling.k8s.io/v1alpha3"
    assert (got.spec.workload_ref.template_name, got.spec.scheduling_policy.gang.min_count) == ("workers", 4)
    listed = alpha.list_namespaced_pod_group("default")
    assert (listed.api_version, [g.metadata.name for g in listed.items]) == (
        "scheduling.k8s.io/v1alpha3",
        ["train-0"],
    )
    # Stored once: the same object written back through the other version changes nothing.
    custom: Client = kubernetes.client.CustomObjectsApi(api_client)
    as_alpha = custom.get_namespaced_custom_object(GROUP, "v1alpha3", "default", "podgroups", "train-0")
    same = custom.replace_namespaced_custom_object(
        GROUP, "v1alpha3", "default", "podgroups", "train-0", as_alpha
    )
    assert same["metadata"]["resourceVersion"] == made.metadata.resource_version
    workload = {
        "apiVersion": f"{GROUP}/v1alpha3",
        "kind": "Workload",
        "metadata": {"name": "train"},
        "spec": {"podGroupTemplates": [{"name": "workers", "schedulingPolicy": {"gang": {"minCount": 4}}}]},
    }
    alpha.create_namespaced_workload("default", workload)
    assert beta.read_namespaced_workload("train", "default").spec.pod_group_templates[0].name == "workers"


def test_1_37_pod_group_condition_through_the_status_subresource(
    k137: FakeKubeServer, api_client: Client
) -> None:
    beta: Client = kubernetes.client.SchedulingV1beta1Api(api_client)
    beta.create_namespaced_pod_group("default", _pod_group_137())
    condition = {
        "type": "PodGroupInitiallyScheduled",
        "status": "True",
        "reason": "Scheduled",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    alpha: Client = kubernetes.client.SchedulingV1alpha3Api(api_client)
    alpha.patch_namespaced_pod_group_status("train-0", "default", {"status": {"conditions": [condition]}})
    [written] = beta.read_namespaced_pod_group_status("train-0", "default").status.conditions
    assert (written.type, written.status, written.reason) == (
        "PodGroupInitiallyScheduled",
        "True",
        "Scheduled",
    )


def test_a_watch_at_one_1_37_version_sees_objects_written_at_the_other(
    k137: FakeKubeServer, api_client: Client
) -> None:
    custom: Client = kubernetes.client.CustomObjectsApi(api_client)
    custom.create_namespaced_custom_object(GROUP, "v1beta1", "default", "podgroups", _pod_group_137())
    listed = custom.list_namespaced_custom_object(GROUP, "v1alpha3", "default", "podgroups")
    stream = watch.Watch().stream(
        custom.list_namespaced_custom_object,
        GROUP,
        "v1alpha3",
        "default",
        "podgroups",
        resource_version=listed["metadata"]["resourceVersion"],
        timeout_seconds=5,
    )
    custom.create_namespaced_custom_object(
        GROUP, "v1beta1", "default", "podgroups", _pod_group_137() | {"metadata": {"name": "train-1"}}
    )
    event = next(stream)
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "train-1")
    assert event["object"]["apiVersion"] == "scheduling.k8s.io/v1alpha3"


def test_only_one_release_s_versions_and_only_before_objects_exist(kube_fake: FakeKubeServer) -> None:
    with pytest.raises(ValueError, match="no Kubernetes release serves"):
        kube_fake.serve_scheduling_versions("v1beta1", "v1alpha2")
    kube_fake.serve_scheduling_versions("v1alpha3")  # alpha only: 1.37 without the beta API enabled
    assert (
        _discovery(kube_fake, "/apis/scheduling.k8s.io/v1alpha3")["groupVersion"]
        == "scheduling.k8s.io/v1alpha3"
    )
    kube_fake.create_object("podgroups.scheduling.k8s.io", _pod_group_137("v1alpha3"), "default")
    with pytest.raises(RuntimeError, match="switch versions first"):
        kube_fake.serve_scheduling_versions("v1alpha2")
