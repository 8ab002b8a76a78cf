"""Workload objects as their controllers create them, for tests on the real API server.

No controller runs beside testbed/kube_real's API server, so a test plays them: each helper
here creates what one controller creates, with the owner references (controller: true and
blockOwnerDeletion, as controller-runtime's and kube-controller-manager's helpers set them),
names, labels and annotations that controller's source gives them:

- Kubeflow Trainer v2 (`pkg/runtime/framework/plugins`): for a TrainJob whose runtime sets
  `podGroupPolicy.coscheduling`, a PodGroup named after the TrainJob with `minMember` the pods
  of every replicated job (the trainer's `numNodes`), `minResources` each pod's requests times
  that count, `scheduleTimeoutSeconds` from the runtime, and the label
  `scheduling.x-k8s.io/pod-group: <TrainJob>` on every pod template; and a JobSet of the same
  name. Both are controlled by the TrainJob.
- JobSet (`pkg/controllers/jobset_controller.go`): one Job per replica of each replicated
  job, `<jobset>-<replicated job>-<index>`, the `jobset.sigs.k8s.io/*` labels and annotations
  on the Job and its pod template, the JobSet's name as the pods' subdomain.
- Job (kube-controller-manager): Indexed pods `<job>-<index>-<random>` with the completion
  index as label and annotation, the hostname `<job>-<index>`, the template's labels (the API
  server adds the Job's `controller-uid` and `job-name`) and the job-tracking finalizer.
- LeaderWorkerSet (`pkg/controllers`, `pkg/webhooks/pod_webhook.go`): the leader StatefulSet
  `<lws>`, controlled by the LeaderWorkerSet, whose pods are the leaders `<lws>-<group>`;
  each leader pod controls its group's worker StatefulSet `<lws>-<group>`, whose pods are
  the workers `<lws>-<group>-<worker>`. Group index and key (SHA-1 of `<ns>/<leader>`),
  worker index, size annotation as its pod webhook sets them.
- ReplicaSet: pods `<replica set>-<random>` with the `pod-template-hash` label, controlled by
  the ReplicaSet, which a Deployment controls.
"""

import copy
import hashlib
from typing import Any

from testbed.kube_backend import KubeBackend

Json = dict[str, Any]

POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOB_TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
TRAINER_API = "trainer.kubeflow.org/v1alpha1"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS = "leaderworkerset.sigs.k8s.io/"


def controlled_by(owner: Json, api_version: str, kind: str) -> list[Json]:
    """The ownerReferences a controller writes on what it creates."""
    meta = owner["metadata"]
    return [
        {
            "apiVersion": api_version,
            "kind": kind,
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def sha1(text: str) -> str:
    # The key JobSet and LeaderWorkerSet compute (SHA-1 of a namespaced name), not a secret.
    return hashlib.sha1(text.encode()).hexdigest()


def container(resources: Json, name: str = "node") -> Json:
    """A container asking for `resources` (requests; extended resources as limits too, as required)."""
    limits = {k: v for k, v in resources.items() if "/" in k}
    return {
        "name": name,
        "image": "busybox",
        "resources": {"requests": dict(resources), **({"limits": limits} if limits else {})},
    }


def pod_spec(scheduler: str, resources: Json, restart: str = "Never") -> Json:
    """A pod template's spec: the bridge's scheduler (set in the template, or by the webhook for a
    managed namespace), one container asking for `resources`."""
    return {"schedulerName": scheduler, "restartPolicy": restart, "containers": [container(resources)]}


def _quantity_times(text: str, count: int) -> str:
    """A quantity times a count, written as Kubernetes writes the sum (whole numbers, Mi, Gi)."""
    for suffix in ("Gi", "Mi"):
        if text.endswith(suffix):
            return f"{int(text[: -len(suffix)]) * count}{suffix}"
    return str(int(text) * count)


# -- Kubeflow Trainer --------------------------------------------------------------------------


def train_job(kube: KubeBackend, namespace: str, name: str, nodes: int, resources: Json) -> Json:
    """A TrainJob of the torch runtime: `nodes` nodes, each asking for `resources`."""
    return kube.create_object(
        "trainjobs.trainer.kubeflow.org",
        {
            "apiVersion": TRAINER_API,
            "kind": "TrainJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "runtimeRef": {
                    "apiGroup": "trainer.kubeflow.org",
                    "kind": "ClusterTrainingRuntime",
                    "name": "torch-distributed",
                },
                "trainer": {
                    "numNodes": nodes,
                    "resourcesPerNode": {"requests": dict(resources)},
                },
            },
        },
    )


def trainer_pod_group(kube: KubeBackend, trainjob: Json, nodes: int, resources: Json) -> Json:
    """The PodGroup Trainer's coscheduling plugin builds (its `Build`): minMember = the pods of
    all PodSets, minResources = each PodSet's single-pod requests times its count."""
    meta = trainjob["metadata"]
    return kube.create_object(
        "podgroups.scheduling.x-k8s.io",
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "ownerReferences": controlled_by(trainjob, TRAINER_API, "TrainJob"),
            },
            "spec": {
                "minMember": nodes,
                "minResources": {k: _quantity_times(str(v), nodes) for k, v in resources.items()},
                "scheduleTimeoutSeconds": 60,
            },
        },
    )


def trainer_job_set(kube: KubeBackend, trainjob: Json, nodes: int, resources: Json, scheduler: str) -> Json:
    """The JobSet Trainer's JobSet plugin applies for the torch runtime: one replicated job `node`
    of `nodes` Indexed pods (parallelism = completions = numNodes), the PodGroup's label on its
    pod template."""
    meta = trainjob["metadata"]
    template = {
        "metadata": {"labels": {POD_GROUP_LABEL: meta["name"]}},
        "spec": pod_spec(scheduler, resources),
    }
    return kube.create_object(
        "jobsets.jobset.x-k8s.io",
        {
            "apiVersion": JOBSET_API,
            "kind": "JobSet",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "ownerReferences": controlled_by(trainjob, TRAINER_API, "TrainJob"),
            },
            "spec": {
                "network": {"enableDNSHostnames": True},
                "successPolicy": {"operator": "All", "targetReplicatedJobs": ["node"]},
                "replicatedJobs": [
                    {
                        "name": "node",
                        "replicas": 1,
                        "template": {
                            "metadata": {
                                "labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
                            },
                            "spec": {
                                "parallelism": nodes,
                                "completions": nodes,
                                "completionMode": "Indexed",
                                "backoffLimit": 0,
                                "template": template,
                            },
                        },
                    }
                ],
            },
        },
    )


# -- JobSet ----------------------------------------------------------------------------------


def job_set(kube: KubeBackend, namespace: str, name: str, replicated_jobs: list[Json], **meta: Any) -> Json:
    return kube.create_object(
        "jobsets.jobset.x-k8s.io",
        {
            "apiVersion": JOBSET_API,
            "kind": "JobSet",
            "metadata": {"name": name, "namespace": namespace, **meta},
            "spec": {"network": {"enableDNSHostnames": True}, "replicatedJobs": replicated_jobs},
        },
    )


def job_set_jobs(kube: KubeBackend, jobset: Json) -> list[Json]:
    """What the JobSet controller creates: a Job per replica of each replicated job."""
    meta = jobset["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    replicated = jobset["spec"]["replicatedJobs"]
    total = sum(int(r.get("replicas", 1)) for r in replicated)
    jobs = []
    global_index = 0
    for rjob in replicated:
        replicas = int(rjob.get("replicas", 1))
        for index in range(replicas):
            job_name = f"{name}-{rjob['name']}-{index}"
            keys = {
                "jobset.sigs.k8s.io/jobset-name": name,
                "jobset.sigs.k8s.io/jobset-uid": meta["uid"],
                "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
                "jobset.sigs.k8s.io/restart-attempt": "0",
                "jobset.sigs.k8s.io/replicatedjob-replicas": str(replicas),
                "jobset.sigs.k8s.io/global-replicas": str(total),
                "jobset.sigs.k8s.io/job-index": str(index),
                "jobset.sigs.k8s.io/job-key": sha1(f"{namespace}/{job_name}"),
                "jobset.sigs.k8s.io/job-global-index": str(global_index),
                "jobset.sigs.k8s.io/group-name": "default",
                "jobset.sigs.k8s.io/group-replicas": str(total),
                "jobset.sigs.k8s.io/job-group-index": str(global_index),
            }
            global_index += 1
            template = copy.deepcopy(rjob["template"])
            spec = template["spec"]
            pod_template = spec["template"]
            pod_meta = pod_template.setdefault("metadata", {})
            pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **keys}
            pod_meta["annotations"] = {**(pod_meta.get("annotations") or {}), **keys}
            pod_template["spec"]["subdomain"] = name  # enableDNSHostnames: the JobSet's headless Service
            job_meta = template.get("metadata") or {}
            job = {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {
                    "name": job_name,
                    "namespace": namespace,
                    "labels": {**(job_meta.get("labels") or {}), **keys},
                    "annotations": {**(job_meta.get("annotations") or {}), **keys},
                    "ownerReferences": controlled_by(jobset, JOBSET_API, "JobSet"),
                },
                "spec": {**spec, "suspend": False},
            }
            jobs.append(kube.create_object("jobs.batch", job))
    return jobs


# -- Job -------------------------------------------------------------------------------------


def batch_job(kube: KubeBackend, namespace: str, name: str, spec: Json, **meta: Any) -> Json:
    return kube.create_object(
        "jobs.batch",
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": namespace, **meta},
            "spec": spec,
        },
    )


def job_pod(kube: KubeBackend, job: Json, index: int) -> Json:
    """The pod the Job controller creates for one completion index of an Indexed Job."""
    meta = job["metadata"]
    template = copy.deepcopy(job["spec"]["template"])
    labels = {**(template["metadata"].get("labels") or {}), COMPLETION_INDEX: str(index)}
    annotations = {**(template["metadata"].get("annotations") or {}), COMPLETION_INDEX: str(index)}
    spec = template["spec"]
    spec["hostname"] = f"{meta['name']}-{index}"
    for each in spec["containers"]:
        each.setdefault("env", []).append(
            {
                "name": "JOB_COMPLETION_INDEX",
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}},
            }
        )
    return kube.create_object(
        "pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": f"{meta['name']}-{index}-",
                "namespace": meta["namespace"],
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": controlled_by(job, "batch/v1", "Job"),
                "finalizers": [JOB_TRACKING_FINALIZER],
            },
            "spec": spec,
        },
    )


# -- LeaderWorkerSet -------------------------------------------------------------------------


def leader_worker_set(
    kube: KubeBackend, namespace: str, name: str, size: int, leader: Json, worker: Json, **meta: Any
) -> Json:
    return kube.create_object(
        "leaderworkersets.leaderworkerset.x-k8s.io",
        {
            "apiVersion": LWS_API,
            "kind": "LeaderWorkerSet",
            "metadata": {"name": name, "namespace": namespace, **meta},
            "spec": {
                "replicas": 1,
                "leaderWorkerTemplate": {
                    "size": size,
                    "restartPolicy": "RecreateGroupOnPodRestart",
                    "leaderTemplate": {"spec": leader},
                    "workerTemplate": {"spec": worker},
                },
            },
        },
    )


def _stateful_set(
    kube: KubeBackend,
    owner: Json,
    owner_api: str,
    owner_kind: str,
    name: str,
    replicas: int,
    labels: Json,
    annotations: Json,
    spec: Json,
    service: str,
    ordinals: int = 0,
) -> Json:
    return kube.create_object(
        "statefulsets.apps",
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {
                "name": name,
                "namespace": owner["metadata"]["namespace"],
                "labels": {LWS + "name": labels[LWS + "name"]},
                "ownerReferences": controlled_by(owner, owner_api, owner_kind),
            },
            "spec": {
                "replicas": replicas,
                "serviceName": service,
                "ordinals": {"start": ordinals},
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels, "annotations": annotations}, "spec": spec},
            },
        },
    )


def _stateful_set_pod(kube: KubeBackend, sts: Json, ordinal: int, extra_labels: Json) -> Json:
    """A pod of a StatefulSet as its controller creates it (then defaulted by LWS's pod webhook)."""
    meta = sts["metadata"]
    template = copy.deepcopy(sts["spec"]["template"])
    name = f"{meta['name']}-{ordinal}"
    spec = template["spec"]
    spec["hostname"], spec["subdomain"] = name, sts["spec"]["serviceName"]
    labels = {
        **template["metadata"]["labels"],
        "statefulset.kubernetes.io/pod-name": name,
        "apps.kubernetes.io/pod-index": str(ordinal),
        **extra_labels,
    }
    return kube.create_object(
        "pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": labels,
                "annotations": template["metadata"].get("annotations") or {},
                "ownerReferences": controlled_by(sts, "apps/v1", "StatefulSet"),
            },
            "spec": spec,
        },
    )


def leader_worker_group(kube: KubeBackend, lws: Json, group: int) -> list[Json]:
    """One group of a LeaderWorkerSet: its leader pod, then its workers (leader first)."""
    meta = lws["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    template = lws["spec"]["leaderWorkerTemplate"]
    size = int(template["size"])
    annotations = {LWS + "size": str(size)}
    revision = {LWS + "template-revision-hash": sha1(str(template))[:16]}
    leaders = kube.get_object("statefulsets.apps", name, namespace) or _stateful_set(
        kube,
        lws,
        LWS_API,
        "LeaderWorkerSet",
        name,
        int(lws["spec"]["replicas"]),
        {LWS + "name": name, LWS + "worker-index": "0", **revision},
        annotations,
        template["leaderTemplate"]["spec"],
        name,
    )
    leader_name = f"{name}-{group}"
    group_key = sha1(f"{namespace}/{leader_name}")
    leader = _stateful_set_pod(
        kube, leaders, group, {LWS + "group-index": str(group), LWS + "group-key": group_key}
    )
    group_labels = {
        LWS + "name": name,
        LWS + "group-index": str(group),
        LWS + "group-key": group_key,
        **revision,
    }
    workers = _stateful_set(
        kube,
        leader,
        "v1",
        "Pod",
        leader_name,
        size - 1,
        group_labels,
        {**annotations, LWS + "leader-name": leader_name},
        template["workerTemplate"]["spec"],
        name,
        ordinals=1,
    )
    members = [
        _stateful_set_pod(kube, workers, ordinal, {LWS + "worker-index": str(ordinal)})
        for ordinal in range(1, size)
    ]
    return [leader, *members]


# -- Deployment ------------------------------------------------------------------------------


def deployment(kube: KubeBackend, namespace: str, name: str, replicas: int, spec: Json, **meta: Any) -> Json:
    labels = {"app": name}
    return kube.create_object(
        "deployments.apps",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, **meta},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": spec},
            },
        },
    )


def replica_set(kube: KubeBackend, deploy: Json) -> Json:
    """The ReplicaSet the Deployment controller makes: `<deployment>-<pod-template-hash>`."""
    meta = deploy["metadata"]
    template_hash = sha1(str(deploy["spec"]["template"]))[:10]
    template = copy.deepcopy(deploy["spec"]["template"])
    labels = {**template["metadata"]["labels"], "pod-template-hash": template_hash}
    template["metadata"]["labels"] = labels
    return kube.create_object(
        "replicasets.apps",
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": f"{meta['name']}-{template_hash}",
                "namespace": meta["namespace"],
                "labels": labels,
                "ownerReferences": controlled_by(deploy, "apps/v1", "Deployment"),
            },
            "spec": {
                "replicas": deploy["spec"]["replicas"],
                "selector": {"matchLabels": labels},
                "template": template,
            },
        },
    )


def replica_set_pod(kube: KubeBackend, rs: Json) -> Json:
    """A pod the ReplicaSet controller creates (again, whenever one of its pods is gone)."""
    meta = rs["metadata"]
    template = copy.deepcopy(rs["spec"]["template"])
    return kube.create_object(
        "pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": f"{meta['name']}-",
                "namespace": meta["namespace"],
                "labels": template["metadata"]["labels"],
                "ownerReferences": controlled_by(rs, "apps/v1", "ReplicaSet"),
            },
            "spec": template["spec"],
        },
    )
