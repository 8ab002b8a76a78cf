"""What a pod asks for, computed the way Kubernetes computes it.

Pods are plain JSON dicts as the API server serves them (camelCase), so this
module works the same for the worker, the webhook and `explain` without any
client library. The effective request of a pod follows the kubelet's rules:
regular containers and restartable init containers ("sidecars") run together,
each plain init container runs alone (beside the sidecars started before it),
pod overhead is added, and pod-level `spec.resources` wins where set.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from bridge import keys
from bridge.quantity import QuantityError, parse_quantity

Pod = Mapping[str, Any]
ResourceList = dict[str, Fraction]

DRA_CPU = keys.DRA_RESOURCE_PREFIX + keys.DRA_CPU_CLASS


class PodSpecError(ValueError):
    """A pod the bridge cannot place; `problems` are user-facing sentences."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


def _resource_list(raw: Mapping[str, Any] | None, where: str, problems: list[str]) -> ResourceList:
    parsed: ResourceList = {}
    for name, value in (raw or {}).items():
        try:
            parsed[name] = parse_quantity(str(value))
        except QuantityError as error:
            problems.append(f"{where} {name}: {error}")
    return parsed


def _add(total: ResourceList, more: ResourceList) -> ResourceList:
    return {name: total.get(name, Fraction(0)) + more.get(name, Fraction(0)) for name in {*total, *more}}


def _max(a: ResourceList, b: ResourceList) -> ResourceList:
    return {name: max(a.get(name, Fraction(0)), b.get(name, Fraction(0))) for name in {*a, *b}}


def _containers(spec: Mapping[str, Any], kind: str) -> list[Mapping[str, Any]]:
    return [c for c in spec.get(kind) or [] if isinstance(c, Mapping)]


@dataclass
class PodResources:
    """Effective requests and limits of one pod (absent resources are zero)."""

    requests: ResourceList = field(default_factory=dict)
    limits: ResourceList = field(default_factory=dict)


def _effective(spec: Mapping[str, Any], which: str, problems: list[str]) -> ResourceList:
    def of(container: Mapping[str, Any]) -> ResourceList:
        resources = container.get("resources") or {}
        values = _resource_list(
            resources.get(which), f'container "{container.get("name")}" {which}', problems
        )
        if which == "requests":
            # An unset request defaults to the limit, as the API server does.
            limits = _resource_list(resources.get("limits"), "", [])
            values = {**limits, **values}
        return values

    regular: ResourceList = {}
    for container in _containers(spec, "containers"):
        regular = _add(regular, of(container))
    sidecars: ResourceList = {}
    init_peak: ResourceList = {}
    for container in _containers(spec, "initContainers"):
        if container.get("restartPolicy") == "Always":
            sidecars = _add(sidecars, of(container))
            init_peak = _max(init_peak, sidecars)
        else:
            init_peak = _max(init_peak, _add(sidecars, of(container)))
    total = _max(_add(regular, sidecars), init_peak)
    total = _add(total, _resource_list(spec.get("overhead"), "spec.overhead", problems))
    pod_level = _resource_list((spec.get("resources") or {}).get(which), f"spec.resources.{which}", problems)
    return {**total, **pod_level}


def pod_resources(pod: Pod) -> PodResources:
    problems: list[str] = []
    spec = pod.get("spec") or {}
    result = PodResources(_effective(spec, "requests", problems), _effective(spec, "limits", problems))
    if problems:
        raise PodSpecError(problems)
    return result


def _all_resource_names(spec: Mapping[str, Any]) -> Iterable[tuple[str, str]]:
    """(container name, resource name) for every request and limit, init containers included."""
    for kind in ("initContainers", "containers"):
        for container in _containers(spec, kind):
            resources = container.get("resources") or {}
            for which in ("requests", "limits"):
                for name in resources.get(which) or {}:
                    yield str(container.get("name")), name
    for which in ("requests", "limits"):
        for name in (spec.get("resources") or {}).get(which) or {}:
            yield "(pod-level spec.resources)", name


def placement_problems(pod: Pod) -> list[str]:
    """Why the bridge cannot place this pod at all; empty when it can.

    Shared by the admission webhook (denial messages) and the translation, so a
    pod the webhook lets through is one the worker can submit.
    """
    spec = pod.get("spec") or {}
    problems: list[str] = []
    if spec.get("topologySpreadConstraints"):
        problems.append(
            "spec.topologySpreadConstraints is not supported: Slurm decides placement; "
            "remove it, or use slurmjob.slinky.slurm.net/constraints for node features"
        )
    if spec.get("resourceClaims"):
        problems.append(
            "spec.resourceClaims is not supported: request devices through container resources "
            "(nvidia.com/gpu) or the annotation slurmjob.slinky.slurm.net/gres"
        )
    names = list(_all_resource_names(spec))
    if any(r == "cpu" for _, r in names) and any(r == DRA_CPU for _, r in names):
        problems.append(
            f'"cpu" and "{DRA_CPU}" cannot both be requested: use one of them for every container'
        )
    for container, resource in names:
        if resource.startswith(keys.DRA_RESOURCE_PREFIX):
            device_class = resource.removeprefix(keys.DRA_RESOURCE_PREFIX)
            if device_class not in keys.SUPPORTED_DRA_CLASSES:
                supported = ", ".join(sorted(keys.SUPPORTED_DRA_CLASSES))
                problems.append(
                    f'container "{container}" uses unsupported DRA device class "{device_class}" '
                    f"(supported: {supported})"
                )
    try:
        pod_resources(pod)
    except PodSpecError as error:
        problems.extend(error.problems)
    return list(dict.fromkeys(problems))
