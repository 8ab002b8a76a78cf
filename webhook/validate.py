"""`/validate`: refuse what the bridge cannot place, at `kubectl apply` time. Pure.

Pods:
- anyone but the bridge setting (CREATE) or changing (UPDATE) the job-id label,
  the node or the placement annotation (`checks.OWNED_KEYS`) is refused, on
  every pod: a forged job id would let a pod ride on another job's allocation;
- a bridge pod (see `policy.is_bridge_pod`) must be placeable: no
  topologySpreadConstraints, resourceClaims, cpu together with DRA cpu,
  DRA classes the bridge does not honour (DRA_DEVICE_CLASSES) or the cluster does not
  have (looked up by the Webhook on CREATE: `policy.cluster_classes`), bad quantities,
  and valid `slurmjob.slinky.slurm.net/*` annotations; a bare pod must also pass the
  worker's translation;
- the `slurmjob.slinky.slurm.net/*` annotations of a bridge pod or workload (and
  of its templates) must keep to the namespace's tenant policy (`bridge.policy`);
  what upstream slurm-bridge accepts but is likely a mistake (an unknown key, which
  both ignore; an `exclusive` value other than true/false) is admitted with a warning;
- `pods/resize` of a bridge pod is refused (its Slurm allocation is fixed);
- `pods/status` may change labels and annotations too: the owned keys are guarded there as well.
Workloads (Job, JobSet, LeaderWorkerSet, PodGroup): see `webhook.workloads`.

On UPDATE only problems the update introduces are refused, so an object that
predates the webhook can still be updated (finalizers removed, labels added).
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from webhook.checks import (
    annotation_warnings_of,
    metadata_maps,
    owned_keys_on_create,
    owned_keys_on_update,
    pod_problems,
    tenant_problems,
    translation_problem,
)
from webhook.policy import AdmissionPolicy, has_controller, is_bridge_pod
from webhook.review import AdmissionRequest, AdmissionResponse
from webhook.workloads import WORKLOADS, workload_problems, workload_warnings

MAX_MESSAGE = 4000
MAX_WARNING = 250  # the API server may truncate longer warnings


def denial(uid: str, subject: str, problems: list[str]) -> AdmissionResponse:
    """One message with every problem, cut (and counted) past MAX_MESSAGE characters."""
    head = f"slurm-bridge: {subject}: "
    shown: list[str] = []
    length = len(head)
    for problem in problems:
        length += len(problem) + 2
        if length > MAX_MESSAGE and shown:
            break
        shown.append(problem[:MAX_MESSAGE])
    rest = len(problems) - len(shown)
    return AdmissionResponse.deny(uid, head + "; ".join(shown) + (f" (and {rest} more)" if rest else ""))


def _warnings(problems: list[str], notes: Sequence[str] = ()) -> list[str]:
    """Problems the object already had (kept, not refused), then `notes`: accepted, likely not meant."""
    shown = ["already present, fix when convenient: " + p for p in problems] + list(notes)
    return [w[:MAX_WARNING] for w in shown[:10]]


def _introduced(
    find: Callable[[Mapping[str, Any]], list[str]], old: Mapping[str, Any], new: Mapping[str, Any]
) -> list[str]:
    """Warnings of `new` that `old` did not have: an update is not warned about again for them."""
    before = find(old)
    return [w for w in find(new) if w not in before]


def _new_problems(
    find: Callable[[Mapping[str, Any]], list[str]], old: Mapping[str, Any], new: Mapping[str, Any]
) -> tuple[list[str], list[str]]:
    """(problems the update introduces, problems the old object already had)."""
    before = find(old)
    after = find(new)
    return [p for p in after if p not in before], [p for p in after if p in before]


def _pod_checks(
    pod: Mapping[str, Any], *, creating: bool, namespace: str, policy: AdmissionPolicy
) -> list[str]:
    problems = pod_problems(pod, policy, node_name_allowed=not creating)
    if not problems:
        problems += tenant_problems(metadata_maps(pod)[1], namespace, policy)
    if not problems and not has_controller(pod):
        # A bare pod is its own Slurm job: the worker's translation must accept it.
        # (A workload's pods are translated with the workload's shape and
        # annotations, which this request does not carry.)
        problem = translation_problem(pod, policy)
        if problem:
            problems.append(problem)
    return problems


def _validate_pod(request: AdmissionRequest, *, managed: bool, policy: AdmissionPolicy) -> AdmissionResponse:
    pod, old = request.object or {}, request.old_object or {}
    bridge_user = policy.is_bridge_user(request.user_info.username)
    notes: list[str] = []  # accepted, likely not meant: returned as warnings
    if request.operation == "CREATE":
        problems = [] if bridge_user else owned_keys_on_create(pod, policy)
        if is_bridge_pod(pod, managed=managed, policy=policy):
            problems += _pod_checks(pod, creating=True, namespace=request.namespace, policy=policy)
            notes = annotation_warnings_of(pod)
        if problems:
            return denial(request.uid, "pod not accepted", problems)
        return AdmissionResponse.allow(request.uid, warnings=_warnings([], notes))
    problems = [] if bridge_user else owned_keys_on_update(old, pod, policy)
    existing: list[str] = []
    # An existing pod is the bridge's only if it names our scheduler: a pod
    # created before its namespace became managed still belongs to kube-scheduler.
    if is_bridge_pod(pod, managed=False, policy=policy):
        introduced, existing = _new_problems(
            lambda p: _pod_checks(p, creating=False, namespace=request.namespace, policy=policy), old, pod
        )
        problems += introduced
        notes = _introduced(annotation_warnings_of, old, pod)
    if problems:
        return denial(request.uid, "pod update not accepted", problems)
    return AdmissionResponse.allow(request.uid, warnings=_warnings(existing, notes))


def _validate_status(request: AdmissionRequest, *, policy: AdmissionPolicy) -> AdmissionResponse:
    """pods/status keeps label and annotation changes (its strategy resets only the spec,
    deletionTimestamp and ownerReferences): the bridge-owned keys are guarded here too."""
    if request.operation != "UPDATE" or policy.is_bridge_user(request.user_info.username):
        return AdmissionResponse.allow(request.uid)
    problems = owned_keys_on_update(request.old_object or {}, request.object or {}, policy)
    if problems:
        return denial(request.uid, "pod status update not accepted", problems)
    return AdmissionResponse.allow(request.uid)


def _validate_resize(request: AdmissionRequest, *, policy: AdmissionPolicy) -> AdmissionResponse:
    pod = request.old_object or request.object or {}
    if is_bridge_pod(pod, managed=False, policy=policy):
        return denial(
            request.uid,
            "pods/resize not accepted",
            [
                "in-place resize of a pod placed by slurm-bridge is not supported: "
                "its Slurm job holds a fixed allocation; "
                "delete the pod and create it again with the new resources"
            ],
        )
    return AdmissionResponse.allow(request.uid)


def validate(request: AdmissionRequest, *, managed: bool, policy: AdmissionPolicy) -> AdmissionResponse:
    """The answer for `/validate`; `managed` says whether the request's namespace is managed."""
    group, resource = request.resource.group, request.resource.resource
    known_workload = (group, resource) in WORKLOADS
    if not known_workload and (group, resource) != ("", "pods"):
        return AdmissionResponse.deny(
            request.uid,
            f"slurm-bridge /validate does not handle {request.kind} (resource {resource}): "
            "remove it from the rules of the ValidatingWebhookConfiguration",
            code=400,
        )
    if request.operation in ("DELETE", "CONNECT"):
        return AdmissionResponse.allow(request.uid)
    if request.object is None or (request.operation == "UPDATE" and request.old_object is None):
        missing = "request.object" if request.object is None else "request.oldObject"
        return AdmissionResponse.deny(
            request.uid, f"{missing} is missing from the {request.operation} review", code=400
        )
    if resource == "pods" and request.sub_resource == "resize":
        return _validate_resize(request, policy=policy)
    if resource == "pods" and request.sub_resource == "status":
        return _validate_status(request, policy=policy)
    if request.sub_resource:
        # status, binding, eviction, scale...: not the bridge's to police.
        return AdmissionResponse.allow(request.uid)
    if known_workload:
        find = WORKLOADS[(group, resource)]

        def problems_of(obj: Mapping[str, Any]) -> list[str]:
            return workload_problems(find, obj, managed=managed, policy=policy, namespace=request.namespace)

        def warnings_of(obj: Mapping[str, Any]) -> list[str]:
            return workload_warnings(find, obj, managed=managed, policy=policy)

        existing: list[str] = []
        if request.operation == "CREATE":
            problems = problems_of(request.object)
            notes = warnings_of(request.object)
        else:
            problems, existing = _new_problems(problems_of, request.old_object or {}, request.object)
            notes = _introduced(warnings_of, request.old_object or {}, request.object)
        if problems:
            return denial(request.uid, f"{request.kind.kind} not accepted", problems)
        return AdmissionResponse.allow(request.uid, warnings=_warnings(existing, notes))
    return _validate_pod(request, managed=managed, policy=policy)
