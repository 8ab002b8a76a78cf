"""Which pods are the bridge's, shared by mutation and validation so they never disagree."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge import keys
from bridge.device_classes import DEFAULT_DEVICE_CLASSES, DeviceClasses
from bridge.policy import PolicySet

DEFAULT_SCHEDULER = "default-scheduler"
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"


@dataclass(frozen=True)
class ClusterDeviceClasses:
    """What the cluster answered about the DeviceClasses one request asks for.

    The Webhook looks the classes up (webhook.device_classes) before the pure decision,
    which turns the answer into problems.
    """

    # resource.k8s.io/v1 is not served (Kubernetes before 1.34): the cluster has no DeviceClasses.
    unserved: bool = False
    missing: frozenset[str] = frozenset()
    # (class, why its lookup failed): a transient failure, told as one to try again.
    unknown: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class AdmissionPolicy:
    """Deployment-wide settings the (pure) decisions need."""

    scheduler_name: str = keys.DEFAULT_SCHEDULER_NAME
    # Usernames allowed to write the bridge-owned label and annotations (checks.OWNED_KEYS).
    bridge_users: frozenset[str] = field(default_factory=frozenset)
    # The tenant policy in force for this decision (the Webhook re-reads its file).
    tenants: PolicySet = field(default_factory=PolicySet, compare=False, hash=False)
    # The DRA classes the bridge honours and their Slurm meaning (DRA_DEVICE_CLASSES).
    device_classes: DeviceClasses = DEFAULT_DEVICE_CLASSES
    # For this decision, what the cluster said of the classes the request asks for; None: not
    # looked up (no lookup configured, or not a CREATE: a pod's resources never change after).
    cluster_classes: ClusterDeviceClasses | None = field(default=None, compare=False, hash=False)

    def is_bridge_user(self, username: str) -> bool:
        return username in self.bridge_users


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def owned_by_daemonset(pod: Mapping[str, Any]) -> bool:
    owners = _mapping(pod.get("metadata")).get("ownerReferences")
    return isinstance(owners, list) and any(
        isinstance(o, Mapping) and o.get("kind") == "DaemonSet" and o.get("controller") for o in owners
    )


def has_controller(pod: Mapping[str, Any]) -> bool:
    """True when a workload (Job, ReplicaSet, ...) controls the pod; False for a bare pod."""
    owners = _mapping(pod.get("metadata")).get("ownerReferences")
    return isinstance(owners, list) and any(isinstance(o, Mapping) and o.get("controller") for o in owners)


def is_bridge_pod(pod: Mapping[str, Any], *, managed: bool, policy: AdmissionPolicy) -> bool:
    """Will Slurm place this pod (once mutated)?

    Yes if it names our scheduler. In a managed namespace also if it asks for
    the default scheduler (or none) - except node-bound system pods: a mirror
    pod is the kubelet's record of a static pod already running on its node,
    and a DaemonSet pod belongs on every node by definition; moving either to
    Slurm would break it, and no administrator managing a namespace wants that.
    """
    spec = _mapping(pod.get("spec"))
    scheduler = spec.get("schedulerName")
    if scheduler == policy.scheduler_name:
        return True
    if not managed or scheduler not in (None, "", DEFAULT_SCHEDULER):
        return False
    annotations = _mapping(_mapping(pod.get("metadata")).get("annotations"))
    return MIRROR_POD_ANNOTATION not in annotations and not owned_by_daemonset(pod)
