"""Every grouping row through `explain`, with objects of the real API shapes."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bridge import grouping, keys
from bridge.grouping import Kind
from bridge.translate import Defaults
from worker.explain import ExplainError, MemoryReader, explain, load_objects

P = "slurmjob.slinky.slurm.net/"
Obj = dict[str, Any]


def owner(obj: Obj) -> list[Obj]:
    meta = obj["metadata"]
    uid = meta.get("uid") or f"explain:{obj['kind']}/{meta.get('namespace', 'default')}/{meta['name']}"
    return [
        {
            "apiVersion": obj["apiVersion"],
            "kind": obj["kind"],
            "name": meta["name"],
            "uid": uid,
            "controller": True,
        }
    ]


def pod(name: str, owned_by: Obj | None = None, labels: dict[str, str] | None = None, **spec: Any) -> Obj:
    meta: Obj = {"name": name, "labels": labels or {}}
    if owned_by is not None:
        meta["ownerReferences"] = owner(owned_by)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "schedulerName": "slurm-bridge-scheduler",
            "containers": [
                {"name": "main", "image": "x", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}
            ],
            **spec,
        },
    }


def obj(
    api_version: str, kind: str, name: str, annotations: dict[str, str] | None = None, **spec: Any
) -> Obj:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": spec,
    }


async def jobs(*objects: Obj) -> list[Any]:
    return await explain(list(objects), Defaults())


async def test_bare_pod_uses_its_own_annotations() -> None:
    [job] = await jobs(pod("solo") | {"metadata": {"name": "solo", "annotations": {P + "qos": "high"}}})
    assert (job.kind, job.pods, job.job_desc_msg["qos"], job.job_desc_msg["maximum_nodes"]) == (
        "Pod",
        ["default/solo"],
        "high",
        1,
    )


async def test_deployment_pods_take_the_highest_readable_controller_annotations() -> None:
    deployment = obj("apps/v1", "Deployment", "web", {P + "account": "web-team"})
    replica_set = obj("apps/v1", "ReplicaSet", "web-abc")
    replica_set["metadata"]["ownerReferences"] = owner(deployment)
    [a, b] = await jobs(deployment, replica_set, pod("web-abc-1", replica_set), pod("web-abc-2", replica_set))
    assert a.job_desc_msg["account"] == b.job_desc_msg["account"] == "web-team"
    assert a.pods != b.pods  # one job per pod


async def test_job_deadline_becomes_time_limit_in_whole_minutes() -> None:
    job = obj("batch/v1", "Job", "train", {P + "partition": "batch"}, activeDeadlineSeconds=61)
    [explained] = await jobs(job, pod("train-x", job))
    assert explained.kind == "Job"
    assert explained.job_desc_msg["time_limit"] == {"set": True, "infinite": False, "number": 2}
    assert explained.job_desc_msg["partition"] == "batch"


async def test_jobset_annotations_apply_to_its_jobs_pods() -> None:
    jobset = obj("jobset.x-k8s.io/v1alpha2", "JobSet", "js", {P + "wckey": "proj"})
    job = obj("batch/v1", "Job", "js-workers-0", activeDeadlineSeconds=600)
    job["metadata"]["ownerReferences"] = owner(jobset)
    [explained] = await jobs(jobset, job, pod("js-workers-0-0", job))
    assert explained.kind == "JobSet"
    assert explained.job_desc_msg["wckey"] == "proj"
    assert explained.job_desc_msg["time_limit"]["number"] == 10


async def test_leader_worker_set_groups_by_group_key() -> None:
    lws = obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "llm", leaderWorkerTemplate={"size": 2})

    def member(name: str, index: str, worker: str) -> Obj:
        return pod(
            name,
            lws,
            {
                "leaderworkerset.sigs.k8s.io/group-key": f"k{index}",
                "leaderworkerset.sigs.k8s.io/group-index": index,
                "leaderworkerset.sigs.k8s.io/worker-index": worker,
            },
        )

    explained = await jobs(
        lws,
        member("llm-1-1", "1", "1"),
        member("llm-0", "0", "0"),
        member("llm-0-1", "0", "1"),
        member("llm-1", "1", "0"),
    )
    by_name = {e.group: e for e in explained}
    assert by_name["llm-0"].pods == ["default/llm-0", "default/llm-0-1"]
    assert by_name["llm-1"].pods == ["default/llm-1", "default/llm-1-1"]
    assert by_name["llm-0"].job_desc_msg["nodes"] == "2"
    assert by_name["llm-0"].min_pods == 2


async def test_coscheduling_pod_group_with_min_member_and_min_resources() -> None:
    group = obj(
        "scheduling.x-k8s.io/v1alpha1",
        "PodGroup",
        "mpi",
        {P + "reservation": "r1"},
        minMember=3,
        minResources={"cpu": "6", "memory": "512Mi"},
    )
    labels = {"scheduling.x-k8s.io/pod-group": "mpi"}
    [explained] = await jobs(group, *(pod(f"mpi-{i}", labels=labels) for i in range(4)))
    msg = explained.job_desc_msg
    # minMember is how many pods the group waits for; the job asks for a node for each pod it
    # carries, no fewer (Slurm would start it on fewer nodes than pods).
    assert explained.min_pods == 3
    assert (explained.kind, msg["name"], msg["minimum_nodes"], msg["maximum_nodes"], msg["nodes"]) == (
        "PodGroup",
        "mpi",
        4,
        4,
        "4",
    )
    # minResources is the group's total, never a node's size: each node gets the pods' 2 CPUs, 1Gi.
    assert msg["cpus_per_task"] == 2
    assert msg["memory_per_node"]["number"] == 1024
    assert msg["reservation"] == "r1"


async def test_min_resources_do_not_size_the_nodes_of_a_group() -> None:
    # Two 1-CPU pods whose PodGroup says the group needs 2 CPUs: 1 CPU per node.
    group = obj("scheduling.x-k8s.io/v1alpha1", "PodGroup", "pair", minMember=2, minResources={"cpu": "2"})
    labels = {"scheduling.x-k8s.io/pod-group": "pair"}
    one_cpu = [{"name": "main", "image": "x", "resources": {"requests": {"cpu": "1"}}}]
    [explained] = await jobs(group, *(pod(f"pair-{i}", labels=labels, containers=one_cpu) for i in range(2)))
    assert explained.job_desc_msg["cpus_per_task"] == 1


async def test_a_pod_group_whose_minimum_exceeds_all_the_bridge_nodes_is_refused() -> None:
    group = obj("scheduling.x-k8s.io/v1alpha1", "PodGroup", "big", minMember=2, minResources={"cpu": "9"})
    labels = {"scheduling.x-k8s.io/pod-group": "big"}
    members = [pod(f"big-{i}", labels=labels) for i in range(2)]
    bridge_nodes = [node(n, **{keys.LABEL_EXTERNAL_NODE: "true"}) for n in ("a", "b")]
    for bridge_node in bridge_nodes:
        bridge_node["status"]["allocatable"] = {"cpu": "4", "memory": "8Gi"}
    with pytest.raises(
        ExplainError, match=r"PodGroup big: the PodGroup's spec.minResources asks for cpu 9 .* \(8 in"
    ):
        await jobs(group, *members, *bridge_nodes)
    bridge_nodes[1]["status"]["allocatable"]["cpu"] = "5"
    [explained] = await jobs(group, *members, *bridge_nodes)  # 9 CPUs together: it may fit
    assert explained.job_desc_msg["cpus_per_task"] == 2


@pytest.mark.parametrize("phase", ["Pending", "Scheduling", "Running", "Unknown", "Failed", "Finished"])
async def test_a_pod_group_is_placed_whatever_its_phase(phase: str) -> None:
    # The phase is scheduler-plugins' controller's account of the pods, which the coscheduling
    # plugin does not read either: pods re-created under a Failed or Finished PodGroup (a restart)
    # are placed again as its next generation.
    group = obj("scheduling.x-k8s.io/v1alpha1", "PodGroup", "mpi", minMember=2)
    group["status"] = {"phase": phase}
    labels = {"scheduling.x-k8s.io/pod-group": "mpi"}
    [explained] = await jobs(group, *(pod(f"mpi-{i}", labels=labels) for i in range(2)))
    assert (explained.kind, explained.job_desc_msg["nodes"]) == ("PodGroup", "2")


async def test_a_bad_min_resources_quantity_names_the_pod_group() -> None:
    group = obj("scheduling.x-k8s.io/v1alpha1", "PodGroup", "mpi", minMember=1, minResources={"cpu": "lots"})
    labels = {"scheduling.x-k8s.io/pod-group": "mpi"}
    with pytest.raises(ExplainError, match=r"PodGroup default/mpi spec.minResources cpu: 'lots' is not"):
        await jobs(group, pod("mpi-0", labels=labels))


async def test_builtin_pod_group_merges_pod_group_job_and_workload_annotations() -> None:
    workload = obj("scheduling.k8s.io/v1alpha2", "Workload", "wl", {P + "qos": "from-workload"})
    group = obj(
        "scheduling.k8s.io/v1alpha2",
        "PodGroup",
        "pg",
        {P + "qos": "from-pg", P + "account": "from-pg"},
        podGroupTemplateRef={"workload": {"workloadName": "wl"}},
        schedulingPolicy={"gang": {"minCount": 2}},
    )
    job = obj("batch/v1", "Job", "j", {P + "account": "from-job"})
    members = [pod(f"p{i}", job, schedulingGroup={"podGroupName": "pg"}) for i in range(2)]
    [explained] = await jobs(workload, group, job, *members)
    assert explained.kind == "PodGroup"
    assert explained.job_desc_msg["qos"] == "from-workload"
    assert explained.job_desc_msg["account"] == "from-job"
    assert explained.min_pods == 2


@pytest.mark.parametrize("version", ["v1beta1", "v1alpha3"])
async def test_builtin_pod_group_of_kubernetes_1_37_names_its_workload_by_workload_ref(version: str) -> None:
    workload = obj(f"scheduling.k8s.io/{version}", "Workload", "wl", {P + "qos": "from-workload"})
    # 1.36's spec.podGroupTemplateRef.workload is 1.37's spec.workloadRef (its template: templateName).
    group = obj(
        f"scheduling.k8s.io/{version}",
        "PodGroup",
        "pg",
        {P + "qos": "from-pg"},
        workloadRef={"workloadName": "wl", "templateName": "workers"},
        schedulingPolicy={"gang": {"minCount": 3}},
    )
    members = [pod(f"p{i}", schedulingGroup={"podGroupName": "pg"}) for i in range(3)]
    [explained] = await jobs(workload, group, *members)
    assert (explained.kind, explained.min_pods, explained.job_desc_msg["qos"]) == (
        "PodGroup",
        3,
        "from-workload",
    )


@pytest.mark.parametrize(
    ("api_version", "spec", "message"),
    [
        (
            "scheduling.k8s.io/v1beta1",
            {},
            r"\(scheduling.k8s.io/v1beta1\): spec.schedulingPolicy sets neither",
        ),
        (
            "scheduling.k8s.io/v1beta1",
            {"schedulingPolicy": {"gang": {}}},
            r"minCount must be a whole number .*None",
        ),
        ("scheduling.k8s.io/v1alpha3", {"schedulingPolicy": {"gang": {"minCount": "2"}}}, r"not '2'"),
        ("scheduling.k8s.io/v1alpha2", {"schedulingPolicy": {"gang": {"minCount": 0}}}, r"at least 1, not 0"),
        ("scheduling.k8s.io/v1alpha1", {"schedulingPolicy": {"basic": {}}}, r"reads PodGroups at .*v1beta1"),
    ],
)
async def test_a_builtin_pod_group_with_bad_fields_gets_a_clear_message(
    api_version: str, spec: dict[str, Any], message: str
) -> None:
    group = obj(api_version, "PodGroup", "pg", **spec)
    with pytest.raises(ExplainError, match=r"Pod default/p0: PodGroup default/pg .*" + message):
        await jobs(group, pod("p0", schedulingGroup={"podGroupName": "pg"}))


async def test_a_builtin_pod_group_with_a_malformed_workload_ref_is_read_without_it() -> None:
    group = obj(
        "scheduling.k8s.io/v1beta1",
        "PodGroup",
        "pg",
        {P + "qos": "from-pg"},
        workloadRef="wl",  # not an object: no Workload to read, nothing to crash on
        schedulingPolicy={"basic": {}},
    )
    [explained] = await jobs(group, pod("p0", schedulingGroup={"podGroupName": "pg"}))
    assert (explained.min_pods, explained.job_desc_msg["qos"]) == (1, "from-pg")


async def test_a_missing_direct_owner_is_an_error_naming_the_pod() -> None:
    ghost = obj("batch/v1", "Job", "ghost")
    with pytest.raises(
        ExplainError, match=r"Pod default/orphan: Job default/ghost, which owns the pod, does not exist"
    ):
        await jobs(pod("orphan", ghost))


async def test_a_forbidden_supported_owner_is_an_error() -> None:
    from bridge import grouping

    class Forbidding(MemoryReader):
        async def get(self, kind: Kind, namespace: str, name: str) -> Obj | None:
            raise PermissionError("forbidden")

    job = obj("batch/v1", "Job", "secret")
    target = pod("p", job)
    target["metadata"]["namespace"] = "default"
    with pytest.raises(grouping.GroupError, match="may not read Job default/secret"):
        await grouping.resolve(Forbidding([]), target)


async def test_invalid_annotation_names_object_and_key() -> None:
    job = obj("batch/v1", "Job", "bad", {P + "max-nodes": "many"})
    with pytest.raises(ExplainError, match=r'Job default/bad.*max-nodes="many": must be a whole number'):
        await jobs(job, pod("bad-1", job))


def test_loader_rejects_what_is_not_kubernetes_objects() -> None:
    with pytest.raises(ExplainError, match="document 2 is not an object"):
        load_objects("kind: Pod\napiVersion: v1\nmetadata: {name: a}\n---\n- 1\n")
    with pytest.raises(ExplainError, match=r"has no metadata\.name"):
        load_objects("kind: Pod\napiVersion: v1\n")
    assert (
        len(load_objects(json.dumps({"apiVersion": "v1", "kind": "List", "items": [pod("a"), pod("b")]})))
        == 2
    )


def test_the_command_prints_job_desc_msgs_and_fails_with_one_line(tmp_path: Path) -> None:
    command = str(Path(sys.executable).with_name("slurm-bridge"))
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(json.dumps(pod("cli")))
    done = subprocess.run(
        [command, "explain", str(manifest), "--partition", "p1"], capture_output=True, text=True, check=True
    )
    [explained] = json.loads(done.stdout)
    assert explained["job_desc_msg"]["partition"] == "p1"
    assert explained["job_desc_msg"]["flags"] == ["EXTERNAL_JOB"]
    failed = subprocess.run([command, "explain", "-"], input="not: [valid", capture_output=True, text=True)
    assert failed.returncode == 2
    assert failed.stderr.count("\n") == 1
    assert "not YAML or JSON" in failed.stderr


async def test_the_comment_is_the_placement_id_the_worker_would_write() -> None:
    """explain prints what the worker submits, comment included (docs/architecture.md)."""
    solo = pod("solo")
    solo["metadata"]["uid"] = "uid-1"
    [job] = await jobs(solo)
    assert job.job_desc_msg["comment"] == "placement/slurm-bridge/default/solo/uid-1@uid-1"
    claimed = pod("claimed")
    claimed["metadata"]["annotations"] = {"slurm-bridge/placement": "placement/prod/default/claimed/u@u"}
    [job] = await jobs(claimed)
    assert job.job_desc_msg["comment"] == "placement/prod/default/claimed/u@u"


def node(name: str, **labels: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


async def test_node_objects_of_the_input_give_excluded_nodes_as_the_worker_computes_them() -> None:
    bridge_node = {keys.LABEL_EXTERNAL_NODE: "true"}
    picky = pod("picky", nodeSelector={"kubernetes.io/hostname": "b"})
    # "c" is not one of the bridge's nodes (no bridge label): it is not the bridge's to exclude.
    [job] = await jobs(picky, node("a", **bridge_node), node("b", **bridge_node), node("c"))
    assert job.job_desc_msg["excluded_nodes"] == ["a"]
    assert job.unschedulable is None
    [job] = await jobs(pod("solo"), node("a", **bridge_node))
    assert "excluded_nodes" not in job.job_desc_msg


async def test_a_group_no_node_can_take_is_said_to_be_unschedulable() -> None:
    nowhere = pod("nowhere", nodeSelector={"kubernetes.io/hostname": "z"})
    [job] = await jobs(nowhere, node("a", **{keys.LABEL_EXTERNAL_NODE: "true"}))
    assert job.unschedulable == (
        "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
    )


async def test_dra_requests_show_the_gres_and_cpus_they_become() -> None:
    gpu, cpu = (
        "deviceclass.resource.kubernetes.io/gpu.nvidia.com",
        "deviceclass.resource.kubernetes.io/dra.cpu",
    )
    requests = {gpu: "2", cpu: "4", "memory": "1Gi"}
    container = {
        "name": "main",
        "image": "x",
        "resources": {"requests": requests, "limits": {gpu: "2", cpu: "4"}},
    }
    [job] = await jobs(pod("trainer", containers=[container]))
    assert job.job_desc_msg["tres_per_node"] == "gres/gpu=2"
    assert job.job_desc_msg["cpus_per_task"] == 4
    assert job.dra_devices == [
        {
            "pod": "default/trainer",
            "container": "main",
            "resource": cpu,
            "count": 4,
            "claim_request": "container-0-request-0",
            "slurm": "cpus_per_task",
        },
        {
            "pod": "default/trainer",
            "container": "main",
            "resource": gpu,
            "count": 2,
            "claim_request": "container-0-request-1",
            "slurm": "tres_per_node gres/gpu",
        },
    ]
    [plain] = await jobs(pod("plain"))
    assert plain.dra_devices == []


async def test_leader_worker_set_pods_as_its_controller_owns_them_form_one_group() -> None:
    # The LeaderWorkerSet controller's ownership: the LWS owns the leader StatefulSet, which owns
    # the leader pods; each leader pod owns its group's worker StatefulSet, which owns the workers.
    lws = obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "llm", leaderWorkerTemplate={"size": 3})
    leaders = obj("apps/v1", "StatefulSet", "llm")
    leaders["metadata"]["ownerReferences"] = owner(lws)
    labels = {
        "leaderworkerset.sigs.k8s.io/name": "llm",
        "leaderworkerset.sigs.k8s.io/group-index": "0",
        "leaderworkerset.sigs.k8s.io/group-key": "k0",
    }
    leader = pod("llm-0", leaders, {**labels, "leaderworkerset.sigs.k8s.io/worker-index": "0"})
    workers = obj("apps/v1", "StatefulSet", "llm-0")
    workers["metadata"]["ownerReferences"] = owner(leader)
    members = [
        pod(f"llm-0-{i}", workers, {**labels, "leaderworkerset.sigs.k8s.io/worker-index": str(i)})
        for i in (1, 2)
    ]

    [explained] = await jobs(lws, leaders, leader, workers, *members)
    assert explained.kind == "LeaderWorkerSet"
    assert explained.pods == ["default/llm-0", "default/llm-0-1", "default/llm-0-2"]
    assert (explained.min_pods, explained.job_desc_msg["nodes"]) == (3, "3")


async def test_a_group_of_unequal_pods_is_a_heterogeneous_job_of_one_component_per_shape() -> None:
    group = obj("scheduling.x-k8s.io/v1alpha1", "PodGroup", "mixed", minMember=2)
    labels = {"scheduling.x-k8s.io/pod-group": "mixed"}
    big = [{"name": "main", "image": "x", "resources": {"requests": {"cpu": "4", "memory": "1Gi"}}}]
    [explained] = await jobs(
        group, pod("mixed-0", labels=labels, containers=big), pod("mixed-1", labels=labels)
    )
    # As submitted: `{"jobs": [...]}`, each component asking for its own pod's request.
    components = explained.job_desc_msg["jobs"]
    assert [(c["nodes"], c.get("cpus_per_task")) for c in components] == [("1", 4), ("1", 2)]
    assert all(c["comment"] == components[0]["comment"] for c in components)
    assert explained.sizing_note is None  # each pod is given what it asks for
    assert explained.pods == ["default/mixed-0", "default/mixed-1"]


async def test_a_group_sized_by_its_largest_pod_says_what_it_costs() -> None:
    group = obj(
        "scheduling.x-k8s.io/v1alpha1",
        "PodGroup",
        "mixed",
        annotations={"slurm-bridge/sizing": "largest-pod"},
        minMember=2,
    )
    labels = {"scheduling.x-k8s.io/pod-group": "mixed"}
    big = [{"name": "main", "image": "x", "resources": {"requests": {"cpu": "4", "memory": "1Gi"}}}]
    [explained] = await jobs(
        group, pod("mixed-0", labels=labels, containers=big), pod("mixed-1", labels=labels)
    )
    assert "jobs" not in explained.job_desc_msg
    assert explained.sizing_note is not None
    assert explained.sizing_note.startswith(
        "every node of the job is asked for 4 CPUs: the group's largest pod"
    )
    [equal] = await jobs(group, pod("mixed-0", labels=labels), pod("mixed-1", labels=labels))
    assert equal.sizing_note is None


async def test_a_train_jobs_pods_are_grouped_without_reading_the_train_job() -> None:
    # Trainer's objects: the TrainJob controls its JobSet and (with the coscheduling policy) its
    # PodGroup; JobSet's Job controls the pod. The bridge has no RBAC for TrainJobs.
    trainjob = obj("trainer.kubeflow.org/v1alpha1", "TrainJob", "llama")
    jobset = obj("jobset.x-k8s.io/v1alpha2", "JobSet", "llama")
    jobset["metadata"]["ownerReferences"] = owner(trainjob)
    job = obj("batch/v1", "Job", "llama-node-0")
    job["metadata"]["ownerReferences"] = owner(jobset)
    pod_group = obj("scheduling.x-k8s.io/v1alpha1", "PodGroup", "llama", minMember=2)
    pod_group["metadata"]["ownerReferences"] = owner(trainjob)
    objects = [trainjob, jobset, job, pod_group]

    class Recording(MemoryReader):
        """The objects, noting the kind of every object read."""

        def __init__(self, objects: list[Obj]) -> None:
            super().__init__(objects)
            self.read: list[str] = []

        async def get(self, kind: Kind, namespace: str, name: str) -> Obj | None:
            self.read.append(kind.kind)
            return await super().get(kind, namespace, name)

    labelled = [pod(f"llama-node-0-{i}", job, {"scheduling.x-k8s.io/pod-group": "llama"}) for i in (0, 1)]
    for each in [*objects, *labelled]:
        each["metadata"]["namespace"] = "default"  # as the API server has them (explain adds it)
    reader = Recording([*objects, *labelled])
    [group] = {(await grouping.resolve(reader, p)).key for p in labelled}
    assert group.startswith("default/podgroup/llama/")
    assert reader.read == ["PodGroup", "PodGroup"]  # the label decides: no owner is read

    # A runtime without the coscheduling policy: the walk reads the Job and the JobSet and stops
    # at the TrainJob, unread; each pod is placed on its own, as a JobSet's are.
    plain = pod("llama-node-0-0", job)
    plain["metadata"]["namespace"] = "default"
    reader = Recording([*objects, plain])
    resolved = await grouping.resolve(reader, plain)
    assert (resolved.kind, resolved.min_pods) == ("JobSet", 1)
    assert reader.read == ["Job", "JobSet"]
