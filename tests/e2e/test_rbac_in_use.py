"""The chart's RBAC allows every request the bridge makes (tests/deploy/test_rbac.py checks the
list is exact; this checks the list against what the code really does, on the real wire).

A placement runs through its common paths — claimed, submitted, pending with a reason,
bound, its job cancelled by Slurm, its pod evicted — with leader election on, and every
request the bridge sent to the API server is mapped to the (API group, resource, verb) an
authorizer would check. Each must be granted by the chart's ClusterRole or its Lease Role.
"""

import re

import pytest

from testbed.kube_fake.faults import RecordedRequest
from tests.deploy.chart import manifests, one
from tests.deploy.test_rbac import Grant, granted
from tests.e2e.conftest import StackFactory
from tests.e2e.harness import bound, finished_cleanly, job_id_of

pytestmark = pytest.mark.slurm

# /api/v1/... or /apis/<group>/<version>/..., then [namespaces/<ns>/]<resource>[/<name>[/<subresource>]]
PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)"
    r"(?:/namespaces/(?P<namespace>[^/]+))?"
    r"/(?P<resource>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$"
)
VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


def authorized_as(request: RecordedRequest) -> Grant:
    """What the API server's authorizer checks for this request (its RequestInfo)."""
    match = PATH.match(request.path)
    assert match, f"not a resource path: {request.method} {request.path}"
    group, resource, name, sub = match["group"] or "", match["resource"], match["name"], match["sub"]
    if sub is not None:
        resource = f"{resource}/{sub}"
    if request.method == "GET":
        verb = "watch" if request.query.get("watch") == "true" else "get" if name else "list"
    elif request.method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = VERBS[request.method]
    return group, resource, verb


def test_paths_map_to_what_an_authorizer_checks() -> None:
    def request(method: str, path: str, **query: str) -> RecordedRequest:
        return RecordedRequest(method, path, query, "application/json", None)

    assert authorized_as(request("POST", "/api/v1/namespaces/a/pods/p/eviction")) == (
        "",
        "pods/eviction",
        "create",
    )
    assert authorized_as(request("GET", "/api/v1/pods", watch="true")) == ("", "pods", "watch")
    assert authorized_as(request("GET", "/api/v1/nodes")) == ("", "nodes", "list")
    assert authorized_as(request("PUT", "/apis/coordination.k8s.io/v1/namespaces/a/leases/bridge")) == (
        "coordination.k8s.io",
        "leases",
        "update",
    )
    # Cluster-scoped, in a group: the webhook's DeviceClass cache.
    classes = "/apis/resource.k8s.io/v1/deviceclasses"
    assert authorized_as(request("GET", f"{classes}/gpu.nvidia.com")) == (
        "resource.k8s.io",
        "deviceclasses",
        "get",
    )
    assert authorized_as(request("GET", classes, watch="true")) == (
        "resource.k8s.io",
        "deviceclasses",
        "watch",
    )


async def test_every_request_of_a_placement_is_granted_by_the_chart(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=1, leader_election=True)
    stack.create_pod("first")
    first = await stack.wait_pod("first", bound)
    # A second pod waits behind the first (one node, exclusive): Slurm's pending reason is told.
    stack.create_pod("second")
    await stack.wait_pod(
        "second",
        lambda p: any(
            c.get("reason") == "Resources" for c in ((p or {}).get("status") or {}).get("conditions") or []
        ),
        timeout=60,
    )
    # Slurm cancels the first job under its running pod: the pod is evicted, the second bound.
    job_id = job_id_of(first)
    assert job_id is not None
    await stack.slurm.cancel_job(job_id)
    await stack.wait_pod("first", lambda p: p is None or p["metadata"].get("deletionTimestamp"), timeout=60)
    stack.kube.set_pod_phase(stack.namespace, "first", "Failed")  # its kubelet confirms the stop
    await stack.wait_pod("second", bound, timeout=60)
    stack.kube.set_pod_phase(stack.namespace, "second", "Succeeded")
    await stack.wait_pod("second", finished_cleanly, timeout=60)
    await stack.wait_pod("first", finished_cleanly, timeout=60)

    documents = manifests()
    allowed = granted(one(documents, "ClusterRole", "slurm-bridge")) | granted(one(documents, "Role"))
    used = {authorized_as(r) for r in stack.fake.requests}
    assert ("", "pods/eviction", "create") in used  # the run took the path that evicts
    assert ("coordination.k8s.io", "leases", "update") in used or (
        "coordination.k8s.io",
        "leases",
        "create",
    ) in used  # and leader election ran
    assert used - allowed == set()
