"""Which pods become one Slurm job, and what the owning workload says about it.

Precedence, as upstream: a built-in PodGroup (`spec.schedulingGroup`), then a
coscheduling PodGroup (label `scheduling.x-k8s.io/pod-group`), then the
controller owner chain (LeaderWorkerSet groups; Job and JobSet give per-pod
jobs with their annotations and deadline; any other controller gives per-pod
jobs with the highest readable controller's annotations). A pod naming a
PodGroup of either kind that does not exist raises `PodGroupNotFound`: like
kube-scheduler, the bridge keeps it waiting for its group, never placing it alone.

Built-in PodGroups are read at whichever version of `scheduling.k8s.io` the
cluster serves them (`BUILTIN_SCHEDULING_APIS`: Kubernetes 1.37's v1beta1 and
v1alpha3, 1.36's v1alpha2), and their fields by the version they were read at.

Reads go through a `Reader`, so the worker (Kubernetes API), and `explain`
(objects from a file) resolve groups with exactly the same code.

Its size (about 440 lines) is one precedence over five kinds of owner, kept in one
module so the order in which they are tried stays visible.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from bridge.quantity import QuantityError, parse_quantity
from bridge.translate import GroupShape

Json = dict[str, Any]
MAX_OWNER_DEPTH = 32

LABEL_POD_GROUP = "scheduling.x-k8s.io/pod-group"
LABEL_LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LABEL_LWS_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"
LABEL_LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
LABEL_JOBSET_JOB = "jobset.sigs.k8s.io/job-name"


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]


JOB = Kind("batch/v1", "Job", "jobs")
JOBSET = Kind("jobset.x-k8s.io/v1alpha2", "JobSet", "jobsets")
LWS = Kind("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets")
COSCHEDULING_PODGROUP = Kind("scheduling.x-k8s.io/v1alpha1", "PodGroup", "podgroups")
SCHEDULING_GROUP = "scheduling.k8s.io"


@dataclass(frozen=True)
class BuiltinSchedulingApi:
    """One version of built-in workload-aware scheduling (`scheduling.k8s.io`) the bridge reads.

    The versions differ where the bridge looks: the field of the PodGroup that names
    the Workload it was made from, and the condition that reports its scheduling.
    The rest is common: `spec.schedulingPolicy.gang.minCount`, and pods join through
    `spec.schedulingGroup.podGroupName`.
    """

    version: str
    workload_name_field: tuple[str, ...]  # path under the PodGroup's spec
    scheduled_condition: str
    # 1.37's condition says the group was *initially* scheduled: once True it stays True.
    scheduled_is_final: bool

    @property
    def pod_group(self) -> Kind:
        return Kind(f"{SCHEDULING_GROUP}/{self.version}", "PodGroup", "podgroups")

    @property
    def workload(self) -> Kind:
        return Kind(f"{SCHEDULING_GROUP}/{self.version}", "Workload", "workloads")


# Kubernetes 1.37 (beta, and alpha of the same schema): `spec.workloadRef.{workloadName,templateName}`.
SCHEDULING_V1BETA1 = BuiltinSchedulingApi(
    "v1beta1", ("workloadRef", "workloadName"), "PodGroupInitiallyScheduled", scheduled_is_final=True
)
SCHEDULING_V1ALPHA3 = BuiltinSchedulingApi(
    "v1alpha3", ("workloadRef", "workloadName"), "PodGroupInitiallyScheduled", scheduled_is_final=True
)
# Kubernetes 1.36: `spec.podGroupTemplateRef.workload.{workloadName,podGroupTemplateName}`.
SCHEDULING_V1ALPHA2 = BuiltinSchedulingApi(
    "v1alpha2",
    ("podGroupTemplateRef", "workload", "workloadName"),
    "PodGroupScheduled",
    scheduled_is_final=False,
)
# Newest first: the order of preference when a cluster serves several.
BUILTIN_SCHEDULING_APIS = (SCHEDULING_V1BETA1, SCHEDULING_V1ALPHA3, SCHEDULING_V1ALPHA2)


def builtin_scheduling_api(api_version: object) -> BuiltinSchedulingApi | None:
    """The version of built-in scheduling an object's `apiVersion` names, if the bridge reads it."""
    return next((api for api in BUILTIN_SCHEDULING_APIS if api.pod_group.api_version == api_version), None)


def builtin_versions_read() -> str:
    """For messages: every version the bridge reads built-in PodGroups at."""
    return ", ".join(api.pod_group.api_version for api in BUILTIN_SCHEDULING_APIS)


SUPPORTED = {(k.group, k.kind): k for k in (JOB, JOBSET, LWS)}
# Controllers the bridge may read for annotations; others end the owner walk.
READABLE = {
    **SUPPORTED,
    # A pod owns objects too: a LeaderWorkerSet's leader pod controls its group's worker
    # StatefulSet, so a worker reaches its LeaderWorkerSet only through the leader pod.
    ("", "Pod"): Kind("v1", "Pod", "pods"),
    ("apps", "ReplicaSet"): Kind("apps/v1", "ReplicaSet", "replicasets"),
    ("apps", "Deployment"): Kind("apps/v1", "Deployment", "deployments"),
    ("apps", "StatefulSet"): Kind("apps/v1", "StatefulSet", "statefulsets"),
}


class GroupError(ValueError):
    """The pod's group cannot be resolved; the message is for the pod's Events."""


class PodGroupNotFound(GroupError):
    """The pod names a PodGroup that does not exist (yet): it waits for it, as kube-scheduler's pods do.

    `kind` is where to watch for it: for a built-in PodGroup, the version the cluster serves.
    """

    def __init__(
        self, kind: "Kind", namespace: str, name: str, named_by: str, *, served: bool = True
    ) -> None:
        if served:
            why = f"PodGroup {namespace}/{name} ({kind.api_version}) named by {named_by} does not exist"
        else:
            why = (
                f"PodGroup {namespace}/{name} named by {named_by} cannot exist yet: the cluster serves "
                f"PodGroups at none of {builtin_versions_read()} (Kubernetes 1.36 or 1.37 with the "
                "GenericWorkload feature gate and that API enabled)"
            )
        super().__init__(f"{why}; the pod waits for it and is placed with its group once it is created")
        self.kind = kind
        self.namespace = namespace
        self.name = name


class Reader(Protocol):
    async def get(self, kind: Kind, namespace: str, name: str) -> Json | None:
        """The object, or None when it does not exist. Raise PermissionError when forbidden."""
        ...

    async def list_pods(self, namespace: str, label_selector: str) -> list[Json]: ...


@runtime_checkable
class DiscoveringReader(Reader, Protocol):
    """A Reader of an API server, which serves built-in PodGroups at one version (or none)."""

    async def served_scheduling_api(self) -> BuiltinSchedulingApi | None:
        """The newest version of `scheduling.k8s.io` the bridge reads that serves PodGroups, or None."""
        ...


@dataclass(frozen=True)
class Group:
    """A resolved placement group."""

    key: str  # stable identity: the workflow id is derived from it
    kind: str  # Pod, Job, JobSet, LeaderWorkerSet, PodGroup
    namespace: str
    name: str  # job name in Slurm
    min_pods: int  # pods that must exist before the job is submitted
    member_selector: str | None = None  # label selector of the group's pods; None = the pod alone
    annotations: Mapping[str, str] = field(default_factory=dict)
    shape: GroupShape | None = None


def _meta(obj: Json) -> Json:
    return obj.get("metadata") or {}


def _field(obj: object, *path: str) -> object:
    """The value at `path`, or None where the path ends early or passes through a non-object."""
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _controller(obj: Json) -> Json | None:
    for ref in _meta(obj).get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


def _deadline_minutes(job: Json | None) -> int | None:
    seconds = ((job or {}).get("spec") or {}).get("activeDeadlineSeconds")
    return math.ceil(int(seconds) / 60) if seconds else None


async def _owner_chain(reader: Reader, pod: Json) -> list[tuple[Kind | None, Json]]:
    """(kind, object) for each controller above the pod, as far as it is readable."""
    namespace = _meta(pod).get("namespace", "")
    chain: list[tuple[Kind | None, Json]] = []
    current = pod
    for depth in range(MAX_OWNER_DEPTH):
        ref = _controller(current)
        if ref is None:
            break
        group = str(ref.get("apiVersion", "")).rpartition("/")[0]
        kind = READABLE.get((group, str(ref.get("kind"))))
        supported = (group, ref.get("kind")) in SUPPORTED
        where = f"{ref.get('kind')} {namespace}/{ref.get('name')}"
        if kind is None:
            if depth == 0:
                # The direct owner must be known; an unknown kind is a controller we do not read.
                chain.append((None, {"metadata": {"name": ref.get("name")}}))
            break
        try:
            owner = await reader.get(kind, namespace, str(ref.get("name")))
        except PermissionError:
            if supported or depth == 0:
                raise GroupError(f"the bridge may not read {where}, which owns the pod") from None
            break
        if owner is None:
            if supported or depth == 0:
                raise GroupError(f"{where}, which owns the pod, does not exist") from None
            break
        chain.append((kind, owner))
        current = owner
    return chain


def _min_resources(pod_group: Json, namespace: str, name: str) -> tuple[tuple[str, str], ...]:
    """spec.minResources as written, each quantity checked: the whole group's minimum (never a node's)."""
    resources = _field(pod_group, "spec", "minResources") or {}
    where = f"PodGroup {namespace}/{name} spec.minResources"
    if not isinstance(resources, dict):
        raise GroupError(f"{where} must map resource names to quantities")
    checked = []
    for resource, value in sorted(resources.items()):
        try:
            parse_quantity(str(value))
        except QuantityError as error:
            raise GroupError(f"{where} {resource}: {error}") from None
        checked.append((str(resource), str(value)))
    return tuple(checked)


async def resolve(reader: Reader, pod: Json) -> Group:
    """The group `pod` belongs to, with the shape and annotations that apply to its job."""
    meta, spec = _meta(pod), pod.get("spec") or {}
    namespace, name = meta.get("namespace", ""), meta.get("name", "")
    labels = meta.get("labels") or {}

    builtin = (spec.get("schedulingGroup") or {}).get("podGroupName")
    if builtin:
        return await _builtin_pod_group(reader, pod, namespace, str(builtin))

    pod_group_name = labels.get(LABEL_POD_GROUP)
    if pod_group_name:
        pod_group = await reader.get(COSCHEDULING_PODGROUP, namespace, pod_group_name)
        if pod_group is None:
            # Never placed alone: the coscheduling plugin keeps such a pod waiting for its group.
            raise PodGroupNotFound(
                COSCHEDULING_PODGROUP, namespace, pod_group_name, f"label {LABEL_POD_GROUP}"
            )
        return _coscheduling(pod_group, namespace, pod_group_name)

    chain = await _owner_chain(reader, pod)
    supported = [
        (kind, obj) for kind, obj in chain if kind is not None and (kind.group, kind.kind) in SUPPORTED
    ]
    if supported and supported[-1][0] == LWS:
        return _leader_worker_set(supported[-1][1], pod, namespace)
    if supported:
        kind, top = supported[-1]
        job = next((obj for k, obj in chain if k == JOB), None)
        return Group(
            key=f"{namespace}/{name}/{meta.get('uid')}",
            kind=kind.kind if kind else "Job",
            namespace=namespace,
            name=f"{namespace}/{name}",
            min_pods=1,
            annotations=_meta(top).get("annotations") or {},
            shape=GroupShape(name=f"{namespace}/{name}", time_limit_minutes=_deadline_minutes(job)),
        )
    readable = [obj for kind, obj in chain if kind is not None]
    annotations = _meta(readable[-1]).get("annotations") if readable else meta.get("annotations")
    return Group(
        key=f"{namespace}/{name}/{meta.get('uid')}",
        kind="Pod",
        namespace=namespace,
        name=f"{namespace}/{name}",
        min_pods=1,
        annotations=annotations or {},
        shape=GroupShape(name=f"{namespace}/{name}", max_nodes=1),
    )


def _coscheduling(pod_group: Json, namespace: str, name: str) -> Group:
    """A scheduler-plugins PodGroup, its fields read as the coscheduling plugin reads them.

    - minMember: the pods that must exist before the group is placed (the plugin's
      PreFilter quorum). The job then asks for one node per pod it carries, no fewer:
      Slurm would start a job with fewer nodes than pods (minimum_nodes below the
      node count), and the pods left without a node could not run beside it.
    - minResources: the whole group's minimum (`GroupShape.min_resources`); it never
      sizes a node.
    - scheduleTimeoutSeconds: not read. It bounds how long the plugin's Permit holds
      pods already given a node while their siblings are placed; a Slurm job is
      allocated whole or not at all, so no pod ever holds a node waiting.
    - status.phase: not read, as the coscheduling plugin does not read it; it is the
      controller's account of the pods (docs/groups.md).
    """
    spec = pod_group.get("spec") or {}
    min_member = int(spec.get("minMember") or 1)
    return Group(
        key=f"{namespace}/podgroup/{name}/{_meta(pod_group).get('uid')}",
        kind="PodGroup",
        namespace=namespace,
        name=name,
        min_pods=min_member,
        member_selector=f"{LABEL_POD_GROUP}={name}",
        annotations=_meta(pod_group).get("annotations") or {},
        shape=GroupShape(name=name, min_resources=_min_resources(pod_group, namespace, name)),
    )


def _leader_worker_set(lws: Json, pod: Json, namespace: str) -> Group:
    labels = _meta(pod).get("labels") or {}
    group_key, index = labels.get(LABEL_LWS_GROUP_KEY), labels.get(LABEL_LWS_GROUP_INDEX, "0")
    lws_name = _meta(lws).get("name")
    if not group_key:
        raise GroupError(f"pod of LeaderWorkerSet {lws_name} has no {LABEL_LWS_GROUP_KEY} label")
    size = int(((lws.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("size") or 1)
    name = f"{lws_name}-{index}"
    return Group(
        key=f"{namespace}/lws/{name}/{group_key}",
        kind="LeaderWorkerSet",
        namespace=namespace,
        name=name,
        min_pods=size,
        member_selector=f"{LABEL_LWS_GROUP_KEY}={group_key}",
        annotations=_meta(lws).get("annotations") or {},
        shape=GroupShape(name=name, min_nodes=size, max_nodes=size),
    )


async def _read_builtin_pod_group(reader: Reader, namespace: str, name: str) -> Json:
    """The PodGroup at the version the cluster serves; a reader of objects (explain) finds any version."""
    named_by = "spec.schedulingGroup"
    newest = BUILTIN_SCHEDULING_APIS[0]
    candidates: Sequence[BuiltinSchedulingApi] = BUILTIN_SCHEDULING_APIS
    if isinstance(reader, DiscoveringReader):
        served = await reader.served_scheduling_api()
        if served is None:
            # Waits all the same: never placed alone, and an API enabled later can serve it.
            raise PodGroupNotFound(newest.pod_group, namespace, name, named_by, served=False)
        candidates = (served,)
    for api in candidates:
        pod_group = await reader.get(api.pod_group, namespace, name)
        if pod_group is not None:
            return pod_group
    raise PodGroupNotFound(candidates[0].pod_group, namespace, name, named_by)


def _gang_min_count(pod_group: Json, where: str) -> int:
    """How many pods the group waits for: the gang's minCount; 1 for the basic (pod by pod) policy."""
    policy = _field(pod_group, "spec", "schedulingPolicy")
    if not isinstance(policy, dict) or (policy.get("gang") is None and policy.get("basic") is None):
        raise GroupError(f"{where}: spec.schedulingPolicy sets neither gang nor basic")
    if policy.get("gang") is None:
        return 1
    min_count = _field(policy, "gang", "minCount")
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
        raise GroupError(
            f"{where}: spec.schedulingPolicy.gang.minCount must be a whole number of at least 1, "
            f"not {min_count!r}"
        )
    return min_count


async def _builtin_pod_group(reader: Reader, pod: Json, namespace: str, name: str) -> Group:
    pod_group = await _read_builtin_pod_group(reader, namespace, name)
    api_version = pod_group.get("apiVersion")
    where = f"PodGroup {namespace}/{name} ({api_version})"
    # Its fields are named as the version it was read at names them.
    api = builtin_scheduling_api(api_version)
    if api is None:
        raise GroupError(f"{where}: the bridge reads PodGroups at {builtin_versions_read()} only")
    min_count = _gang_min_count(pod_group, where)
    # Annotations merge PodGroup → controller (e.g. the Job) → Workload; the later wins.
    annotations: dict[str, str] = dict(_meta(pod_group).get("annotations") or {})
    chain = await _owner_chain(reader, pod)
    if chain and chain[-1][0] is not None:
        annotations.update(_meta(chain[-1][1]).get("annotations") or {})
    workload_name = _field(pod_group.get("spec"), *api.workload_name_field)
    if isinstance(workload_name, str) and workload_name:
        workload = await reader.get(api.workload, namespace, workload_name)
        annotations.update(_meta(workload or {}).get("annotations") or {})
    return Group(
        key=f"{namespace}/podgroup/{name}/{_meta(pod_group).get('uid')}",
        kind="PodGroup",
        namespace=namespace,
        name=name,
        min_pods=min_count,
        member_selector=None,  # members carry spec.schedulingGroup, which no label selector can match
        annotations=annotations,
        shape=GroupShape(name=name),
    )


def belongs(group: Group, pod: Json) -> bool:
    """Whether `pod` is one of the group's pods (used on listings of the group's namespace)."""
    meta = _meta(pod)
    if meta.get("namespace") != group.namespace:
        return False
    if group.kind == "PodGroup" and group.member_selector is None:
        return ((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName") == group.name
    if group.member_selector is None:
        return f"{meta.get('namespace')}/{meta.get('name')}/{meta.get('uid')}" == group.key
    key, _, value = group.member_selector.partition("=")
    return (meta.get("labels") or {}).get(key) == value


def in_order(pods: Sequence[Json]) -> list[Json]:
    """A stable order for pairing pods with allocated nodes: LWS leader first, then by name."""

    def index(pod: Json) -> tuple[int, str]:
        labels = _meta(pod).get("labels") or {}
        worker = labels.get("leaderworkerset.sigs.k8s.io/worker-index", "")
        return (int(worker) if worker.isdigit() else 0, _meta(pod).get("name", ""))

    return sorted(pods, key=index)
