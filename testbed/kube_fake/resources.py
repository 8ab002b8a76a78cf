"""Which resources the fake serves and how each one behaves.

One ``ResourceType`` per group/plural.  The flags encode the per-resource
differences of the real registry (status subresource, what DELETE returns,
whether strategic merge patch is allowed) so the generic store can stay
generic.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .util import JSON

# Field selectors every resource accepts (apiserver's DefaultClusterScopedAttr
# / DefaultNamespaceScopedAttr).
BASE_FIELDS = ("metadata.name", "metadata.namespace")

POD_FIELDS = (
    "spec.nodeName",
    "spec.schedulerName",
    "spec.restartPolicy",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
)
# resource.k8s.io/v1 ResourceSlice's field label conversion.
RESOURCE_SLICE_FIELDS = ("spec.nodeName", "spec.driver")
CORE_EVENT_FIELDS = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "type",
)


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    # PUT/PATCH on the main resource ignore .status; /status touches only .status.
    status_subresource: bool = True
    # Pods answer DELETE with the object; most others with a Success Status.
    return_deleted_object: bool = False
    # Create drops a client-supplied .status (true for nearly every built-in
    # kind and for CRDs with a status subresource; nodes keep it).
    reset_status_on_create: bool = True
    # CustomResourceDefinition-backed: strategic merge patch is rejected (415).
    custom: bool = False
    extra_fields: tuple[str, ...] = ()
    short_names: tuple[str, ...] = field(default=())
    # Whether objects have a metadata.generation: only where the kind's strategy sets one
    # (not on ConfigMaps, Secrets, Leases, Events, Nodes or Namespaces).
    generation: bool = True
    # The version objects are kept (and compared) in when a resource is served at
    # several versions; "" means this version. The fake serves several versions of a
    # resource only when their schemas are equal, so converting is the apiVersion alone.
    storage_version: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def storage_api_version(self) -> str:
        version = self.storage_version or self.version
        return f"{self.group}/{version}" if self.group else version

    def served(self, obj: JSON) -> JSON:
        """A stored object (a copy the caller owns) as this version serves it."""
        if obj.get("apiVersion") in (None, self.api_version):
            return obj
        return {**obj, "apiVersion": self.api_version}

    @property
    def group_version(self) -> str:
        return self.api_version

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def qualified(self) -> str:
        """``pods`` or ``deployments.apps``: how apimachinery names it in messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def field_labels(self) -> tuple[str, ...]:
        return BASE_FIELDS + self.extra_fields


# scheduling.k8s.io's Workload and PodGroup by the Kubernetes release that serves them
# (behind the GenericWorkload feature gates and the API's runtime-config). 1.37 drops
# v1alpha2 for v1alpha3 and v1beta1, whose schemas are equal; both serve the same
# stored objects, the first listed being the storage version.
SCHEDULING_VERSIONS: dict[str, tuple[str, ...]] = {"1.36": ("v1alpha2",), "1.37": ("v1beta1", "v1alpha3")}
SCHEDULING_PLURALS = ("workloads", "podgroups")


def scheduling_resources(versions: Sequence[str]) -> tuple[ResourceType, ...]:
    """Workload (no status) and PodGroup at `versions`, which must all be of one release."""
    if not versions or not any(set(versions) <= set(served) for served in SCHEDULING_VERSIONS.values()):
        raise ValueError(
            f"kube_fake: no Kubernetes release serves scheduling.k8s.io at {list(versions)}; "
            f"known: {SCHEDULING_VERSIONS}"
        )
    storage = versions[0]
    return tuple(
        rt
        for version in versions
        for rt in (
            ResourceType(
                "scheduling.k8s.io",
                version,
                "workloads",
                "Workload",
                True,
                status_subresource=False,
                storage_version=storage,
            ),
            ResourceType(
                "scheduling.k8s.io", version, "podgroups", "PodGroup", True, storage_version=storage
            ),
        )
    )


def _core(plural: str, kind: str, namespaced: bool = True, **kw: Any) -> ResourceType:
    return ResourceType("", "v1", plural, kind, namespaced, **kw)


DEFAULT_RESOURCES: tuple[ResourceType, ...] = (
    _core("pods", "Pod", return_deleted_object=True, extra_fields=POD_FIELDS, short_names=("po",)),
    _core(
        "nodes",
        "Node",
        namespaced=False,
        reset_status_on_create=False,
        generation=False,
        extra_fields=("spec.unschedulable",),
        short_names=("no",),
    ),
    _core(
        "namespaces",
        "Namespace",
        namespaced=False,
        extra_fields=("status.phase",),
        short_names=("ns",),
        generation=False,
    ),
    _core(
        "events",
        "Event",
        status_subresource=False,
        extra_fields=CORE_EVENT_FIELDS,
        short_names=("ev",),
        generation=False,
    ),
    _core("configmaps", "ConfigMap", status_subresource=False, short_names=("cm",), generation=False),
    _core("secrets", "Secret", status_subresource=False, generation=False),
    ResourceType("events.k8s.io", "v1", "events", "Event", True, status_subresource=False, generation=False),
    ResourceType("batch", "v1", "jobs", "Job", True),
    ResourceType("apps", "v1", "deployments", "Deployment", True, short_names=("deploy",)),
    ResourceType("apps", "v1", "replicasets", "ReplicaSet", True, short_names=("rs",)),
    ResourceType("apps", "v1", "statefulsets", "StatefulSet", True, short_names=("sts",)),
    ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, short_names=("pdb",)),
    ResourceType(
        "coordination.k8s.io", "v1", "leases", "Lease", True, status_subresource=False, generation=False
    ),
    ResourceType("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", True, custom=True),
    ResourceType("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet", True, custom=True),
    ResourceType("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup", True, custom=True),
    # Always served, and the group's preferred version: the preferred version of
    # scheduling.k8s.io is not where its PodGroups are.
    ResourceType(
        "scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, status_subresource=False
    ),
    # Built-in gang scheduling as Kubernetes 1.36 serves it (GenericWorkload gate);
    # FakeKubeServer.serve_scheduling_versions switches to 1.37's versions.
    *scheduling_resources(SCHEDULING_VERSIONS["1.36"]),
    # Dynamic resource allocation (GA in 1.34).
    ResourceType("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False, status_subresource=False),
    ResourceType(
        "resource.k8s.io",
        "v1",
        "resourceslices",
        "ResourceSlice",
        False,
        status_subresource=False,
        extra_fields=RESOURCE_SLICE_FIELDS,
    ),
    ResourceType("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True),
    ResourceType(
        "resource.k8s.io",
        "v1",
        "resourceclaimtemplates",
        "ResourceClaimTemplate",
        True,
        status_subresource=False,
    ),
)


class Registry:
    """Thread-safe lookup table; tests may register more kinds at runtime."""

    def __init__(self, resources: Iterable[ResourceType] = DEFAULT_RESOURCES) -> None:
        self._lock = threading.Lock()
        self._by_path: dict[tuple[str, str, str], ResourceType] = {}
        for rt in resources:
            self.register(rt)

    def register(self, rt: ResourceType) -> None:
        with self._lock:
            self._by_path[(rt.group, rt.version, rt.plural)] = rt

    def unregister(self, group: str, plural: str) -> None:
        """Stop serving the resource at every version."""
        with self._lock:
            for key in [k for k in self._by_path if (k[0], k[2]) == (group, plural)]:
                del self._by_path[key]

    def get(self, group: str, version: str, plural: str) -> ResourceType | None:
        with self._lock:
            return self._by_path.get((group, version, plural))

    def all(self) -> list[ResourceType]:
        with self._lock:
            return list(self._by_path.values())

    def resolve(self, name: str) -> ResourceType:
        """``pods``, ``deployments.apps`` or ``jobsets.jobset.x-k8s.io`` -> its type."""
        plural, _, group = name.partition(".")
        with self._lock:
            for rt in self._by_path.values():
                if rt.plural == plural and rt.group == group:
                    return rt
        raise KeyError(f"kube_fake: unknown resource {name!r}")

    def groups(self) -> dict[str, list[str]]:
        """Group name -> versions, for discovery."""
        out: dict[str, list[str]] = {}
        with self._lock:
            for rt in self._by_path.values():
                versions = out.setdefault(rt.group, [])
                if rt.version not in versions:
                    versions.append(rt.version)
        return out
