"""Heterogeneous jobs: a group whose pods differ becomes one Slurm job per pod shape, started together.

One Slurm job asks every node for the same CPUs, memory and GRES, so a group sized as one
job reserves its largest pod's request on every node: a LeaderWorkerSet whose small leader
sits beside eight 8-GPU workers holds 8 GPUs for the leader too, and waits for nodes it does
not need. Slurm's heterogeneous jobs (`POST /job/submit` with `jobs: [...]`, every component
an EXTERNAL_JOB) give each shape its own node count and sizes; the components are scheduled
together, all or none, as a group must be.

A pod's shape is what decides where it may run and what it needs: its per-node CPUs, memory
and GRES as the translation computes them, and its node rules (nodeSelector, required node
affinity, tolerations). Pods of one shape form one component; components that need GRES or
have node rules come first, because Slurm picks nodes component by component; pod i of the
job (in component order) takes node i of the components' allocations, read in order.

The group stays one ordinary job when:
- its pods are all of one shape (nothing to gain), or it is a single pod;
- sizing is "largest-pod" (the `slurm-bridge/sizing` annotation on the workload, else the
  worker's HETEROGENEOUS_JOBS setting): for sites whose Slurm policy refuses heterogeneous jobs;
- an annotation sizes the nodes or counts them (cpu-per-task, mem-per-node, gres, min-nodes,
  max-nodes): the user asked for one size on every node;
- a pod asks for DRA devices: their claims are pinned to one job's device layout (bridge/dra.py).
"""

import json
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Literal, TypeVar

from bridge import keys
from bridge.annotations import AnnotationError, parse_job_annotations
from bridge.device_classes import DeviceClasses
from bridge.quantity import mebibytes, whole_cpus
from bridge.resources import Pod, PodSpecError, dra_classes_of, group_resources

Sizing = Literal["per-pod", "largest-pod"]
P = TypeVar("P", bound=Pod)
SIZINGS: tuple[Sizing, ...] = ("per-pod", "largest-pod")


class SizingError(ValueError):
    """A `slurm-bridge/sizing` annotation the bridge cannot read; the message says what it takes."""


def sizing_of(annotations: Mapping[str, str] | None, default: Sizing) -> Sizing:
    """The sizing the workload asks for (its annotation), else the installation's default."""
    value = (annotations or {}).get(keys.ANNOTATION_SIZING)
    if value is None:
        return default
    for sizing in SIZINGS:
        if value.strip() == sizing:
            return sizing
    raise SizingError(
        f'annotation {keys.ANNOTATION_SIZING}: "{value}" is neither "per-pod" (a heterogeneous job, '
        'one component per pod shape) nor "largest-pod" (one job, every node sized by the largest pod)'
    )


def _node_rules(pod: Pod) -> str:
    """The pod's own node rules. Not what binding adds to it (nodeName, the managed-node
    toleration): a placement read again after binding (a reset, an adoption, `explain` of a
    running group) must find the components it submitted."""
    spec = pod.get("spec") or {}
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    tolerations = [
        t
        for t in spec.get("tolerations") or []
        if not (isinstance(t, Mapping) and t.get("key") == keys.TAINT_MANAGED_NODE)
    ]
    rules = {
        "nodeSelector": spec.get("nodeSelector") or {},
        "required": affinity.get("requiredDuringSchedulingIgnoredDuringExecution"),
        "tolerations": tolerations,
    }
    return json.dumps(rules, sort_keys=True, default=str)


def _constrained_first(shape: tuple[int, int, str, str]) -> tuple[int, int]:
    """Components that need GRES, then those with node rules, before the rest.

    Slurm picks nodes component by component, in offset order: a CPU-only component placed
    first may take the GPU nodes the next one needs, and the job never starts on a cluster
    that fits it (seen on Slurm 26.05 with whole-node components). Ties keep the group's order.
    """
    _, _, tres, rules = shape
    selective = json.loads(rules)
    return (0 if tres else 1, 0 if selective["nodeSelector"] or selective["required"] else 1)


def pod_shape(pod: Pod, devices: DeviceClasses) -> tuple[int, int, str, str]:
    """What one node must give this pod, in the units a job asks in, and where it may run."""
    per_node = group_resources([pod])
    cpus = whole_cpus(devices.cpus(per_node))
    memory = mebibytes(per_node["memory"]) if per_node.get("memory", Fraction(0)) > 0 else 0
    return cpus, memory, devices.tres_per_node(per_node) or "", _node_rules(pod)


def _sizes_nodes_itself(annotations: Mapping[str, str] | None) -> bool:
    try:
        asked = parse_job_annotations(annotations)
    except AnnotationError:
        return True  # the translation reports it; one job is what it would have been
    sizes = (asked.cpu_per_task, asked.mem_per_node_mib, asked.gres, asked.min_nodes, asked.max_nodes)
    return any(value is not None for value in sizes)


def split_by_shape(
    pods: Sequence[P],
    annotations: Mapping[str, str] | None,
    *,
    sizing: Sizing,
    devices: DeviceClasses,
) -> list[list[P]]:
    """The group's components: one list of pods per shape, or the whole group as one (module docstring).

    Pods keep their order within a component. Components that need GRES come first, then those
    with node rules, then the rest, each kind in the order its shapes first appear (see
    `_constrained_first`). A pod whose spec cannot be read keeps the group whole: the
    translation refuses it.
    """
    whole = [list(pods)]
    if sizing != "per-pod" or len(pods) < 2 or _sizes_nodes_itself(annotations):
        return whole
    if any(dra_classes_of(pod) for pod in pods):
        return whole
    parts: dict[tuple[int, int, str, str], list[P]] = {}
    try:
        for pod in pods:
            parts.setdefault(pod_shape(pod, devices), []).append(pod)
    except PodSpecError:
        return whole
    if len(parts) < 2:
        return whole
    return [parts[shape] for shape in sorted(parts, key=_constrained_first)]


def component_summary(sizes: Sequence[int]) -> str:
    """`2 components: 1 + 8 pods`, for Events and logs (`sizes`: each component's pods)."""
    return f"{len(sizes)} components: {' + '.join(str(size) for size in sizes)} pods"
