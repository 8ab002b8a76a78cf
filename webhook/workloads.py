"""Workloads whose annotations shape a Slurm job: Job, JobSet, LeaderWorkerSet, PodGroup.

The worker reads `slurmjob.slinky.slurm.net/*` from the workload object, so a
typo there would only surface when the first pod is placed, minutes later.
Checking the object (and its pod templates, which become the pods) when it is
applied moves the error to `kubectl apply`.

A workload selects the bridge when one of its pod templates names our
scheduler, or asks for the default one in a managed namespace. A PodGroup has
no template: it is checked in a managed namespace, or whenever it carries
`slurmjob.slinky.slurm.net/*` annotations (nothing but the bridge reads them).
"""

from collections.abc import Callable, Mapping
from typing import Any

from bridge import keys
from webhook.checks import (
    annotation_problems,
    annotation_warnings_of,
    metadata_maps,
    owned_keys_on_create,
    pod_problems,
    tenant_problems,
)
from webhook.policy import AdmissionPolicy, is_bridge_pod

Template = tuple[str, Mapping[str, Any]]  # (path for messages, pod template)
TemplateFinder = Callable[[Mapping[str, Any]], list[Template]]


def _get(obj: Any, *path: str) -> Any:
    for name in path:
        obj = obj.get(name) if isinstance(obj, Mapping) else None
    return obj


def _template(path: str, value: Any) -> list[Template]:
    return [(path, value)] if isinstance(value, Mapping) else []


def job_templates(job: Mapping[str, Any]) -> list[Template]:
    return _template("spec.template.", _get(job, "spec", "template"))


def jobset_templates(jobset: Mapping[str, Any]) -> list[Template]:
    jobs = _get(jobset, "spec", "replicatedJobs")
    found: list[Template] = []
    for index, job in enumerate(jobs if isinstance(jobs, list) else []):
        path = f"spec.replicatedJobs[{index}].template.spec.template."
        found += _template(path, _get(job, "template", "spec", "template"))
    return found


def lws_templates(lws: Mapping[str, Any]) -> list[Template]:
    base = _get(lws, "spec", "leaderWorkerTemplate")
    return _template("spec.leaderWorkerTemplate.leaderTemplate.", _get(base, "leaderTemplate")) + _template(
        "spec.leaderWorkerTemplate.workerTemplate.", _get(base, "workerTemplate")
    )


def no_templates(_: Mapping[str, Any]) -> list[Template]:
    return []


# (API group, resource) → how to find its pod templates.
WORKLOADS: dict[tuple[str, str], TemplateFinder] = {
    ("batch", "jobs"): job_templates,
    ("jobset.x-k8s.io", "jobsets"): jobset_templates,
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): lws_templates,
    ("scheduling.x-k8s.io", "podgroups"): no_templates,  # coscheduling (scheduler-plugins)
    ("scheduling.k8s.io", "podgroups"): no_templates,  # built-in workload-aware scheduling
}


def _bridge_templates(
    find_templates: TemplateFinder,
    obj: Mapping[str, Any],
    annotations: Mapping[str, str],
    *,
    managed: bool,
    policy: AdmissionPolicy,
) -> tuple[bool, list[Template]]:
    """(whether the workload selects the bridge, its pod templates that do)."""
    ours = [(path, t) for path, t in find_templates(obj) if is_bridge_pod(t, managed=managed, policy=policy)]
    if find_templates is no_templates:
        return managed or any(key.startswith(keys.SLURMJOB_PREFIX) for key in annotations), ours
    return bool(ours), ours


def workload_warnings(
    find_templates: TemplateFinder, obj: Mapping[str, Any], *, managed: bool, policy: AdmissionPolicy
) -> list[str]:
    """The admission warnings of a workload the bridge checks: its own annotations and its templates'."""
    _, annotations, problems = metadata_maps(obj)
    if problems:
        return []
    selects, ours = _bridge_templates(find_templates, obj, annotations, managed=managed, policy=policy)
    if not selects:
        return []
    warnings = annotation_warnings_of(obj)
    for path, template in ours:
        warnings += annotation_warnings_of(template, path)
    return warnings


def workload_problems(
    find_templates: TemplateFinder,
    obj: Mapping[str, Any],
    *,
    managed: bool,
    policy: AdmissionPolicy,
    namespace: str = "",
) -> list[str]:
    _, annotations, problems = metadata_maps(obj)
    if problems:
        return problems
    for path, template in find_templates(obj):
        # Pods carrying these would all be refused at creation: say so now.
        problems += owned_keys_on_create(template, policy, where=path)
    selects, ours = _bridge_templates(find_templates, obj, annotations, managed=managed, policy=policy)
    if not selects:
        return problems
    problems += annotation_problems(annotations)[1]
    problems += tenant_problems(annotations, namespace, policy)
    for path, template in ours:
        # nodeName in a template is harmless: /mutate removes it from every pod.
        found = pod_problems(template, policy, where=path, node_name_allowed=True)
        if not found:
            found = tenant_problems(metadata_maps(template, path)[1], namespace, policy, where=path)
        problems += found
    return problems
