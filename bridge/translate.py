"""Pods (and the workload that owns them) → the Slurm external job that represents them.

Pure: the caller reads the pods and owners, this decides the job. The order of
precedence is upstream's: derived from the workload shape, then from the pods'
resources, then annotations override everything.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeVar

from bridge import keys
from bridge.annotations import AnnotationError, JobAnnotations, parse_job_annotations
from bridge.components import Sizing
from bridge.device_classes import DEFAULT_DEVICE_CLASSES, DeviceClasses
from bridge.models import JobDescription, NoValNumber, admin_comment_for
from bridge.policy import PolicySet
from bridge.quantity import MIB, QuantityError, mebibytes, parse_quantity, whole_cpus
from bridge.resources import (
    DRA_CPU,
    Capacity,
    Pod,
    PodSpecError,
    group_resources,
    placement_problems,
)

T = TypeVar("T")
U = TypeVar("U")


class TranslationError(ValueError):
    """The pods cannot become a Slurm job; the message says why and how to fix it."""


@dataclass(frozen=True)
class Defaults:
    """Deployment-wide settings the translation needs."""

    partition: str = keys.DEFAULT_PARTITION
    mcs_label: str = keys.DEFAULT_MCS_LABEL
    # DRA_DEVICE_CLASSES: the DRA classes pods may ask for and what each is in Slurm.
    device_classes: DeviceClasses = DEFAULT_DEVICE_CLASSES
    # HETEROGENEOUS_JOBS: how a group whose pods differ is sized, unless it says (bridge/components.py).
    sizing: Sizing = "per-pod"


@dataclass(frozen=True)
class GroupShape:
    """What the owning workload says about the job before resources and annotations."""

    name: str
    min_nodes: int | None = None
    max_nodes: int | None = None
    time_limit_minutes: int | None = None
    # A coscheduling PodGroup's spec.minResources, (name, quantity) as written: what the whole
    # group needs together, as scheduler-plugins reads it. It never sizes a node (each node is
    # sized by the group's largest pod); `build_job` refuses a group whose total all the
    # bridge's nodes together cannot hold.
    min_resources: tuple[tuple[str, str], ...] = ()


def pod_key(pod: Pod) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _gpus(resources: Mapping[str, Fraction]) -> Fraction:
    """The GPUs in a resource list: device-plugin GPUs and DRA GPU classes, the largest count."""
    counts = [
        quantity
        for name, quantity in resources.items()
        if name in keys.GPU_RESOURCES or (name.startswith(keys.DRA_RESOURCE_PREFIX) and name != DRA_CPU)
    ]
    return max(counts, default=Fraction(0))


def _no_val(number: int | None) -> NoValNumber | None:
    return NoValNumber(number=number) if number is not None else None


def _given(override: T | None, derived: U) -> T | U:
    """The annotation's value when the annotation is there, whatever it is; else the derived one."""
    return override if override is not None else derived


def _shown(quantity: Fraction) -> str:
    """A quantity as a person writes it: 16Gi, 512Mi, 8, 1.5."""
    for suffix, unit in (("Gi", 2**30), ("Mi", MIB)):
        if quantity >= unit and quantity % unit == 0:
            return f"{quantity // unit}{suffix}"
    return str(quantity.numerator) if quantity.denominator == 1 else f"{float(quantity):g}"


def min_resources_problems(shape: GroupShape, capacity: Capacity) -> list[str]:
    """Why the group's spec.minResources can never be met on the bridge's nodes; empty when it can.

    scheduler-plugins' coscheduling admits a group only while the cluster has its
    minResources free; whether nodes are free is Slurm's to judge here, so the bridge
    refuses only what no state of the cluster could meet: more than all its nodes have
    together. Devices requested through DRA classes are not in a node's allocatable
    (they are in ResourceSlices) and are not judged.
    """
    problems = []
    for name, text in shape.min_resources:
        if name.startswith(keys.DRA_RESOURCE_PREFIX):
            continue
        try:
            wanted = parse_quantity(text)
        except QuantityError:  # pragma: no cover - grouping refused it already
            continue
        have = capacity.allocatable.get(name, Fraction(0))
        if wanted > have:
            problems.append(
                f"the PodGroup's spec.minResources asks for {name} {text} for the whole group, more than all "
                f"{capacity.nodes} of the bridge's nodes have together ({_shown(have)} in their "
                "status.allocatable); lower spec.minResources or add nodes"
            )
    return problems


def build_job(
    pods: Sequence[Pod],
    *,
    annotations: Mapping[str, str] | None,
    shape: GroupShape,
    defaults: Defaults,
    excluded_nodes: Sequence[str] | None = None,
    policy: PolicySet | None = None,
    capacity: Capacity | None = None,
) -> JobDescription:
    """The job_desc_msg for a group of pods placed together, one pod per node.

    Per-node CPUs, memory and GPUs are the largest any pod of the group asks
    for, each resource on its own (`bridge.resources.group_resources`), so
    whichever pod lands on a node fits there; nothing else sizes a node.
    `excluded_nodes` are Slurm node names the job must avoid
    (`bridge.feasibility.excluded_slurm_nodes`). `policy` is the tenant policy
    (`bridge.policy`) of the pods' namespace: its violations are problems, its
    defaults fill what the annotations leave out. `capacity` is what all the
    bridge's nodes have together, when they are known: a PodGroup whose
    spec.minResources exceed it is refused (`min_resources_problems`).
    """
    if not pods:
        raise TranslationError(f"{shape.name}: no pods to place")
    problems: list[str] = []
    for pod in pods:
        problems += [f"pod {pod_key(pod)}: {p}" for p in placement_problems(pod, defaults.device_classes)]
    try:
        overrides = parse_job_annotations(annotations)
    except AnnotationError as error:
        problems += [str(p) for p in error.problems]
        overrides = JobAnnotations()
    else:
        if policy is not None:
            namespace = str((pods[0].get("metadata") or {}).get("namespace") or "")
            problems += policy.check(namespace, overrides, fallback_partition=defaults.partition)
            overrides = policy.apply_defaults(namespace, overrides)
    if capacity is not None:
        problems += min_resources_problems(shape, capacity)
    if problems:
        raise TranslationError("; ".join(problems))

    try:
        per_node = group_resources(pods)
    except PodSpecError as error:  # pragma: no cover - placement_problems reported it already
        raise TranslationError(str(error)) from error
    devices = defaults.device_classes
    gres_problems = devices.gres_problems(per_node)
    if gres_problems:
        raise TranslationError(f"{shape.name}: " + "; ".join(gres_problems))
    # Unset when no pod asks: Slurm then applies the partition's defaults, as upstream.
    largest_cpus = whole_cpus(devices.cpus(per_node))
    cpus = largest_cpus if largest_cpus > 0 else None
    memory = mebibytes(per_node["memory"]) if per_node.get("memory", Fraction(0)) > 0 else None
    # Per GRES the largest count: DRA classes as DRA_DEVICE_CLASSES maps them (GPUs untyped by
    # default, which matches the untyped GPUs node sync registers), device-plugin GPUs as gres/gpu.
    # Which devices each pod gets is the claim's business (bridge.dra), pinned to Slurm's indexes.
    gres = devices.tres_per_node(per_node)

    # An annotation overrides whenever it is present, zero and empty included: upstream
    # sends those values as they are (cpu-per-task 0, mem-per-node 0 = the whole node's
    # memory, gres "" = no GRES, min-nodes 0).
    count = len(pods)
    min_nodes = _given(overrides.min_nodes, shape.min_nodes or count)
    max_nodes = _given(overrides.max_nodes, shape.max_nodes or count)
    if overrides.time_limit_infinite:
        time_limit: NoValNumber | None = NoValNumber(infinite=True)
    else:
        time_limit = _no_val(_given(overrides.time_limit_minutes, shape.time_limit_minutes))
    if min_nodes > max_nodes:
        raise TranslationError(
            f"{shape.name}: minimum nodes ({min_nodes}) exceed maximum nodes ({max_nodes}); "
            f"check the {keys.SLURMJOB_PREFIX}min-nodes and max-nodes annotations"
        )
    return JobDescription(
        name=_given(overrides.job_name, shape.name),
        flags=[keys.EXTERNAL_JOB_FLAG],
        admin_comment=admin_comment_for([pod_key(p) for p in pods]),
        partition=overrides.partition or defaults.partition,
        nodes=str(count),
        minimum_nodes=min_nodes,
        maximum_nodes=max_nodes,
        tasks_per_node=1,
        cpus_per_task=_given(overrides.cpu_per_task, cpus),
        memory_per_node=_no_val(_given(overrides.mem_per_node_mib, memory)),
        tres_per_node=_given(overrides.gres, gres) or None,
        shared=[] if overrides.exclusive is False else ["none"],
        mcs_label=defaults.mcs_label or None,
        account=overrides.account,
        constraints=overrides.constraints,
        group_id=overrides.group_id,
        user_id=overrides.user_id,
        licenses=overrides.licenses,
        priority=_no_val(overrides.priority),
        qos=overrides.qos,
        reservation=overrides.reservation,
        time_limit=time_limit,
        wckey=overrides.wckey,
        excluded_nodes=sorted(set(excluded_nodes or ())) or None,
    )


def build_parts_job(
    parts: Sequence[tuple[Sequence[Pod], Sequence[str] | None]],
    *,
    annotations: Mapping[str, str] | None,
    shape: GroupShape,
    defaults: Defaults,
    policy: PolicySet | None = None,
    capacity: Capacity | None = None,
) -> JobDescription:
    """The job of a group split by `bridge.components.split_by_shape`: one part is an ordinary
    job (`build_job`); more make a heterogeneous job, one component per part, each sized by its pods.

    `parts`: the pods of each component, with the Slurm nodes that component must avoid (each
    part has its own node rules). Each component is what `build_job` makes of its pods alone,
    with exactly one node per pod; the annotations and the tenant policy apply to every one.
    The description returned stands for the whole group: its admin_comment lists every pod in
    component order (pod i takes node i of the components' allocations, read in order).
    """
    if len(parts) == 1:
        [(pods, excluded)] = parts
        return build_job(
            pods,
            annotations=annotations,
            shape=shape,
            defaults=defaults,
            excluded_nodes=excluded,
            policy=policy,
            capacity=capacity,
        )
    if capacity is not None and (problems := min_resources_problems(shape, capacity)):
        raise TranslationError("; ".join(problems))
    per_component = GroupShape(name=shape.name, time_limit_minutes=shape.time_limit_minutes)
    components = [
        build_job(
            pods,
            annotations=annotations,
            shape=per_component,
            defaults=defaults,
            excluded_nodes=excluded,
            policy=policy,
        )
        for pods, excluded in parts
    ]
    keys_in_order = [key for component in components for key in component.pod_keys]
    first = components[0]
    return first.model_copy(
        update={
            "admin_comment": admin_comment_for(keys_in_order),
            "nodes": str(len(keys_in_order)),
            "minimum_nodes": len(keys_in_order),
            "maximum_nodes": len(keys_in_order),
            "cpus_per_task": None,
            "memory_per_node": None,
            "tres_per_node": None,
            "excluded_nodes": None,
            "components": components,
        }
    )


def _counted(quantity: Fraction, unit: str) -> str:
    """8 CPUs, 1 GPU, 2.5 CPUs."""
    return f"{_shown(quantity)} {unit}{'' if quantity == 1 else 's'}"


def sizing_note(pods: Sequence[Pod], job: JobDescription, job_label: str) -> str | None:
    """What sizing every node by the group's largest pod costs, when the pods ask for different
    amounts; None when each pod gets what it asks for (or a single pod, or equal pods).

    A Slurm job asks every node for the same thing, so a pod asking less than the largest is
    given more than it asked for. Only resources the largest pod sized are told: one an
    annotation sets (cpu-per-task, mem-per-node, gres) is the user's own choice. `job_label`
    names the job in the message ("Slurm job 42", "the job").
    """
    if len(pods) < 2:
        return None
    try:
        asks = [group_resources([pod]) for pod in pods]
    except PodSpecError:  # pragma: no cover - build_job refused such pods already
        return None
    count = len(pods)
    cpus = [max(a.get("cpu", Fraction(0)), a.get(DRA_CPU, Fraction(0))) for a in asks]
    memory = [a.get("memory", Fraction(0)) for a in asks]
    gpus = [_gpus(a) for a in asks]
    per_node: list[str] = []
    held: list[str] = []
    asked: list[str] = []
    largest_cpus = Fraction(whole_cpus(max(cpus)))
    # Compared in the units a node is sized in: whole CPUs, MiB.
    if len({whole_cpus(c) for c in cpus}) > 1 and job.cpus_per_task == largest_cpus:
        per_node.append(_counted(largest_cpus, "CPU"))
        held.append(_counted(largest_cpus * count, "CPU"))
        asked.append(_counted(sum(cpus, Fraction(0)), "CPU"))
    largest_memory = Fraction(mebibytes(max(memory)) * MIB)
    sized = job.memory_per_node is not None and job.memory_per_node.number * MIB == largest_memory
    if len({mebibytes(m) for m in memory}) > 1 and sized:
        per_node.append(f"{_shown(largest_memory)} memory")
        held.append(f"{_shown(largest_memory * count)} memory")
        asked.append(f"{_shown(Fraction(sum(mebibytes(m) for m in memory) * MIB))} memory")
    largest_gpus = max(gpus)
    if len(set(gpus)) > 1 and job.tres_per_node == f"gres/gpu={whole_cpus(largest_gpus)}":
        per_node.append(_counted(largest_gpus, "GPU"))
        held.append(_counted(largest_gpus * count, "GPU"))
        asked.append(_counted(sum(gpus, Fraction(0)), "GPU"))
    if not per_node:
        return None
    return (
        f"every node of {job_label} is asked for {', '.join(per_node)}: the group's largest pod; "
        f"pods asking less are given more (the job holds {', '.join(held)} on its {count} nodes, "
        f"for pods that ask for {', '.join(asked)} in all). Give the group's pods equal requests "
        "to avoid it"
    )


def build_pod_job(
    pod: Mapping[str, Any],
    *,
    defaults: Defaults,
    excluded_nodes: Sequence[str] | None = None,
    policy: PolicySet | None = None,
) -> JobDescription:
    """A bare pod (no supported owning workload): its own annotations, one node."""
    meta = pod.get("metadata") or {}
    return build_job(
        [pod],
        annotations=meta.get("annotations"),
        shape=GroupShape(name=pod_key(pod)),
        defaults=defaults,
        excluded_nodes=excluded_nodes,
        policy=policy,
    )
