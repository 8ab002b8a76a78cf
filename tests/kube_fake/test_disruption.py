"""Behaviour 13: PodDisruptionBudgets, their controller-computed status, and evictions that honour them.

Most tests here are about the fake's disruption controller (none runs in the real test bed)
and stay fake-only. The ones taking ``kube_api`` run against the fake and the real
kube-apiserver alike, with no controller on either; how an eviction reads a budget's
status written by hand is in test_subresources.py.
"""

from __future__ import annotations

import json
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from testbed.kube_fake import FakeKubeServer
from testbed.kube_fake.backend import KubeApi
from testbed.kube_fake.builders import Client, error_body, pod_body

VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."
KEEP = "example.com/keep"


@pytest.fixture
def policy(api_client: Client) -> Client:
    return kubernetes.client.PolicyV1Api(api_client)


def _pod(
    core: Client,
    name: str,
    *,
    phase: str = "Running",
    ready: bool = True,
    labels: dict[str, str] | None = None,
    owner: Any = None,
    ns: str = "default",
) -> None:
    body = pod_body(name, labels=labels or {"app": "web"}, nodeName="n1")
    body["metadata"]["finalizers"] = [KEEP]
    if owner is not None:
        body["metadata"]["ownerReferences"] = [
            {
                "apiVersion": owner.api_version,
                "kind": owner.kind,
                "name": owner.metadata.name,
                "uid": owner.metadata.uid,
                "controller": True,
            }
        ]
    core.create_namespaced_pod(ns, body)
    if phase != "Pending":
        status = {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
        core.patch_namespaced_pod_status(name, ns, {"status": status})


def _pdb(policy: Client, name: str, selector: Any = None, *, ns: str = "default", **spec: Any) -> Any:
    body = {
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": "web"}} if selector is None else selector, **spec},
    }
    return policy.create_namespaced_pod_disruption_budget(ns, body)


def _evict(core: Client, name: str, *, ns: str = "default", **delete_options: Any) -> Any:
    body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
    if delete_options:
        body["deleteOptions"] = delete_options
    return core.create_namespaced_pod_eviction(name, ns, body, _preload_content=False)


def _refused(
    core: Client, name: str, *, ns: str = "default", **delete_options: Any
) -> tuple[int, dict[str, Any], Any]:
    with pytest.raises(ApiException) as exc:
        _evict(core, name, ns=ns, **delete_options)
    return exc.value.status, error_body(exc.value), exc.value.headers


def _status(kube: FakeKubeServer, name: str) -> Any:
    kube.settle()
    pdb = kube.get_object("poddisruptionbudgets.policy", name, "default")
    assert pdb is not None
    return pdb["status"]


def _terminating(core: Client, name: str, ns: str = "default") -> bool:
    return core.read_namespaced_pod(name, ns).metadata.deletion_timestamp is not None


def test_pdb_status_follows_ready_pods(kube_fake: FakeKubeServer, core: Client, policy: Client) -> None:
    created = _pdb(policy, "web", minAvailable=2)
    assert created.status.disruptions_allowed == 0  # the zero status PrepareForCreate writes
    assert created.status.observed_generation is None
    for name in ("a", "b", "c"):
        _pod(core, name)
    _pod(core, "unready", ready=False)
    _pod(core, "other", labels={"app": "db"})
    kube_fake.settle()
    pdb = policy.read_namespaced_pod_disruption_budget_status("web", "default")
    status = pdb.status
    assert (status.expected_pods, status.current_healthy, status.desired_healthy) == (4, 3, 2)
    assert (status.disruptions_allowed, status.observed_generation) == (1, 1)
    (cond,) = status.conditions
    assert (cond.type, cond.status, cond.reason, cond.message) == (
        "DisruptionAllowed",
        "True",
        "SufficientPods",
        "",
    )
    # A spec change bumps the generation; the controller catches up.
    policy.patch_namespaced_pod_disruption_budget("web", "default", {"spec": {"minAvailable": 3}})
    assert _status(kube_fake, "web")["observedGeneration"] == 2
    assert _status(kube_fake, "web")["disruptionsAllowed"] == 0
    cond = _status(kube_fake, "web")["conditions"][0]
    assert (cond["status"], cond["reason"]) == ("False", "InsufficientPods")


def test_eviction_is_refused_when_the_budget_is_used_up(
    kube_fake: FakeKubeServer, core: Client, policy: Client
) -> None:
    for name in ("a", "b", "c"):
        _pod(core, name)
    _pdb(policy, "web", minAvailable=2)
    resp = _evict(core, "a")
    assert resp.status == 201
    assert json.loads(resp.data)["status"] == "Success"
    evicted = core.read_namespaced_pod("a", "default")
    assert evicted.metadata.deletion_timestamp is not None
    cond = next(c for c in evicted.status.conditions if c.type == "DisruptionTarget")
    assert (cond.status, cond.reason, cond.message) == (
        "True",
        "EvictionByEvictionAPI",
        "Eviction API: evicting",
    )
    code, body, headers = _refused(core, "b")
    assert (code, body["reason"], body["message"]) == (429, "TooManyRequests", VIOLATION)
    assert body["details"] == {
        "causes": [
            {
                "reason": "DisruptionBudget",
                "message": "The disruption budget web needs 2 healthy pods and has 2 currently",
            }
        ]
    }
    assert "Retry-After" not in headers
    assert not _terminating(core, "b")
    assert _status(kube_fake, "web")["currentHealthy"] == 2
    assert _status(kube_fake, "web")["disruptionsAllowed"] == 0


def test_percentages_scale_the_controllers_replicas(
    kube_fake: FakeKubeServer, api_client: Client, policy: Client
) -> None:
    core: Client = kubernetes.client.CoreV1Api(api_client)
    apps: Client = kubernetes.client.AppsV1Api(api_client)
    template = {"metadata": {"labels": {"app": "web"}}, "spec": pod_body("x")["spec"]}
    rs = apps.create_namespaced_replica_set(
        "default",
        {
            "metadata": {"name": "rs"},
            "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "web"}}, "template": template},
        },
    )
    for name in ("a", "b", "c", "d"):
        _pod(core, name, owner=rs)
    _pdb(policy, "web", maxUnavailable="30%")  # 1.2 of 4 replicas, rounded up
    status = _status(kube_fake, "web")
    assert (status["expectedPods"], status["desiredHealthy"], status["disruptionsAllowed"]) == (4, 2, 2)
    assert _evict(core, "a").status == 201
    assert _evict(core, "b").status == 201
    assert _refused(core, "c")[0] == 429
    # minAvailable as a percentage also counts replicas (rounded up); a pod with no
    # controller adds nothing, so a budget on it alone allows no disruption at all.
    policy.patch_namespaced_pod_disruption_budget(
        "web", "default", {"spec": {"maxUnavailable": None, "minAvailable": "40%"}}
    )
    status = _status(kube_fake, "web")
    assert (status["expectedPods"], status["desiredHealthy"], status["currentHealthy"]) == (4, 2, 2)
    assert status["disruptionsAllowed"] == 0
    _pod(core, "bare", labels={"app": "solo"})
    _pdb(policy, "solo", selector={"matchLabels": {"app": "solo"}}, maxUnavailable=1)
    assert _status(kube_fake, "solo")["expectedPods"] == 0
    assert _refused(core, "bare")[0] == 429


def test_a_pod_owned_by_an_unscalable_controller_fails_the_sync(
    kube_fake: FakeKubeServer, api_client: Client, policy: Client
) -> None:
    core: Client = kubernetes.client.CoreV1Api(api_client)
    batch: Client = kubernetes.client.BatchV1Api(api_client)
    job = batch.create_namespaced_job(
        "default", {"metadata": {"name": "j"}, "spec": {"template": {"spec": pod_body("x")["spec"]}}}
    )
    _pod(core, "worker", owner=job)
    _pdb(policy, "web", maxUnavailable=1)
    cond = _status(kube_fake, "web")["conditions"][0]
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "False",
        "SyncFailed",
        'found no controllers for pod "worker"',
    )
    code, body, headers = _refused(core, "worker")
    # The failed sync never records an observed generation: "still being processed".
    assert (code, body["details"]["retryAfterSeconds"], headers["Retry-After"]) == (429, 10, "10")
    assert (
        body["details"]["causes"][0]["message"]
        == "The disruption budget web is still being processed by the server."
    )


def test_pending_terminal_and_unready_pods_are_not_held_back(
    kube_fake: FakeKubeServer, core: Client, policy: Client
) -> None:
    _pod(core, "pending", phase="Pending")
    _pod(core, "done", phase="Succeeded", ready=False)
    _pod(core, "unready", ready=False)
    _pod(core, "ready")
    _pdb(policy, "web", minAvailable=1)
    assert _status(kube_fake, "web")["disruptionsAllowed"] == 0
    for name in ("pending", "done"):
        assert _evict(core, name).status == 201
        assert _terminating(core, name)
    # An unready pod may go while the healthy ones still meet the budget...
    assert _evict(core, "unready").status == 201
    assert _status(kube_fake, "web")["disruptionsAllowed"] == 0  # ...without using a disruption
    assert _refused(core, "ready")[0] == 429
    # ...and with AlwaysAllow even when they do not.
    _pod(core, "sick", ready=False, labels={"app": "db"})
    _pdb(
        policy,
        "db",
        selector={"matchLabels": {"app": "db"}},
        minAvailable=1,
        unhealthyPodEvictionPolicy="AlwaysAllow",
    )
    assert _evict(core, "sick").status == 201


def test_eviction_overwrites_disruption_target_and_honours_delete_options(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    _pod(core, "p", ns=ns)
    stale = {
        "type": "DisruptionTarget",
        "status": "False",
        "reason": "PreemptionByScheduler",
        "message": "old",
    }
    core.patch_namespaced_pod_status("p", ns, {"status": {"conditions": [stale]}})
    code, body, _ = _refused(core, "p", ns=ns, preconditions={"uid": "not-the-uid"})
    uid = core.read_namespaced_pod("p", ns).metadata.uid
    assert (code, body["reason"]) == (409, "Conflict")
    assert body["message"] == (
        f'Operation cannot be fulfilled on Pod "p": the UID in the precondition (not-the-uid) does not match '
        f"the UID in record ({uid}). The object might have been deleted and then recreated"
    )
    pod = core.read_namespaced_pod("p", ns)
    assert pod.metadata.deletion_timestamp is None
    assert (
        next(c for c in pod.status.conditions if c.type == "DisruptionTarget").reason
        == "PreemptionByScheduler"
    )
    assert _evict(core, "p", ns=ns, gracePeriodSeconds=7, preconditions={"uid": uid}).status == 201
    pod = core.read_namespaced_pod("p", ns)
    assert pod.metadata.deletion_grace_period_seconds == 7
    (cond,) = [c for c in pod.status.conditions if c.type == "DisruptionTarget"]
    assert (cond.status, cond.reason, cond.message) == (
        "True",
        "EvictionByEvictionAPI",
        "Eviction API: evicting",
    )


def test_two_budgets_for_one_pod_are_a_server_error(kube_api: KubeApi) -> None:
    core, ns = kube_api.core, kube_api.namespace
    policy = kubernetes.client.PolicyV1Api(kube_api.api_client)
    _pod(core, "p", ns=ns)
    _pdb(policy, "one", ns=ns, minAvailable=0)
    _pdb(policy, "two", ns=ns, minAvailable=0)
    code, body, _ = _refused(core, "p", ns=ns)
    assert code == 500
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "This pod has more than one PodDisruptionBudget, "
        "which the eviction subresource does not support.",
        "code": 500,
    }
    assert not _terminating(core, "p", ns)
