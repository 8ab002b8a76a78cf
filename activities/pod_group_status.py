"""The built-in PodGroup's status says whether the group is scheduled, as kube-scheduler's does.

kube-scheduler reports a gang's scheduling in one condition of
`PodGroup.status.conditions`, named by the version of `scheduling.k8s.io` the
cluster serves (`BuiltinSchedulingApi.scheduled_condition`, found by discovery):

- Kubernetes 1.36 (`v1alpha2`): `PodGroupScheduled`, True with reason
  `Scheduled` once every pod is assigned a node, False with reason
  `Unschedulable` while it cannot be (again False if it later cannot be).
- Kubernetes 1.37 (`v1beta1`, `v1alpha3`): `PodGroupInitiallyScheduled`, the
  same reasons, but once True it stays True: it records that the group was
  scheduled, not what happens to it later.

The bridge writes that condition through the `status` subresource: False while
no node passes the pods' rules or Slurm keeps the job pending, True once bound.

Best effort: a PodGroup the bridge may not read or write (RBAC, gone), or a
cluster serving no PodGroups, is logged and skipped, never a reason to fail a
placement.
"""

import logging

from activities.kube_reader import scheduling_discovery
from bridge.grouping import BuiltinSchedulingApi
from clients.kube_client import MERGE_PATCH, Json, KubeClient, KubeConflict, KubeError, api_path

log = logging.getLogger(__name__)

REASON_SCHEDULED = "Scheduled"
REASON_UNSCHEDULABLE = "Unschedulable"
CAS_ATTEMPTS = 5


def builtin_pod_group(pod: Json) -> tuple[str, str] | None:
    """(namespace, name) of the built-in PodGroup the pod belongs to (`spec.schedulingGroup`), if any."""
    name = ((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName")
    return (str(pod["metadata"].get("namespace")), str(name)) if name else None


async def set_scheduled(kube: KubeClient, pod: Json, scheduled: bool, message: str, *, stamp: str) -> None:
    """Write the scheduled condition on the pod's built-in PodGroup; nothing if it has none or it holds."""
    group = builtin_pod_group(pod)
    if group is None:
        return
    namespace, name = group
    try:
        api = await scheduling_discovery(kube).served()
        if api is None:
            log.info("PodGroup %s/%s: the cluster serves no PodGroups; no condition written", namespace, name)
            return
        await _write_condition(kube, api, namespace, name, _condition(api, scheduled, message, stamp))
    except KubeError as error:
        log.info("PodGroup %s/%s: scheduled condition not written: %s", namespace, name, error)


def _condition(api: BuiltinSchedulingApi, scheduled: bool, message: str, stamp: str) -> Json:
    return {
        "type": api.scheduled_condition,
        "status": "True" if scheduled else "False",
        "reason": REASON_SCHEDULED if scheduled else REASON_UNSCHEDULABLE,
        "message": message[:32768],
        "lastTransitionTime": stamp,
    }


async def _write_condition(
    kube: KubeClient, api: BuiltinSchedulingApi, namespace: str, name: str, condition: Json
) -> None:
    kind = api.pod_group
    path = api_path(kind.plural, namespace=namespace, name=name, group=kind.group, version=kind.version)
    for _ in range(CAS_ATTEMPTS):
        pod_group = await kube.request("GET", path)
        conditions = list((pod_group.get("status") or {}).get("conditions") or [])
        current = next((c for c in conditions if c.get("type") == condition["type"]), None)
        if current is not None:
            if all(current.get(k) == condition[k] for k in ("status", "reason", "message")):
                return
            if api.scheduled_is_final and current.get("status") == "True":
                return  # initially scheduled: a later pending generation does not undo that
            if current.get("status") == condition["status"]:
                condition["lastTransitionTime"] = (
                    current.get("lastTransitionTime") or condition["lastTransitionTime"]
                )
        others = [c for c in conditions if c.get("type") != condition["type"]]
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
