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
from bridge.device_classes import DEFAULT_DEVICE_CLASSES, DeviceClasses
from bridge.dra import dra_problems
from bridge.quantity import QuantityError, parse_quantity

Pod = Mapping[str, Any]
ResourceList = dict[str, Fraction]

# The default CPU class's resource name (bridge.device_classes has the honoured ones).
DRA_CPU = keys.DRA_RESOURCE_PREFIX + keys.DRA_CPU_CLASS


class PodSpecError(ValueError):
    """A pod the bridge cannot place; `problems` are user-facing sentences."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


def _object(value: Any, where: str, problems: list[str]) -> Mapping[str, Any]:
    """`value` when it is a JSON object; otherwise {} and, unless it is null, a problem.

    Pods normally come from the API server, already schema-checked, but the
    webhook's mutating phase and tests see objects before that: a wrong type
    must become a problem, never an AttributeError.
    """
    if isinstance(value, Mapping):
        return value
    if value is not None:
        problems.append(f"{where} must be an object, not {type(value).__name__}")
    return {}


def _resource_list(raw: Any, where: str, problems: list[str]) -> ResourceList:
    parsed: ResourceList = {}
    for name, value in _object(raw, where.strip() or "resources", problems).items():
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
    listed = spec.get(kind)
    return [c for c in listed if isinstance(c, Mapping)] if isinstance(listed, list) else []


@dataclass
class PodResources:
    """Effective requests and limits of one pod (absent resources are zero)."""

    requests: ResourceList = field(default_factory=dict)
    limits: ResourceList = field(default_factory=dict)


def _effective(spec: Mapping[str, Any], which: str, problems: list[str]) -> ResourceList:
    def of(container: Mapping[str, Any]) -> ResourceList:
        where = f'container "{container.get("name")}"'
        resources = _object(container.get("resources"), f"{where} resources", problems)
        values = _resource_list(resources.get(which), f"{where} {which}", problems)
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
    pod_resources = _object(spec.get("resources"), "spec.resources", problems)
    pod_level = _resource_list(pod_resources.get(which), f"spec.resources.{which}", problems)
    return {**total, **pod_level}


def pod_resources(pod: Pod) -> PodResources:
    problems: list[str] = []
    spec = _object(pod.get("spec"), "spec", problems)
    result = PodResources(_effective(spec, "requests", problems), _effective(spec, "limits", problems))
    if problems:
        # Requests and limits walk the same fields: report each problem once.
        raise PodSpecError(list(dict.fromkeys(problems)))
    return result


def group_resources(pods: Iterable[Pod]) -> ResourceList:
    """What one node must offer to run any pod of a group: per resource, the group's largest.

    Each pod counts with the larger of its effective request and limit, and every
    resource (cpu, memory, each GPU vendor, each DRA device class, any other
    extended resource) takes its maximum over the pods independently: a group of
    a 2-GPU, 1-CPU pod and a 1-GPU, 8-CPU pod needs 2 GPUs and 8 CPUs per node.
    Raises PodSpecError, naming the pod, when a pod's resources do not parse.
    """
    largest: ResourceList = {}
    for pod in pods:
        try:
            resources = pod_resources(pod)
        except PodSpecError as error:
            meta = _object(pod.get("metadata"), "", [])
            where = f"pod {meta.get('namespace')}/{meta.get('name')}"
            raise PodSpecError([f"{where}: {p}" for p in error.problems]) from error
        largest = _max(largest, _max(resources.requests, resources.limits))
    return largest


def _all_resource_names(spec: Mapping[str, Any]) -> Iterable[tuple[str, str]]:
    """(container name, resource name) for every request and limit, init containers included."""
    ignored: list[str] = []  # wrong types are reported by pod_resources()
    for kind in ("initContainers", "containers"):
        for container in _containers(spec, kind):
            resources = _object(container.get("resources"), "", ignored)
            for which in ("requests", "limits"):
                for name in _object(resources.get(which), "", ignored):
                    yield str(container.get("name")), name
    for which in ("requests", "limits"):
        for name in _object(_object(spec.get("resources"), "", ignored).get(which), "", ignored):
            yield "(pod-level spec.resources)", name


def dra_classes_of(pod: Pod) -> list[str]:
    """The DeviceClasses the pod asks for by extended-resource name, anywhere, in name order."""
    spec = _object(pod.get("spec"), "spec", [])
    return sorted(
        {
            r.removeprefix(keys.DRA_RESOURCE_PREFIX)
            for _, r in _all_resource_names(spec)
            if r.startswith(keys.DRA_RESOURCE_PREFIX)
        }
    )


def placement_problems(pod: Pod, honoured: DeviceClasses = DEFAULT_DEVICE_CLASSES) -> list[str]:
    """Why the bridge cannot place this pod at all; empty when it can.

    Shared by the admission webhook (denial messages) and the translation, so a
    pod the webhook lets through is one the worker can submit. `honoured` are the
    DRA classes the bridge honours (DRA_DEVICE_CLASSES).
    """
    problems: list[str] = []
    spec = _object(pod.get("spec"), "spec", [])  # pod_resources() below reports a wrong type
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
    # A node's CPUs are counted once (cpus_per_task): by "cpu" or by one CPU class.
    cpu_names = sorted({r for _, r in names if r == "cpu" or r in honoured.cpu_resources})
    if len(cpu_names) > 1:
        together = "cannot both be requested" if len(cpu_names) == 2 else "cannot be requested together"
        problems.append(
            " and ".join(f'"{n}"' for n in cpu_names) + f" {together}: use one of them for every container"
        )
    for container, resource in names:
        if resource.startswith(keys.DRA_RESOURCE_PREFIX) and honoured.of_resource(resource) is None:
            device_class = resource.removeprefix(keys.DRA_RESOURCE_PREFIX)
            problems.append(
                f'container "{container}" uses unsupported DRA device class "{device_class}" '
                f"(supported: {honoured.honoured()})"
            )
    problems += dra_problems(pod, honoured)
    try:
        pod_resources(pod)
    except PodSpecError as error:
        problems.extend(error.problems)
    return list(dict.fromkeys(problems))


@dataclass(frozen=True)
class Capacity:
    """What a set of Kubernetes nodes have together: their count and summed `status.allocatable`."""

    nodes: int
    allocatable: ResourceList


def total_allocatable(nodes: Iterable[Mapping[str, Any]]) -> Capacity:
    """The nodes' `status.allocatable`, added up resource by resource.

    A quantity that does not parse counts as nothing (the API server validated it;
    a fake or a partial object must not break a placement).
    """
    total: ResourceList = {}
    count = 0
    for node in nodes:
        count += 1
        status = _object(node.get("status"), "", [])
        for name, value in _object(status.get("allocatable"), "", []).items():
            try:
                total[name] = total.get(name, Fraction(0)) + parse_quantity(str(value))
            except QuantityError:
                continue
    return Capacity(count, total)
