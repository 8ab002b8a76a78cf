"""The custom resources the bridge reads, installed in the real API server for tests.

Structural stand-ins for the CRDs that scheduler-plugins (PodGroup), JobSet,
LeaderWorkerSet and Kubeflow Trainer (TrainJob) install: the same groups, versions,
kinds, scope and status subresource, with `spec` and `status` left open
(`x-kubernetes-preserve-unknown-fields`). The bridge reads a handful of their fields
and never writes them but a PodGroup's status (a TrainJob it never reads at all), so
the full published schemas would test those projects' validation, not ours.
"""

from typing import Any

from testbed.kube_real.cluster import ApiFailure, RealCluster

Json = dict[str, Any]

# group, version, plural, kind
STAND_INS: tuple[tuple[str, str, str, str], ...] = (
    ("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup"),
    ("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet"),
    ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet"),
    ("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"),
)


def definition(group: str, version: str, plural: str, kind: str) -> Json:
    open_object = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": open_object, "status": open_object},
                        }
                    },
                }
            ],
        },
    }


def install(cluster: RealCluster) -> None:
    """Create the stand-ins (once per server) and wait until each is served."""
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    for group, version, plural, kind in STAND_INS:
        try:
            cluster.call("POST", path, definition(group, version, plural, kind))
        except ApiFailure as failure:
            if failure.status != 409:
                raise

    def established() -> bool:
        for group, _, plural, _ in STAND_INS:
            crd = cluster.call("GET", f"{path}/{plural}.{group}")
            conditions = (crd.get("status") or {}).get("conditions") or []
            if not any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
                return False
        return True

    cluster.resource("customresourcedefinitions.apiextensions.k8s.io")
    cluster.objects("customresourcedefinitions.apiextensions.k8s.io")  # watched: waits wake on changes
    cluster.wait_for(established, timeout=30)
