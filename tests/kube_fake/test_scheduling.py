"""Behaviour 14: built-in gang scheduling objects, scheduling.k8s.io/v1alpha2 (Kubernetes 1.36).

The installed client (37.x) only has typed models for v1alpha3/v1beta1, so
these go through CustomObjectsApi, as any client of v1alpha2 must.
"""

from __future__ import annotations

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.kube_fake.builders import Client, pod_body

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
