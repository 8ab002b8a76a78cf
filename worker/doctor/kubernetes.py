"""The doctor's Kubernetes checks: the API server answers, and the credentials may do what the
worker does (SelfSubjectAccessReview for every verb of the chart's RBAC; a server without that
API gets read probes instead)."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

from clients.kube_client import KubeClient, KubeError, api_path, load_configuration
from worker.doctor.check import TIMEOUT, Check
from worker.settings import WorkerSettings


@dataclass(frozen=True)
class Permission:
    what: str
    group: str
    resources: tuple[str, ...]  # "pods" or "pods/binding"
    verbs: tuple[str, ...]
    in_lease_namespace: bool = False


# What the worker calls: the chart's worker ClusterRole and leases Role
# (helm/slurm-bridge/templates/worker-rbac.yaml; tests/deploy/test_rbac.py).
PERMISSIONS = (
    Permission("pods", "", ("pods",), ("get", "list", "watch", "patch", "delete")),
    Permission("binding pods to nodes", "", ("pods/binding",), ("create",)),
    Permission("evicting pods whose Slurm job ended", "", ("pods/eviction",), ("create",)),
    Permission("pod conditions", "", ("pods/status",), ("patch",)),
    Permission("events", "", ("events",), ("create", "patch")),
    Permission("nodes", "", ("nodes",), ("get", "list", "watch", "patch")),
    Permission("owner lookups (batch)", "batch", ("jobs",), ("get",)),
    Permission("owner lookups (apps)", "apps", ("replicasets", "deployments", "statefulsets"), ("get",)),
    Permission("owner lookups (JobSet)", "jobset.x-k8s.io", ("jobsets",), ("get",)),
    Permission(
        "owner lookups (LeaderWorkerSet)", "leaderworkerset.x-k8s.io", ("leaderworkersets",), ("get",)
    ),
    Permission(
        "PodGroups (scheduler-plugins)", "scheduling.x-k8s.io", ("podgroups",), ("get", "list", "watch")
    ),
    Permission(
        "PodGroups (scheduling.k8s.io)", "scheduling.k8s.io", ("podgroups",), ("get", "list", "watch")
    ),
    Permission("Workloads (scheduling.k8s.io)", "scheduling.k8s.io", ("workloads",), ("get",)),
    Permission("PodGroup conditions", "scheduling.k8s.io", ("podgroups/status",), ("patch",)),
    Permission(
        "DRA claims (docs/dra.md)", "resource.k8s.io", ("resourceclaims",), ("list", "create", "delete")
    ),
    Permission("DRA claim allocation", "resource.k8s.io", ("resourceclaims/status",), ("patch",)),
    Permission("DRA devices", "resource.k8s.io", ("deviceclasses", "resourceslices"), ("list",)),
    Permission(
        "leases", "coordination.k8s.io", ("leases",), ("get", "create", "update"), in_lease_namespace=True
    ),
)
RBAC_FIX = (
    "grant it to the worker's identity: the Helm chart does with rbac.create=true "
    "(templates/worker-rbac.yaml lists exactly these verbs)"
)


async def kubernetes_checks(settings: WorkerSettings) -> list[Check]:
    area = "Kubernetes"
    where = f"KUBECONFIG={settings.kubeconfig}" if settings.kubeconfig else "in-cluster"
    if settings.kubeconfig and not _any_file(settings.kubeconfig):
        return [
            Check(
                area,
                "configuration",
                "fail",
                f"{settings.kubeconfig} does not exist",
                "set KUBECONFIG (--kubeconfig) to a kubeconfig file, or leave it unset inside a pod",
            )
        ]
    try:
        kube = KubeClient(await load_configuration(settings.kubeconfig))
    except Exception as error:  # the loaders raise ConfigException, OSError, ValueError, ...
        return [
            Check(
                area,
                "configuration",
                "fail",
                f"no Kubernetes configuration ({where}): {error}",
                "set KUBECONFIG (--kubeconfig) to a kubeconfig file, or run inside a pod",
            )
        ]
    try:
        try:
            version = await kube.request("GET", "/version", timeout=TIMEOUT)
        except KubeError as error:
            fix = (
                "the credentials of KUBECONFIG (--kubeconfig) or the ServiceAccount were refused"
                if error.status in (401, 403)
                else "check KUBECONFIG (--kubeconfig): the server address, or the network to it"
            )
            return [Check(area, "API server", "fail", f"{where}: {error}", fix)]
        checks = [
            Check(
                area,
                "API server",
                "ok",
                f"answers ({version.get('gitVersion', 'unknown version')}, {where})",
            )
        ]
        checks += await _permissions(kube, settings)
        return checks
    finally:
        await kube.close()


async def _permissions(kube: KubeClient, settings: WorkerSettings) -> list[Check]:
    try:
        first = await _review(kube, PERMISSIONS[0], settings)  # does the server answer reviews at all?
    except _NoAccessReview:
        return await _read_probes(kube, settings.lease_namespace)
    return [first, *await asyncio.gather(*(_review(kube, p, settings) for p in PERMISSIONS[1:]))]


async def _review(kube: KubeClient, permission: Permission, settings: WorkerSettings) -> Check:
    # LEASE_NAMESPACE, else the pod's own (WorkerSettings fills it in).
    namespace = settings.lease_namespace if permission.in_lease_namespace else None
    denied: list[str] = []
    for resource in permission.resources:
        plural, _, subresource = resource.partition("/")
        for verb in permission.verbs:
            attributes = {"verb": verb, "group": permission.group, "resource": plural}
            if subresource:
                attributes["subresource"] = subresource
            if namespace:
                attributes["namespace"] = namespace
            body = {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attributes},
            }
            path = api_path("selfsubjectaccessreviews", group="authorization.k8s.io")
            try:
                review = await kube.request("POST", path, body=body, timeout=TIMEOUT)
            except KubeError as error:
                if error.status == 404:
                    raise _NoAccessReview from None
                denied.append(f"{verb} {resource} (cannot ask: {error})")
                continue
            if not (review.get("status") or {}).get("allowed"):
                denied.append(f"{verb} {_qualified(permission.group, resource)}")
    scope = f" in namespace {namespace}" if namespace else ""
    resources = ", ".join(_qualified(permission.group, r) for r in permission.resources)
    allowed = f"{', '.join(permission.verbs)} {resources}"
    if denied and permission.in_lease_namespace and not settings.leader_election:
        return Check(
            "Kubernetes",
            permission.what,
            "warn",
            f"denied{scope}: {'; '.join(denied)}; needed once LEADER_ELECTION is on",
            f"{RBAC_FIX}; LEASE_NAMESPACE names the namespace",
        )
    if denied:
        fix = f"{RBAC_FIX}; LEASE_NAMESPACE names the namespace" if namespace else RBAC_FIX
        return Check("Kubernetes", permission.what, "fail", f"denied{scope}: {'; '.join(denied)}", fix)
    return Check("Kubernetes", permission.what, "ok", f"may {allowed}{scope}")


async def _read_probes(kube: KubeClient, lease_namespace: str) -> list[Check]:
    """No SelfSubjectAccessReview API: try the reads; writes cannot be checked without writing."""
    probes = [
        ("pods", api_path("pods")),
        ("nodes", api_path("nodes")),
        ("events", api_path("events")),
        ("leases", api_path("leases", namespace=lease_namespace, group="coordination.k8s.io")),
    ]
    checks = []
    for what, path in probes:
        try:
            await kube.request("GET", path, query={"limit": "1"}, timeout=TIMEOUT)
            checks.append(Check("Kubernetes", what, "ok", f"may list {what} (read probe)"))
        except KubeError as error:
            checks.append(Check("Kubernetes", what, "fail", f"cannot list {what}: {error}", RBAC_FIX))
    checks.append(
        Check(
            "Kubernetes",
            "write permissions",
            "warn",
            "not verified: no SelfSubjectAccessReview on this API server, and the doctor writes nothing",
            "check that the worker may create pods/binding and events, patch pods, pods/status and "
            f"nodes, delete pods, and get/create/update leases in {lease_namespace}",
        )
    )
    return checks


class _NoAccessReview(Exception):
    pass


def _any_file(kubeconfig: str) -> bool:
    """KUBECONFIG may list several files, as kubectl's does."""
    return any(Path(file).is_file() for file in kubeconfig.split(os.pathsep) if file)


def _qualified(group: str, resource: str) -> str:
    return f"{resource}.{group}" if group else resource
