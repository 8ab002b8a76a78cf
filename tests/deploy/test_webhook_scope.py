"""A webhook with a small blast radius: what waits for the chart's admission webhooks, with them down.

The chart is rendered with Helm (tests/deploy/chart.py) and its webhook
configurations are evaluated by tests/deploy/admission.py (rules, selectors,
and the CEL matchConditions with a real CEL engine): an evaluation of the
rendered chart, not a real API server. With the webhook down, a request the API
server would send to a webhook with failurePolicy Fail is rejected; any other
passes.

Then the scope is held against the webhook's own decisions (webhook.mutate /
webhook.validate, the code the server runs): for generated pods, updates and
workloads, whatever the webhook would change or refuse is sent to it.
"""

import copy
import json
from collections.abc import Mapping
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from bridge import keys
from tests.deploy.admission import Chain, Request
from tests.deploy.chart import manifests
from tests.webhook.conftest import policy
from tests.webhook.reviews import (
    BRIDGE_USER,
    JOB,
    JOBID,
    JOBSET,
    LWS,
    MANAGED_NS,
    NODE,
    OTHER_NS,
    PODGROUP,
    SCHEDULER,
    Json,
    apply_patch,
    patch_of,
    pod,
    review,
)
from tests.webhook.strategies import annotation_sets, pods, workloads
from webhook.checks import OWNED_KEYS
from webhook.mutate import mutate
from webhook.policy import is_bridge_pod
from webhook.review import AdmissionRequest, AdmissionReview
from webhook.validate import validate

# The release's worker is BRIDGE_USER (release slurm-bridge in namespace slurm-bridge).
WORKER = BRIDGE_USER
VALUES: dict[str, Any] = {"webhook": {"managedNamespaces": [MANAGED_NS]}}
MUTATE_SCHEDULER_PODS = "mutate-scheduler-pods.slinky.slurm.net"
MUTATE_PODS = "mutate-pods.slinky.slurm.net"
VALIDATE_PODS = "validate-pods.slinky.slurm.net"
VALIDATE_POD_STATUS = "validate-pod-status.slinky.slurm.net"
VALIDATE_WORKLOADS = "validate-workloads.slinky.slurm.net"
EVERY_KEY = {
    "label " + keys.LABEL_SLURM_JOB_ID: ("labels", keys.LABEL_SLURM_JOB_ID),
    "annotation " + keys.ANNOTATION_SLURM_NODE: ("annotations", keys.ANNOTATION_SLURM_NODE),
    "annotation " + keys.ANNOTATION_PLACEMENT: ("annotations", keys.ANNOTATION_PLACEMENT),
    "annotation " + keys.SLURMJOB_PREFIX + "timelimit": ("annotations", keys.SLURMJOB_PREFIX + "timelimit"),
    "finalizer " + keys.FINALIZER: ("finalizers", keys.FINALIZER),
}


@cache
def _chain(values: str) -> Chain:
    return Chain.from_manifests(manifests(json.loads(values)))


def chain(values: Mapping[str, Any] = VALUES) -> Chain:
    return _chain(json.dumps(values, sort_keys=True))


def pod_request(
    operation: str,
    obj: Json | None,
    old: Json | None = None,
    *,
    user: str = "alice",
    namespace: str | None = None,
    sub_resource: str = "",
    namespace_labels: Mapping[str, str] | None = None,
) -> Request:
    some = obj or old or {}
    ns = namespace or some.get("metadata", {}).get("namespace", MANAGED_NS)
    return Request(
        operation,  # type: ignore[arg-type]
        ns,
        obj,
        old,
        sub_resource=sub_resource,
        username=user,
        namespace_labels=namespace_labels or {},
    )


def with_key(obj: Json, key: tuple[str, str], value: str = "42") -> Json:
    changed = copy.deepcopy(obj)
    field, name = key
    meta = changed["metadata"]
    if field == "finalizers":
        meta["finalizers"] = [*meta.get("finalizers", []), name]
    else:
        meta.setdefault(field, {})[name] = value
    return changed


def placed_pod(namespace: str = MANAGED_NS) -> Json:
    """A pod the bridge placed: our scheduler, every bridge key."""
    placed = pod(
        namespace=namespace, scheduler=SCHEDULER, annotations={keys.SLURMJOB_PREFIX + "timelimit": "30"}
    )
    for key in EVERY_KEY.values():
        placed = with_key(placed, key)
    return placed


# --- the webhook is down -------------------------------------------------------------------------


@pytest.mark.parametrize("scheduler", [None, "default-scheduler", "volcano"])
@pytest.mark.parametrize("user", ["alice", "system:serviceaccount:kube-system:replicaset-controller", WORKER])
def test_pods_of_unmanaged_namespaces_are_created_updated_and_deleted(
    scheduler: str | None, user: str
) -> None:
    created = pod(namespace=OTHER_NS, scheduler=scheduler)
    updated = copy.deepcopy(created)
    updated["metadata"]["labels"] = {"app": "web"}
    updated["metadata"]["finalizers"] = ["example.com/cleanup"]
    for request in (
        pod_request("CREATE", created, user=user),
        pod_request("UPDATE", updated, created, user=user),
        pod_request("UPDATE", created, updated, user=user),  # its own finalizer removed
        pod_request("DELETE", None, updated, user=user),
    ):
        assert chain().called(request) == set(), request.operation
        assert chain().with_webhook_down(request).allowed


def test_the_worker_removes_its_finalizer_with_the_webhook_down() -> None:
    placed = placed_pod()
    released = copy.deepcopy(placed)
    released["metadata"]["finalizers"] = []
    released["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    request = pod_request("UPDATE", released, placed, user=WORKER)
    assert chain().called(request) == set()
    assert chain().with_webhook_down(request).allowed
    # Its other writes do not wait either: the claim (finalizer, placement) and the binding result.
    claimed = with_key(pod(scheduler=SCHEDULER), EVERY_KEY["finalizer " + keys.FINALIZER])
    assert (
        chain()
        .with_webhook_down(pod_request("UPDATE", claimed, pod(scheduler=SCHEDULER), user=WORKER))
        .allowed
    )
    # In an unmanaged namespace too, and the pod's deletion itself.
    elsewhere = placed_pod(OTHER_NS)
    gone = copy.deepcopy(elsewhere)
    gone["metadata"]["finalizers"] = []
    assert chain().with_webhook_down(pod_request("UPDATE", gone, elsewhere, user=WORKER)).allowed
    assert chain().with_webhook_down(pod_request("DELETE", None, placed, user="alice")).allowed


def test_the_same_finalizer_removal_by_anyone_else_is_checked() -> None:
    placed = placed_pod()
    released = copy.deepcopy(placed)
    released["metadata"]["finalizers"] = []
    request = pod_request("UPDATE", released, placed, user="alice")
    assert VALIDATE_PODS in chain().called(request)
    assert chain().with_webhook_down(request).rejected_by == VALIDATE_PODS


@pytest.mark.parametrize("namespace", [MANAGED_NS, OTHER_NS])
def test_a_pod_naming_our_scheduler_is_blocked(namespace: str) -> None:
    request = pod_request("CREATE", pod(namespace=namespace, scheduler=SCHEDULER))
    # Both its mutation (toleration, nodeName) and its validation must run.
    assert chain().called(request) == {MUTATE_SCHEDULER_PODS, VALIDATE_PODS}
    assert not chain().with_webhook_down(request).allowed


@pytest.mark.parametrize("scheduler", [None, "", "default-scheduler"])
def test_a_default_scheduler_pod_of_a_managed_namespace_waits_for_its_routing(scheduler: str | None) -> None:
    request = pod_request("CREATE", pod(namespace=MANAGED_NS, scheduler=scheduler))
    assert chain().called(request) == {MUTATE_PODS}
    assert chain().with_webhook_down(request).rejected_by == MUTATE_PODS
    # Mutated (schedulerName set), it is validated next.
    routed = pod(namespace=MANAGED_NS, scheduler=SCHEDULER)
    assert VALIDATE_PODS in chain().called(pod_request("CREATE", routed))


@pytest.mark.parametrize(
    "obj",
    [
        pod(scheduler="volcano"),
        pod(annotations={"kubernetes.io/config.mirror": "abc"}),
        {
            **pod(),
            "metadata": {
                "name": "agent",
                "namespace": MANAGED_NS,
                "ownerReferences": [{"kind": "DaemonSet", "name": "ds", "uid": "1", "controller": True}],
            },
        },
    ],
    ids=["another scheduler", "mirror pod", "daemonset pod"],
)
def test_pods_slurm_never_places_pass_in_a_managed_namespace(obj: Json) -> None:
    for request in (
        pod_request("CREATE", obj),
        pod_request("UPDATE", obj, obj),
        pod_request("DELETE", None, obj),
    ):
        assert chain().called(request) == set()
        assert chain().with_webhook_down(request).allowed


@pytest.mark.parametrize("key", list(EVERY_KEY), ids=list(EVERY_KEY))
@pytest.mark.parametrize("namespace", [OTHER_NS, MANAGED_NS])
def test_a_user_adding_changing_or_removing_a_bridge_key_is_sent_to_the_webhook(
    key: str, namespace: str
) -> None:
    plain = pod(namespace=namespace, scheduler="volcano")
    keyed = with_key(plain, EVERY_KEY[key])
    changed = with_key(plain, EVERY_KEY[key], "43") if EVERY_KEY[key][0] != "finalizers" else keyed
    for request in (
        pod_request("CREATE", keyed),  # forged on creation
        pod_request("UPDATE", keyed, plain),  # added
        pod_request("UPDATE", changed, keyed),  # changed
        pod_request("UPDATE", plain, keyed),  # removed
    ):
        assert chain().called(request) == {VALIDATE_PODS}, request.operation
        assert chain().with_webhook_down(request).rejected_by == VALIDATE_PODS


def test_every_key_only_the_bridge_may_write_is_in_the_scope() -> None:
    """webhook/checks.py OWNED_KEYS and the chart's matchConditions name the same keys."""
    owned = {(field, key) for _, field, key in OWNED_KEYS}
    assert owned <= set(EVERY_KEY.values()), "a key the webhook guards is missing from EVERY_KEY"
    plain = pod(namespace=OTHER_NS, scheduler="volcano")
    other = with_key(plain, ("annotations", "example.com/owner"))
    assert chain().called(pod_request("UPDATE", other, plain)) == set()


def test_only_the_worker_itself_is_exempt() -> None:
    values = {
        "webhook": {"managedNamespaces": [MANAGED_NS], "extraBridgeServiceAccounts": ["ops:break-glass"]}
    }
    plain = pod(namespace=OTHER_NS, scheduler="volcano")
    forged = with_key(plain, ("labels", keys.LABEL_SLURM_JOB_ID))
    for user in (
        "alice",
        "system:serviceaccount:other:slurm-bridge",  # same name, another namespace
        "system:serviceaccount:slurm-bridge:slurm-bridge-webhook",  # the webhook's own account
        "system:serviceaccount:slurm-bridge:slurm-bridge2",
        "ops:break-glass",  # allowed by the webhook, still asked
        "system:admin",
    ):
        assert chain(values).called(pod_request("UPDATE", forged, plain, user=user)) == {VALIDATE_PODS}, user
    assert chain(values).called(pod_request("UPDATE", forged, plain, user=WORKER)) == set()


def test_the_release_label_does_not_switch_the_anti_forgery_check_off() -> None:
    # Anyone can put the release's instance label on a pod; it only opts the
    # pod out of routing (the objectSelector of mutate-pods), never out of validation.
    disguised = pod(namespace=OTHER_NS, labels={"app.kubernetes.io/instance": "slurm-bridge"})
    forged = with_key(disguised, ("labels", keys.LABEL_SLURM_JOB_ID))
    assert chain().called(pod_request("CREATE", forged)) == {VALIDATE_PODS}
    assert chain().called(pod_request("UPDATE", forged, disguised)) == {VALIDATE_PODS}
    in_managed = pod(
        namespace=MANAGED_NS, scheduler=SCHEDULER, labels={"app.kubernetes.io/instance": "slurm-bridge"}
    )
    assert VALIDATE_PODS in chain().called(pod_request("CREATE", in_managed))


def test_the_release_pods_start_in_a_managed_release_namespace() -> None:
    # Defaults: the release namespace slurm-bridge is managed.
    own = pod(
        namespace="slurm-bridge",
        labels={"app.kubernetes.io/instance": "slurm-bridge", "app.kubernetes.io/component": "webhook"},
    )
    assert chain({}).with_webhook_down(pod_request("CREATE", own)).allowed
    assert (
        chain({}).with_webhook_down(pod_request("CREATE", pod(namespace="slurm-bridge"))).rejected_by
        == MUTATE_PODS
    )


@pytest.mark.parametrize("namespace", ["kube-system", "kube-node-lease"])
def test_the_cluster_namespaces_never_wait(namespace: str) -> None:
    for obj in (pod(namespace=namespace, scheduler=SCHEDULER), placed_pod(namespace)):
        assert chain().called(pod_request("CREATE", obj)) == set()
        assert chain().called(pod_request("UPDATE", obj, obj)) == set()


def test_resize_is_checked_only_for_bridge_pods() -> None:
    ours = pod(namespace=OTHER_NS, scheduler=SCHEDULER)
    theirs = pod(namespace=MANAGED_NS, scheduler="default-scheduler")
    assert chain().called(pod_request("UPDATE", ours, ours, sub_resource="resize")) == {VALIDATE_PODS}
    assert chain().called(pod_request("UPDATE", theirs, theirs, sub_resource="resize")) == set()
    # A status update that leaves the bridge-owned keys alone (the kubelet's) never waits.
    assert chain().called(pod_request("UPDATE", ours, ours, sub_resource="status")) == set()


@pytest.mark.parametrize(
    ("field", "key"),
    [("labels", JOBID), ("annotations", NODE), ("annotations", "slurm-bridge/placement")],
)
def test_a_status_update_changing_a_bridge_owned_key_is_sent(field: str, key: str) -> None:
    """pods/status keeps label and annotation changes: it must not get around the check."""
    plain = pod(namespace=OTHER_NS, scheduler="default-scheduler")
    keyed = pod(namespace=OTHER_NS, scheduler="default-scheduler")
    keyed["metadata"][field] = {key: "1"}
    other = pod(namespace=OTHER_NS, scheduler="default-scheduler")
    other["metadata"][field] = {key: "2"}
    for old, new in ((plain, keyed), (keyed, plain), (keyed, other)):
        request = pod_request("UPDATE", new, old, sub_resource="status")
        assert chain().called(request) == {VALIDATE_POD_STATUS}
        assert not validate(admission_request(request), managed=False, policy=policy()).allowed
    running = pod(namespace=OTHER_NS, scheduler="default-scheduler")
    running["metadata"][field] = {key: "1", "other": "x"}
    assert chain().called(pod_request("UPDATE", running, keyed, sub_resource="status")) == set()
    assert chain().called(pod_request("UPDATE", other, keyed, sub_resource="status", user=WORKER)) == set()


def workload_request(gvkr: tuple[str, str, str, str], obj: Json, operation: str = "CREATE") -> Request:
    group, version, kind, resource = gvkr
    return Request(
        operation,  # type: ignore[arg-type]
        obj["metadata"]["namespace"],
        obj,
        copy.deepcopy(obj) if operation == "UPDATE" else None,
        group=group,
        version=version,
        resource=resource,
        kind=kind,
    )


def _template(scheduler: str | None) -> Json:
    return {"metadata": {}, "spec": pod(scheduler=scheduler)["spec"]}


def _workload(kind: tuple[str, str, str, str], scheduler: str | None, annotations: dict[str, str]) -> Json:
    spec: Json
    if kind == JOB:
        spec = {"template": _template(scheduler)}
    elif kind == JOBSET:
        spec = {
            "replicatedJobs": [
                {"name": "a", "template": {"spec": {"template": _template(None)}}},
                {"name": "b", "template": {"spec": {"template": _template(scheduler)}}},
            ]
        }
    elif kind == LWS:
        spec = {
            "leaderWorkerTemplate": {
                "leaderTemplate": _template(None),
                "workerTemplate": _template(scheduler),
            }
        }
    else:
        spec = {"minMember": 2}
    meta = {"name": "w", "namespace": MANAGED_NS, "annotations": annotations}
    return {"apiVersion": f"{kind[0]}/{kind[1]}", "kind": kind[2], "metadata": meta, "spec": spec}


@pytest.mark.parametrize("kind", [JOB, JOBSET, LWS, PODGROUP], ids=lambda k: k[2])
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_workloads_wait_only_when_they_shape_a_slurm_job(
    kind: tuple[str, str, str, str], operation: str
) -> None:
    plain = _workload(kind, "default-scheduler", {"example.com/team": "a"})
    assert chain().called(workload_request(kind, plain, operation)) == set()
    assert chain().with_webhook_down(workload_request(kind, plain, operation)).allowed
    annotated = _workload(kind, None, {keys.SLURMJOB_PREFIX + "timelimit": "30"})
    assert (
        chain().with_webhook_down(workload_request(kind, annotated, operation)).rejected_by
        == VALIDATE_WORKLOADS
    )
    if kind != PODGROUP:
        named = _workload(kind, SCHEDULER, {})
        assert (
            chain().with_webhook_down(workload_request(kind, named, operation)).rejected_by
            == VALIDATE_WORKLOADS
        )


def test_other_workloads_never_wait() -> None:
    deployment = {
        "metadata": {"name": "d", "namespace": MANAGED_NS, "annotations": {keys.SLURMJOB_PREFIX + "qos": "x"}}
    }
    request = Request(
        "CREATE", MANAGED_NS, deployment, group="apps", resource="deployments", kind="Deployment"
    )
    assert chain().called(request) == set()


def test_a_namespace_selector_scopes_the_routing() -> None:
    values = {"webhook": {"managedNamespaceSelector": {"matchLabels": {"slinky.slurm.net/managed": "true"}}}}
    labels = {"slinky.slurm.net/managed": "true"}
    created = pod(namespace="team-a")
    assert (
        chain(values).with_webhook_down(pod_request("CREATE", created, namespace_labels=labels)).rejected_by
        == MUTATE_PODS
    )
    assert chain(values).with_webhook_down(pod_request("CREATE", created)).allowed
    # The list is ignored once a selector is set (as by the webhook itself), and
    # the cluster's namespaces stay out even when labelled.
    assert chain(values).with_webhook_down(pod_request("CREATE", pod(namespace="slurm-bridge"))).allowed
    system = pod(namespace="kube-system")
    assert chain(values).with_webhook_down(pod_request("CREATE", system, namespace_labels=labels)).allowed


def test_without_managed_namespaces_nothing_is_routed() -> None:
    values: dict[str, Any] = {"webhook": {"managedNamespaces": []}}
    assert MUTATE_PODS not in {w.name for w in chain(values).webhooks}
    for namespace in (MANAGED_NS, "slurm-bridge"):
        assert chain(values).with_webhook_down(pod_request("CREATE", pod(namespace=namespace))).allowed
    ours = pod(scheduler=SCHEDULER)
    assert not chain(values).with_webhook_down(pod_request("CREATE", ours)).allowed


def test_failure_policy_ignore_lets_everything_through() -> None:
    values = {"webhook": {"managedNamespaces": [MANAGED_NS], "failurePolicy": "Ignore"}}
    placed = placed_pod()
    for request in (
        pod_request("CREATE", pod(scheduler=SCHEDULER)),
        pod_request("UPDATE", placed, pod(scheduler=SCHEDULER)),
    ):
        assert chain(values).called(request)
        assert chain(values).with_webhook_down(request).allowed


def test_another_scheduler_name_is_what_the_conditions_compare() -> None:
    values = {"schedulerName": "slurm", "webhook": {"managedNamespaces": [MANAGED_NS]}}
    assert chain(values).called(pod_request("CREATE", pod(namespace=OTHER_NS, scheduler="slurm"))) == {
        MUTATE_SCHEDULER_PODS,
        VALIDATE_PODS,
    }
    assert chain(values).called(pod_request("CREATE", pod(namespace=OTHER_NS, scheduler=SCHEDULER))) == set()


# --- the scope against the webhook's own decisions -----------------------------------------------

PROPERTIES = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
USERS = st.sampled_from(
    ["alice", "system:serviceaccount:hpc:runner", "system:serviceaccount:other:slurm-bridge"]
)


def well_formed(obj: Json) -> bool:
    """What the API server could send: typed metadata and spec (strategies.pods() breaks them at times)."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec")
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    return (
        isinstance(spec, dict)
        and isinstance(labels, dict)
        and isinstance(annotations, dict)
        and all(isinstance(v, str) for v in annotations.values())
    )


def admission_request(
    request: Request, gvkr: tuple[str, str, str, str] = ("", "v1", "Pod", "pods")
) -> AdmissionRequest:
    sent = review(
        request.object,
        old=request.old_object,
        operation=request.operation,
        namespace=request.namespace,
        gvkr=gvkr,
        sub_resource=request.sub_resource or None,
        user=request.username,
    )
    return AdmissionReview.model_validate(sent).request


@PROPERTIES
@given(obj=pods(), user=USERS)
def test_created_pods_wait_exactly_for_what_the_webhook_does(obj: Json, user: str) -> None:
    assume(well_formed(obj))
    namespace = obj["metadata"]["namespace"]
    managed = namespace == MANAGED_NS
    request = pod_request("CREATE", obj, user=user)
    decisions = chain().decisions(request)
    assert "error" not in decisions.values(), decisions
    mutation_called = {MUTATE_PODS, MUTATE_SCHEDULER_PODS} & chain().called(request)
    # Mutation is called exactly for the pods the webhook routes to Slurm.
    assert bool(mutation_called) == is_bridge_pod(obj, managed=managed, policy=policy())
    assert len(mutation_called) <= 1, "a pod sent to /mutate twice"
    answer = mutate(admission_request(request), managed=managed, policy=policy())
    if patch_of(answer.model_dump(by_alias=True, exclude_none=True)):
        assert mutation_called
    mutated = apply_patch(copy.deepcopy(obj), answer.model_dump(by_alias=True, exclude_none=True))
    after = pod_request("CREATE", mutated, user=user)
    verdict = validate(admission_request(after), managed=managed, policy=policy())
    if not verdict.allowed:
        assert VALIDATE_PODS in chain().called(after), verdict.status


@st.composite
def updates(draw: st.DrawFn) -> tuple[Json, Json]:
    old = draw(pods())
    new = copy.deepcopy(old)
    meta = new["metadata"]
    for _ in range(draw(st.integers(1, 2))):
        change = draw(st.sampled_from([*EVERY_KEY, "annotations", "labels", "finalizers"]))
        if change in EVERY_KEY:
            field, key = EVERY_KEY[change]
            if draw(st.booleans()):
                new = with_key(new, (field, key), draw(st.sampled_from(["12", "99"])))
                meta = new["metadata"]
            elif field == "finalizers":
                meta["finalizers"] = [f for f in meta.get("finalizers", []) if f != key]
            else:
                (meta.get(field) or {}).pop(key, None)
        elif change == "annotations":
            meta["annotations"] = {**(meta.get("annotations") or {}), **draw(annotation_sets())}
        elif change == "labels":
            meta["labels"] = {**(meta.get("labels") or {}), "app": "x"}
        else:
            meta["finalizers"] = []
    if draw(st.booleans()):
        old, new = new, old
    return old, new


@PROPERTIES
@given(change=updates(), user=USERS, sub_resource=st.sampled_from(["", "", "resize", "status"]))
def test_updates_the_webhook_would_refuse_are_sent_to_it(
    change: tuple[Json, Json], user: str, sub_resource: str
) -> None:
    old, new = change
    assume(well_formed(old) and well_formed(new))
    request = pod_request("UPDATE", new, old, user=user, sub_resource=sub_resource)
    decisions = chain().decisions(request)
    assert "error" not in decisions.values(), decisions
    managed = request.namespace == MANAGED_NS
    verdict = validate(admission_request(request), managed=managed, policy=policy())
    if not verdict.allowed:
        assert chain().called(request) & {VALIDATE_PODS, VALIDATE_POD_STATUS}, verdict.status


def _without_owned_keys(template: Json) -> None:
    meta = template.get("metadata") or {}
    for _, field, key in OWNED_KEYS:
        (meta.get(field) or {}).pop(key, None)


def _templates(obj: Json) -> list[Json]:
    spec = obj["spec"]
    if "template" in spec:
        return [spec["template"]]
    if "replicatedJobs" in spec:
        return [j["template"]["spec"]["template"] for j in spec["replicatedJobs"]]
    lws = spec.get("leaderWorkerTemplate") or {}
    return [t for t in (lws.get("leaderTemplate"), lws.get("workerTemplate")) if t]


@PROPERTIES
@given(workload=workloads(), operation=st.sampled_from(["CREATE", "UPDATE"]))
def test_workloads_the_webhook_would_refuse_are_sent_to_it_or_fail_as_pods(
    workload: tuple[tuple[str, str, str, str], Json], operation: str
) -> None:
    gvkr, obj = workload
    assume(all(well_formed(t) for t in _templates(obj)))
    request = workload_request(gvkr, obj, operation)
    if operation == "UPDATE":
        # A workload that had no problem before (only new problems are refused on UPDATE).
        request = Request(
            "UPDATE",
            request.namespace,
            obj,
            {"metadata": {"name": "w"}, "spec": {}},
            group=request.group,
            version=request.version,
            resource=request.resource,
            kind=request.kind,
        )
    decisions = chain().decisions(request)
    assert "error" not in decisions.values(), decisions
    if VALIDATE_WORKLOADS in chain().called(request):
        return
    # Skipped: whatever the webhook would refuse, it refuses again when the
    # workload's pods are created (they are validated then, see above): only a
    # template with a bridge-owned key, or one asking for the default scheduler
    # in a managed namespace. Without those, the webhook allows it.
    stripped = copy.deepcopy(obj)
    for template in _templates(stripped):
        _without_owned_keys(template)
    verdict = validate(
        admission_request(workload_request(gvkr, stripped), gvkr), managed=False, policy=policy()
    )
    assert verdict.allowed, verdict.status
