"""The built-in PodGroup's status says whether the group is scheduled, as kube-scheduler's does.

Kubernetes 1.36 (`scheduling.k8s.io/v1alpha2`, GenericWorkload gates) reports a
gang's scheduling in one condition of `PodGroup.status.conditions`:
`PodGroupScheduled`, True with reason `Scheduled` once every pod is assigned
a node, False with reason `Unschedulable` while it cannot be. The bridge
writes the same condition through the `status` subresource: False while no
node passes the pods' rules or Slurm keeps the job pending, True once bound.
Later versions (`v1beta1`) rename the condition `PodGroupInitiallyScheduled`;
they are not served by the clusters this bridge supports today (docs/groups.md).

Best effort: a PodGroup the bridge may not read or write (RBAC, gone) is logged
and skipped, never a reason to fail a placement.
"""

import logging

from activities.kube_client import MERGE_PATCH, Json, KubeClient, KubeConflict, KubeError, api_path
from bridge.grouping import BUILTIN_PODGROUP

log = logging.getLogger(__name__)

CONDITION_SCHEDULED = "PodGroupScheduled"
REASON_SCHEDULED = "Scheduled"
REASON_UNSCHEDULABLE = "Unschedulable"
CAS_ATTEMPTS = 5


def builtin_pod_group(pod: Json) -> tuple[str, str] | None:
    """(namespace, name) of the built-in PodGroup the pod belongs to (`spec.schedulingGroup`), if any."""
    name = ((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName")
    return (str(pod["metadata"].get("namespace")), str(name)) if name else None


async def set_scheduled(kube: KubeClient, pod: Json, scheduled: bool, message: str, *, stamp: str) -> None:
    """Write `PodGroupScheduled` on the pod's built-in PodGroup; nothing if it has none or it is unchanged."""
    group = builtin_pod_group(pod)
    if group is None:
        return
    namespace, name = group
    kind = BUILTIN_PODGROUP
    path = api_path(kind.plural, namespace=namespace, name=name, group=kind.group, version=kind.version)
    condition = {
        "type": CONDITION_SCHEDULED,
        "status": "True" if scheduled else "False",
        "reason": REASON_SCHEDULED if scheduled else REASON_UNSCHEDULABLE,
        "message": message[:32768],
        "lastTransitionTime": stamp,
    }
    try:
        for _ in range(CAS_ATTEMPTS):
            pod_group = await kube.request("GET", path)
            conditions = list((pod_group.get("status") or {}).get("conditions") or [])
            current = next((c for c in conditions if c.get("type") == CONDITION_SCHEDULED), None)
            if current is not None:
                if all(current.get(k) == condition[k] for k in ("status", "reason", "message")):
                    return
                if current.get("status") == condition["status"]:
                    condition["lastTransitionTime"] = current.get("lastTransitionTime", stamp)
            others = [c for c in conditions if c.get("type") != CONDITION_SCHEDULED]
            patch = {
                "metadata": {"resourceVersion": pod_group["metadata"]["resourceVersion"]},
                "status": {"conditions": [*others, condition]},
            }
            try:
                await kube.request("PATCH", f"{path}/status", body=patch, content_type=MERGE_PATCH)
                return
            except KubeConflict:
                continue  # written meanwhile: read again
        log.info("PodGroup %s/%s kept changing; condition %s not written", namespace, name, condition)
    except KubeError as error:
        log.info("PodGroup %s/%s: condition %s not written: %s", namespace, name, CONDITION_SCHEDULED, error)
