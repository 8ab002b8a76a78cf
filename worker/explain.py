"""`slurm-bridge explain`: the Slurm job each group of pods would become, without Slurm or Temporal.

The same code as the worker: `bridge.grouping.resolve` through a Reader over the
given objects instead of the API server, `bridge.feasibility` over the bridge's
nodes (read from Kubernetes for `namespace/pod`; the Node objects of the input
otherwise) for `excluded_nodes`, then `bridge.translate.build_job` with the same
tenant policy: the job_desc_msg printed is the one the worker submits.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from bridge import grouping
from bridge.components import SizingError, sizing_of, split_by_shape
from bridge.device_classes import DEFAULT_DEVICE_CLASSES, DeviceClasses
from bridge.dra import device_requests
from bridge.feasibility import excluded_slurm_nodes, group_feasibility, is_bridge_node
from bridge.grouping import Json, Kind
from bridge.keys import ANNOTATION_PLACEMENT, DEFAULT_SCHEDULER_NAME
from bridge.models import GENERATION_SEPARATOR, PLACEMENT_ID_PREFIX
from bridge.policy import PolicySet
from bridge.resources import total_allocatable
from bridge.translate import Defaults, GroupShape, TranslationError, build_parts_job, sizing_note


class ExplainError(ValueError):
    """Input that cannot be explained; the message names the object and field."""


def load_objects(text: str, source: str = "input") -> list[Json]:
    """Kubernetes objects from YAML or JSON, multi-document, `kind: List` unpacked."""
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "unreadable"
        raise ExplainError(f"{source}: not YAML or JSON: {problem}{where}") from None
    objects: list[Json] = []
    for number, document in enumerate(documents, 1):
        if document is None:
            continue
        if not isinstance(document, dict):
            raise ExplainError(f"{source}: document {number} is not an object")
        items = document.get("items") if str(document.get("kind", "")).endswith("List") else [document]
        for obj in items or []:
            _check(obj, f"{source}: document {number}")
            objects.append(obj)
    return objects


def _check(obj: Any, where: str) -> None:
    if not isinstance(obj, dict) or not obj.get("kind") or not obj.get("apiVersion"):
        raise ExplainError(f"{where}: every object needs apiVersion and kind")
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not meta.get("name"):
        raise ExplainError(f"{where}: {obj['kind']} has no metadata.name")


def _identify(obj: Json, default_namespace: str) -> Json:
    """Give file objects what the API server would: a namespace and a uid to match owner references by."""
    meta = obj.setdefault("metadata", {})
    meta.setdefault("namespace", default_namespace)
    meta.setdefault("uid", f"explain:{obj['kind']}/{meta['namespace']}/{meta['name']}")
    return obj


class MemoryReader:
    """grouping.Reader over objects from a file."""

    def __init__(self, objects: Iterable[Json]) -> None:
        self.objects = list(objects)

    async def get(self, kind: Kind, namespace: str, name: str) -> Json | None:
        for obj in self.objects:
            meta = obj["metadata"]
            if (obj["apiVersion"].rpartition("/")[0], obj["kind"]) == (kind.group, kind.kind) and (
                meta.get("namespace"),
                meta.get("name"),
            ) == (namespace, name):
                return obj
        return None

    async def list_pods(self, namespace: str, label_selector: str) -> list[Json]:
        return [p for p in self.pods() if p["metadata"].get("namespace") == namespace]

    def pods(self) -> list[Json]:
        return [o for o in self.objects if o["kind"] == "Pod" and o["apiVersion"] == "v1"]


@dataclass(frozen=True)
class Explanation:
    group: str
    kind: str
    pods: list[str]
    job_desc_msg: dict[str, object]
    # The worker submits only once this many pods of the group exist.
    min_pods: int = 1
    # Why the worker would not submit the job (no bridge node passes the pods' node rules), if so.
    unschedulable: str | None = None
    # DRA extended-resource requests: what Slurm is asked for, and the claim request each becomes.
    dra_devices: list[dict[str, object]] = field(default_factory=list)
    # When the group's pods ask for different amounts: every node is sized by the largest pod,
    # and what that costs (the worker tells the pods the same in a SizedByLargestPod Event).
    sizing_note: str | None = None


def dra_devices(
    pods: Iterable[Json], honoured: DeviceClasses = DEFAULT_DEVICE_CLASSES
) -> list[dict[str, object]]:
    """Per DRA request: the pod, container, resource, count, the claim's request name and the Slurm side.

    GPU classes are counted in the job's `tres_per_node` (gres/gpu), `dra.cpu` in
    `cpus_per_task`; at binding the claim names the devices Slurm allocated (docs/dra.md).
    """
    rows: list[dict[str, object]] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        for request in device_requests(pod, honoured):
            rows.append(
                {
                    "pod": f"{meta.get('namespace')}/{meta.get('name')}",
                    "container": request.container,
                    "resource": request.resource,
                    "count": request.count,
                    "claim_request": request.request,
                    "slurm": request.slurm,
                }
            )
    return rows


async def explain(
    objects: list[Json],
    defaults: Defaults,
    namespace: str = "default",
    installation: str = "slurm-bridge",
    policy: PolicySet | None = None,
    scheduler_name: str = DEFAULT_SCHEDULER_NAME,
) -> list[Explanation]:
    """The jobs of the pods in `objects`; Node objects among them stand for the cluster's nodes."""
    reader = MemoryReader(_identify(obj, namespace) for obj in objects)
    nodes = [
        o
        for o in objects
        if o["kind"] == "Node" and o["apiVersion"] == "v1" and is_bridge_node(o, scheduler_name)
    ]
    pods = reader.pods()
    if not pods:
        raise ExplainError("no Pod objects in the input: give the pods together with their owners")
    groups: dict[str, tuple[grouping.Group, list[Json]]] = {}
    for pod in pods:
        where = f"Pod {pod['metadata']['namespace']}/{pod['metadata']['name']}"
        try:
            group = await grouping.resolve(reader, pod)
        except grouping.GroupError as error:
            raise ExplainError(f"{where}: {error}") from None
        groups.setdefault(group.key, (group, []))[1].append(pod)
    explanations = []
    for group, members in groups.values():
        try:
            explanations.append(_explanation(group, members, defaults, nodes, installation, policy))
        except TranslationError as error:
            raise ExplainError(f"{group.kind} {group.name}: {error}") from None
    return explanations


def _explanation(
    group: grouping.Group,
    members: list[Json],
    defaults: Defaults,
    nodes: Sequence[Json],
    installation: str,
    policy: PolicySet | None,
) -> Explanation:
    """As `prepare_and_submit` builds it: node rules → excluded_nodes, translation, placement id."""
    ordered = grouping.in_order(members)
    try:
        sizing = sizing_of(group.annotations, defaults.sizing)
    except SizingError as error:
        raise TranslationError(str(error)) from None
    parts = split_by_shape(ordered, group.annotations, sizing=sizing, devices=defaults.device_classes)
    checks = [group_feasibility(part, nodes) for part in parts]
    job = build_parts_job(
        [(part, excluded_slurm_nodes(check)) for part, check in zip(parts, checks, strict=True)],
        annotations=group.annotations,
        shape=group.shape or GroupShape(name=group.name),
        defaults=defaults,
        policy=policy,
        # No bridge node given: nothing to judge a PodGroup's minResources by (as the worker).
        capacity=total_allocatable(nodes) if nodes else None,
    )
    job = job.with_comment(placement_id(installation, group, ordered[0]))
    # No bridge node at all: nothing to filter with, Slurm alone decides (as the worker does).
    summary = next((check.summary for check in checks if check.summary is not None), None)
    unschedulable = summary if nodes else None
    return Explanation(
        group.name,
        group.kind,
        job.pod_keys,
        # A heterogeneous job as it is submitted, `{"jobs": [...]}`: one description per component.
        job.submission() if job.components else job.to_slurm(),
        group.min_pods,
        unschedulable=unschedulable,
        dra_devices=dra_devices(ordered, defaults.device_classes),
        sizing_note=sizing_note(ordered, job, "the job"),
    )


def placement_id(installation: str, group: grouping.Group, first: Json) -> str:
    """The job's comment, as the worker writes it: the pod's claim, else the one it would get."""
    claim = ((first.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_PLACEMENT)
    if isinstance(claim, str) and claim.startswith(PLACEMENT_ID_PREFIX):
        return claim
    return (
        f"{PLACEMENT_ID_PREFIX}{installation}/{group.key}{GENERATION_SEPARATOR}{first['metadata'].get('uid')}"
    )


async def explain_live(
    reader: grouping.Reader,
    pod: Json,
    defaults: Defaults,
    installation: str = "slurm-bridge",
    *,
    nodes: Sequence[Json] = (),
    policy: PolicySet | None = None,
) -> Explanation:
    """The job for a pod in a cluster, with the group members that exist now and the bridge's `nodes`."""
    group = await grouping.resolve(reader, pod)
    members = [pod]
    if group.member_selector is not None or group.kind == "PodGroup":
        listed = await reader.list_pods(group.namespace, group.member_selector or "")
        members = [p for p in listed if grouping.belongs(group, p)] or [pod]
    return _explanation(group, members, defaults, nodes, installation, policy)
