"""Problem finders for pods and pod templates: each returns user-facing sentences.

Every sentence names the field or key and says how to fix it. The placement
rules and the annotation parser are the bridge's own (`bridge.resources`,
`bridge.annotations`, `bridge.translate`): the webhook adds no second parser,
so what it admits is exactly what the worker can submit.
"""

from collections.abc import Mapping
from typing import Any

from bridge import keys
from bridge.annotations import AnnotationError, JobAnnotations, annotation_warnings, parse_job_annotations
from bridge.components import SizingError, sizing_of
from bridge.device_classes import DeviceClasses
from bridge.dra import RESOURCE_GROUP
from bridge.resources import PodSpecError, dra_classes_of, placement_problems, pod_resources
from bridge.translate import Defaults, TranslationError, build_pod_job
from webhook.policy import AdmissionPolicy, ClusterDeviceClasses

# (what, metadata field, key) of everything only the bridge may write on a pod.
# The chart's admission-webhooks.yaml names the same keys in its matchConditions
# (tests/deploy/test_webhook_scope.py keeps the two in step).
OWNED_KEYS = (
    ("label", "labels", keys.LABEL_SLURM_JOB_ID),
    ("annotation", "annotations", keys.ANNOTATION_SLURM_NODE),
    # The placement that claimed the pod: a forged one would hand the pod to another job's placement.
    ("annotation", "annotations", keys.ANNOTATION_PLACEMENT),
)


def string_map(value: Any, where: str) -> tuple[dict[str, str], list[str]]:
    """A labels/annotations map, or the problem with it (the API server sends only strings)."""
    if value is None:
        return {}, []
    if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
        return {}, [f"{where} must map names to string values; quote numbers and booleans"]
    return dict(value), []


def metadata_maps(
    obj: Mapping[str, Any], where: str = ""
) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(labels, annotations, problems) of an object or pod template."""
    meta = obj.get("metadata")
    if meta is None:
        return {}, {}, []
    if not isinstance(meta, Mapping):
        return {}, {}, [f"{where}metadata must be an object"]
    labels, label_problems = string_map(meta.get("labels"), f"{where}metadata.labels")
    annotations, annotation_problems = string_map(meta.get("annotations"), f"{where}metadata.annotations")
    return labels, annotations, label_problems + annotation_problems


def _who_may(policy: AdmissionPolicy) -> str:
    if not policy.bridge_users:
        return (
            "only slurm-bridge may (no bridge service account is configured: see --bridge-service-accounts)"
        )
    return "only slurm-bridge may (" + ", ".join(sorted(policy.bridge_users)) + ")"


def owned_keys_on_create(obj: Mapping[str, Any], policy: AdmissionPolicy, where: str = "") -> list[str]:
    """The bridge-owned label/annotation must not come from a manifest."""
    problems = []
    meta = obj.get("metadata")
    for what, field, key in OWNED_KEYS:
        values = meta.get(field) if isinstance(meta, Mapping) else None
        if isinstance(values, Mapping) and key in values:
            problems.append(
                f"{where}metadata.{field}: the {what} {key} is set by slurm-bridge to tie a pod to its Slurm "
                f"job's allocation; remove it from the manifest ({_who_may(policy)})"
            )
    return problems


def owned_keys_on_update(
    old: Mapping[str, Any], new: Mapping[str, Any], policy: AdmissionPolicy
) -> list[str]:
    """Once written, the bridge-owned label/annotation may only be changed by the bridge."""
    problems = []
    for what, field, key in OWNED_KEYS:
        before, after = _meta_value(old, field, key), _meta_value(new, field, key)
        if before != after:
            problems.append(
                f"metadata.{field}: the {what} {key} cannot be changed from {_shown(before)} to "
                f"{_shown(after)}: it ties the pod to its Slurm job's allocation and {_who_may(policy)}; "
                "keep its current value"
            )
    return problems


def _meta_value(obj: Mapping[str, Any], field: str, key: str) -> object:
    meta = obj.get("metadata")
    values = meta.get(field) if isinstance(meta, Mapping) else None
    return values.get(key) if isinstance(values, Mapping) else None


def _shown(value: object) -> str:
    return "(unset)" if value is None else f'"{str(value)[:63]}"'


def annotation_problems(annotations: Mapping[str, str]) -> tuple[JobAnnotations | None, list[str]]:
    """The slurmjob annotations as the job will read them, and why not; the sizing annotation too."""
    try:
        sizing_of(annotations, "per-pod")
    except SizingError as error:
        sizing = [str(error)]
    else:
        sizing = []
    try:
        return parse_job_annotations(annotations), sizing
    except AnnotationError as error:
        return None, [str(problem) for problem in error.problems] + sizing


def annotation_warnings_of(obj: Mapping[str, Any], where: str = "") -> list[str]:
    """What the object's annotations say that is accepted but likely not meant: an unknown key
    under the prefix (ignored, as upstream ignores it), a non-boolean `exclusive`. Warnings, not
    denials: a manifest written for upstream slurm-bridge must pass."""
    _, annotations, problems = metadata_maps(obj, where)
    if problems:
        return []  # reported as problems
    prefix = f"in {where.rstrip('.')}: " if where else ""
    return [prefix + warning for warning in annotation_warnings(annotations)]


def _dra_classes(pod: Mapping[str, Any]) -> set[str]:
    try:
        resources = pod_resources(pod)
    except PodSpecError:
        return set()  # placement_problems() reports the bad quantities
    names = {*resources.requests, *resources.limits}
    return {n.removeprefix(keys.DRA_RESOURCE_PREFIX) for n in names if n.startswith(keys.DRA_RESOURCE_PREFIX)}


def annotation_conflicts(pod: Mapping[str, Any], job: JobAnnotations, honoured: DeviceClasses) -> list[str]:
    """Annotations that contradict explicit DRA requests (upstream's rule: DRA requests are authoritative).

    The devices a DRA request names are allocated from the Slurm job's own
    allocation; an annotation asking Slurm for something else would make the two disagree.
    """
    asked = [c for c in map(honoured.get, sorted(_dra_classes(pod))) if c is not None]
    problems = []
    for cpu_class in (c for c in asked if c.is_cpu and job.cpu_per_task is not None):
        problems.append(
            f"annotation {keys.SLURMJOB_PREFIX}cpu-per-task cannot be combined with {cpu_class.resource} "
            "in container resources: the DRA request decides the CPUs; remove the annotation"
        )
    gres_classes = [c.resource for c in asked if not c.is_cpu]
    if job.gres is not None and gres_classes:
        problems.append(
            f"annotation {keys.SLURMJOB_PREFIX}gres cannot be combined with DRA device requests "
            f"({', '.join(gres_classes)}): the DRA requests decide the devices; remove the annotation, or "
            "request nvidia.com/gpu instead"
        )
    return problems


def cluster_class_problems(
    pod: Mapping[str, Any], honoured: DeviceClasses, cluster: ClusterDeviceClasses | None
) -> list[str]:
    """Honoured classes the pod asks for that the cluster does not have (or could not be asked about).

    Without the DeviceClass the kubelet cannot prepare the devices the claim names, so the
    worker would fail the placement at binding, after the job waited in Slurm's queue.
    """
    if cluster is None:
        return []
    problems = []
    unknown = dict(cluster.unknown)
    for name in dra_classes_of(pod):
        asked = honoured.get(name)
        if asked is None:
            continue  # not honoured: placement_problems says so
        if cluster.unserved:
            problems.append(
                f"{asked.resource} asks for DeviceClass {name}, but this cluster does not serve "
                f"{RESOURCE_GROUP}/v1 (Kubernetes 1.34 or later, with DRA), so it has no DeviceClasses: "
                "request the devices without DRA (nvidia.com/gpu, or the annotation "
                f"{keys.SLURMJOB_PREFIX}gres)"
            )
        elif name in cluster.missing:
            problems.append(
                f"{asked.resource} asks for DeviceClass {name}, which does not exist in the cluster "
                "(kubectl get deviceclasses): install its DRA driver, which creates the class, or ask "
                "for a class that exists"
            )
        elif name in unknown:
            problems.append(f"cannot tell whether DeviceClass {name} exists ({unknown[name]}); try again")
    return problems


def pod_problems(
    pod: Mapping[str, Any], policy: AdmissionPolicy, *, where: str = "", node_name_allowed: bool = False
) -> list[str]:
    """Why the bridge could not place this pod (or the pods of this template); empty when it can.

    `where` is the template's path inside a workload ("spec.template."), empty for a pod.
    """
    _, annotations, problems = metadata_maps(pod, where)
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        problems.append(f"{where}spec must be an object")
    if problems:
        return problems  # the checks below assume well-typed metadata and spec
    if not node_name_allowed and spec and spec.get("nodeName"):
        problems.append(
            f'{where}spec.nodeName is "{str(spec["nodeName"])[:63]}", but Slurm decides where slurm-bridge '
            "pods run: remove spec.nodeName, or use the annotation slurmjob.slinky.slurm.net/constraints"
        )
    found = placement_problems(pod, policy.device_classes)
    found += cluster_class_problems(pod, policy.device_classes, policy.cluster_classes)
    job, parse_problems = annotation_problems(annotations)
    found += parse_problems
    if job is not None:
        found += annotation_conflicts(pod, job, policy.device_classes)
    prefix = f"in {where.rstrip('.')}: " if where else ""
    return problems + [prefix + problem for problem in found]


def tenant_problems(
    annotations: Mapping[str, str], namespace: str, policy: AdmissionPolicy, where: str = ""
) -> list[str]:
    """How these annotations break the namespace's tenant policy (`bridge.policy`), in the worker's words.

    Annotations the parser refuses are reported by the parser's own problems, not here.
    """
    if not policy.tenants.restricts:
        return []
    job, _ = annotation_problems(annotations)
    if job is None:
        return []
    prefix = f"in {where.rstrip('.')}: " if where else ""
    return [prefix + problem for problem in policy.tenants.check(namespace, job)]


def translation_problem(pod: Mapping[str, Any], policy: AdmissionPolicy) -> str | None:
    """What the worker's own translation of a bare pod says, when the checks above found nothing.

    It catches what only the whole job shows (e.g. min-nodes above the single
    node a bare pod gets), with the worker's exact words.
    """
    try:
        build_pod_job(pod, defaults=Defaults(device_classes=policy.device_classes))
    except TranslationError as error:
        return f"the pod cannot become a Slurm job: {error}"
    return None
