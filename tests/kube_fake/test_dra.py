"""Behaviour 15: dynamic resource allocation, resource.k8s.io/v1, through the typed ResourceV1Api.

Fake only: the real test bed's Kubernetes 1.28 serves no resource.k8s.io/v1 (GA from 1.34).
"""

from __future__ import annotations

from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from testbed.kube_fake.builders import Client, error_body, pod_body

DRIVER = "gpu.example.com"


@pytest.fixture
def resource(api_client: Client) -> Client:
    return kubernetes.client.ResourceV1Api(api_client)


def _slice(name: str, **spec: Any) -> dict[str, Any]:
    body = {"driver": DRIVER, "pool": {"name": name, "generation": 1, "resourceSliceCount": 1}, **spec}
    return {"metadata": {"name": name}, "spec": {k: v for k, v in body.items() if v is not None}}


def _claim(name: str, **exactly: Any) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com", **exactly}}
    return {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}}


def _invalid(call: Any, *args: Any) -> list[tuple[str, str]]:
    with pytest.raises(ApiException) as exc:
        call(*args)
    body = error_body(exc.value)
    assert (exc.value.status, body["reason"]) == (422, "Invalid")
    return [(c["field"], c["message"]) for c in body["details"]["causes"]]


def test_device_classes_are_cluster_scoped(resource: Client) -> None:
    body = {"metadata": {"name": "gpu.example.com"}, "spec": {"selectors": [{"cel": {"expression": "true"}}]}}
    created = resource.create_device_class(body)
    assert created.spec.selectors[0].cel.expression == "true"
    assert [c.metadata.name for c in resource.list_device_class().items] == ["gpu.example.com"]
    assert created.metadata.namespace is None


def test_resource_slices_select_by_node_and_driver(resource: Client) -> None:
    resource.create_resource_slice(_slice("n1-gpus", nodeName="n1", devices=[{"name": "gpu-0"}]))
    resource.create_resource_slice(_slice("n2-gpus", nodeName="n2"))
    resource.create_resource_slice(_slice("shared", allNodes=True, driver="net.example.com"))
    on_n1 = resource.list_resource_slice(field_selector="spec.nodeName=n1").items
    assert [(s.metadata.name, s.spec.devices[0].name) for s in on_n1] == [("n1-gpus", "gpu-0")]
    gpus = resource.list_resource_slice(field_selector=f"spec.driver={DRIVER},spec.nodeName!=n1").items
    assert [s.metadata.name for s in gpus] == ["n2-gpus"]
    with pytest.raises(ApiException) as exc:
        resource.list_resource_slice(field_selector="spec.pool.name=shared")
    assert exc.value.status == 400
    assert _invalid(resource.create_resource_slice, _slice("bad", driver="")) == [
        ("spec.driver", "Required value"),
        (
            "spec",
            "Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
            "`perDeviceNodeSelection` is required",
        ),
    ]
    assert _invalid(resource.create_resource_slice, _slice("both", nodeName="n1", allNodes=True)) == [
        (
            "spec",
            'Invalid value: "{`nodeName`, `allNodes`}": exactly one of '
            "`nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, "
            "but multiple fields are set",
        )
    ]


def test_resource_claims_default_validate_and_have_status(resource: Client) -> None:
    claim = resource.create_namespaced_resource_claim("default", _claim("c"))
    exactly = claim.spec.devices.requests[0].exactly
    assert (exactly.allocation_mode, exactly.count) == ("ExactCount", 1)
    assert _invalid(
        resource.create_namespaced_resource_claim, "default", _claim("bad", deviceClassName="")
    ) == [("spec.devices.requests[0].exactly.deviceClassName", "Required value")]
    status = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": DRIVER, "pool": "n1-gpus", "device": "gpu-0"}]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "0b0c5a4e-1111-4222-8333-444455556666"}],
    }
    after = resource.patch_namespaced_resource_claim_status("c", "default", {"status": status})
    assert after.status.allocation.devices.results[0].device == "gpu-0"
    assert after.status.reserved_for[0].name == "p"
    # The main resource ignores status...
    claim = resource.read_namespaced_resource_claim("c", "default")
    claim.status = None
    assert (
        resource.replace_namespaced_resource_claim("c", "default", claim).status.reserved_for[0].name == "p"
    )
    # ...and status keeps its invariants.
    assert _invalid(
        resource.patch_namespaced_resource_claim_status,
        "c",
        "default",
        # JSON patch: the typed models would refuse the incomplete entry client-side.
        [{"op": "replace", "path": "/status", "value": {"reservedFor": [{"resource": "pods", "name": "q"}]}}],
    ) == [
        ("status.reservedFor[0].uid", "Required value"),
        ("status.reservedFor", "Forbidden: may not be specified when `allocated` is not set"),
    ]


def test_pod_resource_claim_statuses_are_written_through_pods_status(core: Client) -> None:
    claims = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    core.create_namespaced_pod("default", pod_body("p", resourceClaims=claims))
    entry = {"name": "gpu", "resourceClaimName": "p-gpu-x7k2q"}
    pod = core.patch_namespaced_pod_status("p", "default", {"status": {"resourceClaimStatuses": [entry]}})
    assert [(s.name, s.resource_claim_name) for s in pod.status.resource_claim_statuses] == [
        ("gpu", "p-gpu-x7k2q")
    ]
    assert pod.status.phase == "Pending"  # a strategic merge: the rest of status stays
    assert _invalid(
        core.patch_namespaced_pod_status,
        "p",
        "default",
        {"status": {"resourceClaimStatuses": [{"name": "tpu"}]}},
    ) == [
        (
            # A merged item the server did not have comes first (strategic merge's element order).
            "status.resourceClaimStatuses[0].name",
            'Invalid value: "tpu": must match the name of an entry in `spec.resourceClaims`',
        )
    ]


def test_pod_extended_resource_claim_status_maps_requested_resources_to_a_claim(core: Client) -> None:
    gpu = "deviceclass.resource.kubernetes.io/gpu.example.com"
    containers = [
        {"name": "main", "image": "busybox:1.36", "resources": {"requests": {gpu: "1"}, "limits": {gpu: "1"}}}
    ]
    core.create_namespaced_pod("default", pod_body("p", containers=containers))
    mapping = {"containerName": "main", "requestName": "container-0-request-0", "resourceName": gpu}
    status = {"requestMappings": [mapping], "resourceClaimName": "p-extended-resources-x7k2q"}
    pod = core.patch_namespaced_pod_status(
        "p", "default", {"status": {"extendedResourceClaimStatus": status}}
    )
    written = pod.status.extended_resource_claim_status
    assert written.resource_claim_name == "p-extended-resources-x7k2q"
    assert [(m.container_name, m.request_name, m.resource_name) for m in written.request_mappings] == [
        ("main", "container-0-request-0", gpu)
    ]
    assert pod.status.phase == "Pending"  # a strategic merge: the rest of status stays

    field = "status.extendedResourceClaimStatus"
    bad = [
        {**mapping, "containerName": "sidecar"},
        {**mapping, "resourceName": "deviceclass.resource.kubernetes.io/dra.cpu"},
    ]
    invalid = {"requestMappings": bad, "resourceClaimName": ""}
    # JSON patch: the typed models would refuse the empty claim name client-side.
    assert _invalid(
        core.patch_namespaced_pod_status,
        "p",
        "default",
        [{"op": "replace", "path": "/status/extendedResourceClaimStatus", "value": invalid}],
    ) == [
        (
            f"{field}.requestMappings[0].containerName",
            'Invalid value: "sidecar": must match the name of an entry in '
            "spec.initContainers.name or spec.containers.name",
        ),
        (
            f"{field}.requestMappings[1].resourceName",
            'Invalid value: "deviceclass.resource.kubernetes.io/dra.cpu": must match the extended resource '
            "name of an entry in spec.initContainers.resources.requests or "
            "spec.containers.resources.requests",
        ),
        (f"{field}.resourceClaimName", "Required value"),
    ]
    assert _invalid(
        core.patch_namespaced_pod_status,
        "p",
        "default",
        [{"op": "replace", "path": "/status/extendedResourceClaimStatus/requestMappings", "value": []}],
    ) == [(f"{field}.requestMappings", "Required value: at least one request mapping is required")]
