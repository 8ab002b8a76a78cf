"""AdmissionReview requests shaped like the API server's, and helpers to read the answers."""

import base64
import json
import uuid
from typing import Any

import jsonpatch

Json = dict[str, Any]

SCHEDULER = "slurm-bridge-scheduler"
BRIDGE_USER = "system:serviceaccount:slurm-bridge:slurm-bridge"
MANAGED_NS = "hpc"
OTHER_NS = "web"
P = "slurmjob.slinky.slurm.net/"
JOBID = "scheduler.slinky.slurm.net/slurm-jobid"
NODE = "slinky.slurm.net/slurm-node"
DRA = "deviceclass.resource.kubernetes.io/"

# (group, version, kind, resource) of everything the tests send.
POD = ("", "v1", "Pod", "pods")
JOB = ("batch", "v1", "Job", "jobs")
JOBSET = ("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")
LWS = ("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", "leaderworkersets")
PODGROUP = ("scheduling.x-k8s.io", "v1alpha1", "PodGroup", "podgroups")
DEPLOYMENT = ("apps", "v1", "Deployment", "deployments")


def pod(
    name: str = "p",
    *,
    namespace: str = MANAGED_NS,
    scheduler: str | None = "default-scheduler",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    containers: list[Json] | None = None,
    **spec: Any,
) -> Json:
    """A pod as the API server sends it to admission: defaults applied, no status yet."""
    body: Json = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": containers or [{"name": "main", "image": "busybox", "resources": {}}],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
            **spec,
        },
    }
    if scheduler is not None:
        body["spec"]["schedulerName"] = scheduler
    if annotations is not None:
        body["metadata"]["annotations"] = annotations
    if labels is not None:
        body["metadata"]["labels"] = labels
    return body


def container(name: str = "main", *, requests: Json | None = None, limits: Json | None = None) -> Json:
    resources: Json = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": name, "image": "busybox", "resources": resources}


def review(
    obj: Json | None,
    *,
    operation: str = "CREATE",
    gvkr: tuple[str, str, str, str] = POD,
    namespace: str | None = None,
    old: Json | None = None,
    sub_resource: str | None = None,
    user: str = "alice",
    uid: str | None = None,
) -> Json:
    group, version, kind, resource = gvkr
    gvk = {"group": group, "version": version, "kind": kind}
    gvr = {"group": group, "version": version, "resource": resource}
    some = obj or old or {}
    meta = some.get("metadata") or {}
    request: Json = {
        "uid": uid or str(uuid.uuid4()),
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "name": meta.get("name", ""),
        "namespace": namespace if namespace is not None else meta.get("namespace", MANAGED_NS),
        "operation": operation,
        "userInfo": {"username": user, "uid": "1234", "groups": ["system:authenticated"]},
        "object": obj,
        "oldObject": old,
        "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": f"{operation.title()}Options"},
    }
    if sub_resource:
        request["subResource"] = sub_resource
        request["requestSubResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def response_of(answer: Json, sent: Json) -> Json:
    """The response part, after checking the envelope every answer must have."""
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response: Json = answer["response"]
    assert response["uid"] == sent["request"]["uid"]
    assert isinstance(response["allowed"], bool)
    if not response["allowed"]:
        assert response["status"]["message"].strip()
        assert 400 <= response["status"]["code"] < 500
    if "patch" in response:
        assert response["patchType"] == "JSONPatch"
        assert isinstance(json.loads(base64.b64decode(response["patch"])), list)
    return response


def patch_of(response: Json) -> list[Json]:
    if "patch" not in response:
        return []
    ops: list[Json] = json.loads(base64.b64decode(response["patch"]))
    return ops


def apply_patch(obj: Json, response: Json) -> Json:
    ops = patch_of(response)
    patched: Json = jsonpatch.apply_patch(obj, ops) if ops else obj
    return patched
