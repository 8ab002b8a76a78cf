"""/mutate over HTTPS: which pods become the bridge's, and exactly what changes."""

import pytest

from tests.webhook.conftest import Admission
from tests.webhook.reviews import (
    DEPLOYMENT,
    MANAGED_NS,
    OTHER_NS,
    SCHEDULER,
    Json,
    apply_patch,
    patch_of,
    pod,
    review,
)

OURS = {
    "key": "slinky.slurm.net/managed-node",
    "operator": "Equal",
    "value": SCHEDULER,
    "effect": "NoExecute",
}
NOT_READY = {
    "key": "node.kubernetes.io/not-ready",
    "operator": "Exists",
    "effect": "NoExecute",
    "tolerationSeconds": 300,
}


def mutated(admission: Admission, obj: Json, **kwargs: object) -> tuple[Json, Json]:
    response = admission.mutate(review(obj, **kwargs))  # type: ignore[arg-type]
    assert response["allowed"]
    return apply_patch(obj, response), response


@pytest.mark.parametrize("scheduler", ["default-scheduler", "", None])
def test_a_pod_in_a_managed_namespace_goes_to_slurm(admission: Admission, scheduler: str | None) -> None:
    result, response = mutated(admission, pod(scheduler=scheduler, nodeName="node-7"))
    spec = result["spec"]
    assert spec["schedulerName"] == SCHEDULER
    assert "nodeName" not in spec
    assert spec["tolerations"] == [NOT_READY, OURS]
    assert 'spec.nodeName "node-7" was removed' in response["warnings"][0]


def test_a_pod_naming_our_scheduler_is_ours_in_any_namespace(admission: Admission) -> None:
    result, _ = mutated(admission, pod(namespace=OTHER_NS, scheduler=SCHEDULER, nodeName="n1"))
    assert result["spec"]["schedulerName"] == SCHEDULER
    assert "nodeName" not in result["spec"]
    assert OURS in result["spec"]["tolerations"]


@pytest.mark.parametrize(
    "obj",
    [
        pod(namespace=OTHER_NS),  # unmanaged namespace, default scheduler
        pod(namespace=OTHER_NS, scheduler=None, nodeName="n1"),
        pod(scheduler="volcano"),  # another scheduler, even in a managed namespace
        pod(annotations={"kubernetes.io/config.mirror": "abc"}, nodeName="n1"),  # a static pod's mirror
        {
            **pod(),
            "metadata": {
                "name": "ds-x",
                "namespace": MANAGED_NS,
                "ownerReferences": [{"kind": "DaemonSet", "name": "ds", "uid": "1", "controller": True}],
            },
        },
    ],
    ids=["unmanaged", "unmanaged-no-scheduler", "other-scheduler", "mirror-pod", "daemonset-pod"],
)
def test_other_pods_are_untouched(admission: Admission, obj: Json) -> None:
    response = admission.mutate(review(obj))
    assert response["allowed"]
    assert "patch" not in response
    assert "warnings" not in response


def test_the_toleration_is_added_once(admission: Admission) -> None:
    once, _ = mutated(admission, pod())
    twice, response = mutated(admission, once)  # reinvocation, or a pod re-submitted as it came out
    assert twice["spec"]["tolerations"].count(OURS) == 1
    assert patch_of(response) == []


@pytest.mark.parametrize(
    "existing",
    [
        {"key": "slinky.slurm.net/managed-node", "operator": "Exists"},
        {"operator": "Exists"},
        {"key": "slinky.slurm.net/managed-node", "operator": "Equal", "value": SCHEDULER},
    ],
)
def test_an_existing_permanent_toleration_is_enough(admission: Admission, existing: Json) -> None:
    result, _ = mutated(admission, pod(tolerations=[existing]))
    assert result["spec"]["tolerations"] == [existing]


@pytest.mark.parametrize(
    "existing",
    [
        {"key": "slinky.slurm.net/managed-node", "operator": "Exists", "tolerationSeconds": 60},
        {"key": "slinky.slurm.net/managed-node", "operator": "Equal", "value": "another-bridge"},
        {"key": "slinky.slurm.net/managed-node", "operator": "Exists", "effect": "NoSchedule"},
    ],
)
def test_a_toleration_that_would_still_evict_gets_ours_added(admission: Admission, existing: Json) -> None:
    result, _ = mutated(admission, pod(tolerations=[existing]))
    assert result["spec"]["tolerations"] == [existing, OURS]


def test_a_pod_without_tolerations_gets_the_list(admission: Admission) -> None:
    obj = pod()
    del obj["spec"]["tolerations"]
    result, response = mutated(admission, obj)
    assert result["spec"]["tolerations"] == [OURS]
    assert patch_of(response) == [
        {"op": "add", "path": "/spec/schedulerName", "value": SCHEDULER},
        {"op": "add", "path": "/spec/tolerations", "value": [OURS]},
    ]


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_only_create_is_mutated(admission: Admission, operation: str) -> None:
    obj = pod(nodeName="n1")
    response = admission.mutate(review(obj, old=obj, operation=operation))
    assert response["allowed"]
    assert "patch" not in response


def test_a_subresource_is_not_mutated(admission: Admission) -> None:
    response = admission.mutate(review(pod(), operation="UPDATE", old=pod(), sub_resource="resize"))
    assert response["allowed"]
    assert "patch" not in response


def test_a_create_without_object_is_a_400_denial(admission: Admission) -> None:
    response = admission.mutate(review(None, namespace=MANAGED_NS))
    assert not response["allowed"]
    assert response["status"]["code"] == 400
    assert "request.object" in response["status"]["message"]


def test_a_deployment_sent_to_mutate_is_denied(admission: Admission) -> None:
    response = admission.mutate(review({"metadata": {"name": "d"}}, gvkr=DEPLOYMENT))
    assert not response["allowed"]
    assert "pods only" in response["status"]["message"]
