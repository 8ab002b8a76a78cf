"""`/mutate`: route pods to Slurm. Pure: request in, response out.

For a pod Slurm will place (see `policy.is_bridge_pod`), on CREATE:
- `spec.schedulerName` becomes ours (when it was the default scheduler or empty);
- `spec.nodeName` is removed: only Slurm decides placement;
- the toleration for the managed-node taint is added, once.
Everything else is allowed untouched. UPDATE changes nothing: the API server
forbids changing `schedulerName`/`nodeName` of an existing pod anyway.
"""

from typing import Any

from bridge.tolerations import managed_node_toleration, tolerates_managed_nodes
from webhook.policy import AdmissionPolicy, is_bridge_pod
from webhook.review import AdmissionRequest, AdmissionResponse

Patch = list[dict[str, Any]]


def pod_patch(pod: dict[str, Any], policy: AdmissionPolicy) -> tuple[Patch, list[str]]:
    """JSONPatch operations (and user-facing warnings) that make `pod` a bridge pod."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return [], []  # not a pod the API server would accept; its own validation says why
    patch: Patch = []
    warnings: list[str] = []
    if spec.get("schedulerName") != policy.scheduler_name:
        # "add" replaces an existing member (RFC 6902), so it covers both cases.
        patch.append({"op": "add", "path": "/spec/schedulerName", "value": policy.scheduler_name})
    if spec.get("nodeName"):
        patch.append({"op": "remove", "path": "/spec/nodeName"})
        warnings.append(
            f'spec.nodeName "{str(spec["nodeName"])[:63]}" was removed: '
            "Slurm decides where slurm-bridge pods run; "
            "use the annotation slurmjob.slinky.slurm.net/constraints to restrict nodes"
        )
    tolerations = spec.get("tolerations")
    wanted = managed_node_toleration(policy.scheduler_name)
    if tolerations is None:
        patch.append({"op": "add", "path": "/spec/tolerations", "value": [wanted]})
    elif isinstance(tolerations, list) and not any(
        tolerates_managed_nodes(t, policy.scheduler_name) for t in tolerations
    ):
        patch.append({"op": "add", "path": "/spec/tolerations/-", "value": wanted})
    return patch, warnings


def mutate(request: AdmissionRequest, *, managed: bool, policy: AdmissionPolicy) -> AdmissionResponse:
    """The answer for `/mutate`; `managed` says whether the request's namespace is managed."""
    resource = request.resource
    if resource.group != "" or resource.resource != "pods":
        return AdmissionResponse.deny(
            request.uid,
            f"slurm-bridge /mutate handles pods only, not {request.kind}: "
            "remove this resource from the rules of the MutatingWebhookConfiguration",
            code=400,
        )
    if request.sub_resource or request.operation != "CREATE":
        return AdmissionResponse.allow(request.uid)
    pod = request.object
    if pod is None:
        return AdmissionResponse.deny(
            request.uid, "request.object is missing from the pod CREATE review", code=400
        )
    if not is_bridge_pod(pod, managed=managed, policy=policy):
        return AdmissionResponse.allow(request.uid)
    patch, warnings = pod_patch(pod, policy)
    return AdmissionResponse.allow(request.uid, patch=patch, warnings=warnings)
