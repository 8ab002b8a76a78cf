import json
import re
from typing import Any

import pytest

from bridge.models import JobDescription
from bridge.quantity import parse_quantity
from bridge.resources import Capacity, PodSpecError, group_resources, pod_resources, total_allocatable
from bridge.translate import Defaults, GroupShape, TranslationError, build_job, build_pod_job

P = "slurmjob.slinky.slurm.net/"


def pod(
    containers: list[dict[str, Any]], annotations: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team-a", "name": "trainer", "uid": "u1", "annotations": annotations or {}},
        "spec": {"containers": containers, **spec},
    }


def container(
    name: str = "main",
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {"name": name, "resources": {"requests": requests or {}, "limits": limits or {}}, **extra}


def test_plain_pod_becomes_an_exclusive_one_node_external_job() -> None:
    job = build_pod_job(pod([container(requests={"cpu": "1500m", "memory": "1Gi"})]), defaults=Defaults())
    assert job.to_slurm() == {
        "name": "team-a/trainer",
        "flags": ["EXTERNAL_JOB"],
        "admin_comment": '{"pods":["team-a/trainer"]}',
        "partition": "slurm-bridge",
        "nodes": "1",
        "minimum_nodes": 1,
        "maximum_nodes": 1,
        "tasks_per_node": 1,
        "cpus_per_task": 2,
        "memory_per_node": {"set": True, "infinite": False, "number": 1024},
        "shared": ["none"],
        "mcs_label": "kubernetes",
        "current_working_directory": "/tmp",
    }
    assert json.loads(job.admin_comment) == {"pods": ["team-a/trainer"]}


def test_cpus_are_the_larger_of_requests_and_limits() -> None:
    job = build_pod_job(pod([container(requests={"cpu": "1"}, limits={"cpu": "3"})]), defaults=Defaults())
    assert job.cpus_per_task == 3


def test_sidecars_add_up_and_init_containers_peak() -> None:
    spec_pod = pod(
        [container("a", requests={"cpu": "1", "memory": "100Mi"}), container("b", requests={"cpu": "1"})],
        initContainers=[
            container("setup", requests={"cpu": "4", "memory": "50Mi"}),
            container("proxy", requests={"cpu": "1", "memory": "10Mi"}, restartPolicy="Always"),
        ],
        overhead={"memory": "5Mi"},
    )
    resources = pod_resources(spec_pod)
    # regular 2 CPUs + sidecar 1 = 3 < init peak 4; memory 100 + 10 sidecar + 5 overhead
    job = build_pod_job(spec_pod, defaults=Defaults())
    assert job.cpus_per_task == 4
    assert job.memory_per_node is not None
    assert job.memory_per_node.number == 115
    assert resources.requests["cpu"] == 4


def test_pod_level_resources_win() -> None:
    job = build_pod_job(
        pod([container(requests={"cpu": "1"})], resources={"limits": {"cpu": "6", "memory": "2Gi"}}),
        defaults=Defaults(),
    )
    assert (job.cpus_per_task, job.memory_per_node and job.memory_per_node.number) == (6, 2048)


def test_gpus_become_gres_and_the_largest_count_wins() -> None:
    job = build_pod_job(
        pod([container(limits={"nvidia.com/gpu": "2"}), container("b", limits={"amd.com/gpu": "1"})]),
        defaults=Defaults(),
    )
    # per-resource totals are 2 NVIDIA and 1 AMD: the single largest count is what Slurm is asked for
    assert job.tres_per_node == "gres/gpu=2"


def test_dra_gpu_class_becomes_gpu_gres_counted_like_any_gpu() -> None:
    # Node sync registers GPUs untyped (gpu:N); Slurm refuses a typed request there (error 2014).
    job = build_pod_job(
        pod([container(limits={"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "1"})]),
        defaults=Defaults(),
    )
    assert job.tres_per_node == "gres/gpu=1"


def test_annotations_override_derived_values() -> None:
    job = build_pod_job(
        pod(
            [container(requests={"cpu": "1", "memory": "1Gi"}, limits={"nvidia.com/gpu": "1"})],
            {
                P + "partition": "gpu",
                P + "cpu-per-task": "8",
                P + "mem-per-node": "64Gi",
                P + "gres": "gres/gpu:a100=4",
                P + "exclusive": "false",
                P + "timelimit": "90",
                P + "priority": "7",
                P + "account": "physics",
                P + "job-name": "my-job",
            },
        ),
        defaults=Defaults(partition="ignored", mcs_label="kubernetes"),
    )
    slurm = job.to_slurm()
    assert slurm["partition"] == "gpu"
    assert slurm["cpus_per_task"] == 8
    assert slurm["memory_per_node"] == {"set": True, "infinite": False, "number": 65536}
    assert slurm["tres_per_node"] == "gres/gpu:a100=4"
    assert slurm["shared"] == []
    assert slurm["time_limit"] == {"set": True, "infinite": False, "number": 90}
    assert slurm["priority"] == {"set": True, "infinite": False, "number": 7}
    assert slurm["account"] == "physics"
    assert slurm["name"] == "my-job"


def test_excluded_nodes_never_required_nodes() -> None:
    job = build_pod_job(pod([container()]), defaults=Defaults(), excluded_nodes=["n2", "n1", "gpu-a"])
    slurm = job.to_slurm()
    assert slurm["excluded_nodes"] == ["gpu-a,n[1-2]"]
    assert "required_nodes" not in slurm


def test_a_pod_pinned_to_one_of_a_thousand_nodes_sends_two_ranges() -> None:
    """Not 999 names: one hostlist expression, as slurmctld writes them (and takes them)."""
    names = [f"k8s-node-{index:04d}" for index in range(1, 1001)]
    others = [name for name in names if name != "k8s-node-0314"]
    job = build_pod_job(pod([container()]), defaults=Defaults(), excluded_nodes=others)
    assert job.excluded_nodes == others  # what the placement knows: every name
    assert job.to_slurm()["excluded_nodes"] == ["k8s-node-[0001-0313,0315-1000]"]
    assert job.submission() == {"job": job.to_slurm()}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"topologySpreadConstraints": [{"maxSkew": 1}]}, "topologySpreadConstraints is not supported"),
        ({"resourceClaims": [{"name": "gpu"}]}, "resourceClaims is not supported"),
    ],
)
def test_unplaceable_pods_are_refused_with_a_reason(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(TranslationError, match=message):
        build_pod_job(pod([container()], **spec), defaults=Defaults())


def test_unsupported_dra_class_and_cpu_mix_are_refused() -> None:
    with pytest.raises(TranslationError) as caught:
        build_pod_job(
            pod(
                [
                    container(
                        requests={"cpu": "1"}, limits={"deviceclass.resource.kubernetes.io/fpga.example": "1"}
                    ),
                    container("b", requests={"deviceclass.resource.kubernetes.io/dra.cpu": "2"}),
                ]
            ),
            defaults=Defaults(),
        )
    assert 'unsupported DRA device class "fpga.example"' in str(caught.value)
    assert '"cpu" and "deviceclass.resource.kubernetes.io/dra.cpu" cannot both be requested' in str(
        caught.value
    )


def test_bad_annotation_and_bad_quantity_are_both_reported() -> None:
    with pytest.raises(TranslationError) as caught:
        build_pod_job(
            pod([container(requests={"memory": "lots"})], {P + "min-nodes": "x"}), defaults=Defaults()
        )
    assert "memory" in str(caught.value)
    assert "min-nodes" in str(caught.value)


# -- groups: per-node resources are the largest pod's, resource by resource ----


def member(
    name: str, requests: dict[str, str] | None = None, limits: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team-a", "name": name, "uid": name},
        "spec": {"containers": [container(requests=requests, limits=limits)]},
    }


def group_job(*pods: dict[str, Any], shape: GroupShape | None = None, **kwargs: Any) -> JobDescription:
    return build_job(
        list(pods), annotations=None, shape=shape or GroupShape(name="g"), defaults=Defaults(), **kwargs
    )


DRA_GPU = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"
DRA_CPU = "deviceclass.resource.kubernetes.io/dra.cpu"


@pytest.mark.parametrize(
    ("pods", "cpus", "memory_mib", "gres"),
    [
        pytest.param(
            [member("a", limits={"nvidia.com/gpu": "2"}), member("b", limits={"nvidia.com/gpu": "1"})],
            None,
            None,
            "gres/gpu=2",
            id="2-gpu-then-1-gpu",
        ),
        pytest.param(
            [member("a", limits={"nvidia.com/gpu": "1"}), member("b", limits={"nvidia.com/gpu": "2"})],
            None,
            None,
            "gres/gpu=2",
            id="1-gpu-then-2-gpu",
        ),
        pytest.param(
            [member("a", limits={"nvidia.com/gpu": "2"}), member("b")],
            None,
            None,
            "gres/gpu=2",
            id="gpu-pod-then-cpu-only-pod",
        ),
        pytest.param(
            [member("a", limits={"amd.com/gpu": "4"}), member("b", limits={"amd.com/gpu": "1"})],
            None,
            None,
            "gres/gpu=4",
            id="amd",
        ),
        pytest.param(
            [member("a", limits={"amd.com/gpu": "1"}), member("b", limits={"nvidia.com/gpu": "3"})],
            None,
            None,
            "gres/gpu=3",
            id="vendors-mixed-largest-count",
        ),
        pytest.param(
            [member("a", limits={DRA_GPU: "3"}), member("b", limits={DRA_GPU: "1"})],
            None,
            None,
            "gres/gpu=3",
            id="dra-class",
        ),
        pytest.param(
            [
                member("a", requests={"cpu": "8", "memory": "1Gi"}, limits={"nvidia.com/gpu": "1"}),
                member("b", requests={"cpu": "2", "memory": "4Gi"}, limits={"nvidia.com/gpu": "2"}),
            ],
            8,
            4096,
            "gres/gpu=2",
            id="each-resource-from-a-different-pod",
        ),
        pytest.param(
            [member("a", requests={"cpu": "500m"}, limits={"cpu": "3"}), member("b", requests={"cpu": "2"})],
            3,
            None,
            None,
            id="cpu-limit-counts",
        ),
        pytest.param(
            [member("a", requests={DRA_CPU: "6"}), member("b", requests={DRA_CPU: "2", "memory": "100Mi"})],
            6,
            100,
            None,
            id="dra-cpu",
        ),
        pytest.param(
            [member("a", requests={"memory": "1.5Mi"}), member("b", requests={"memory": "1Mi"})],
            None,
            2,
            None,
            id="memory-rounded-up",
        ),
    ],
)
def test_group_per_node_resources_are_the_largest_pods(
    pods: list[dict[str, Any]], cpus: int | None, memory_mib: int | None, gres: str | None
) -> None:
    job = group_job(*pods)
    assert job.cpus_per_task == cpus
    assert (job.memory_per_node.number if job.memory_per_node else None) == memory_mib
    assert job.tres_per_node == gres
    assert (job.nodes, job.minimum_nodes, job.maximum_nodes) == (str(len(pods)), len(pods), len(pods))


def test_group_resources_do_not_depend_on_pod_order() -> None:
    pods = [
        member("a", requests={"cpu": "1", "memory": "2Gi"}, limits={"nvidia.com/gpu": "2"}),
        member("b", requests={"cpu": "4"}, limits={DRA_GPU: "2"}),
        member("c", requests={"memory": "3Gi"}, limits={"amd.com/gpu": "1"}),
    ]
    jobs = {group_job(*order).model_dump_json(exclude={"admin_comment"}) for order in (pods, pods[::-1])}
    assert len(jobs) == 1
    # a tie between resources goes to the first name in sorted order, not to dict order
    assert group_job(*pods).tres_per_node == "gres/gpu=2"


# -- PodGroup spec.minResources: the group's total (scheduler-plugins), never a node's size ------


def test_min_resources_never_size_a_node() -> None:
    # A Kubeflow TrainJob: three 3-CPU pods, whose PodGroup says the group needs 9 CPUs in all.
    pods = [member(f"node-{i}", requests={"cpu": "3", "memory": "4Gi"}) for i in range(3)]
    shape = GroupShape(name="train", min_nodes=3, min_resources=(("cpu", "9"), ("memory", "12Gi")))
    job = group_job(*pods, shape=shape)
    assert job.cpus_per_task == 3
    assert job.memory_per_node is not None
    assert job.memory_per_node.number == 4096


def test_min_resources_do_not_size_nodes_of_small_pods() -> None:
    shape = GroupShape(name="g", min_resources=(("cpu", "2"),))
    assert (
        group_job(
            member("a", requests={"cpu": "1"}), member("b", requests={"cpu": "1"}), shape=shape
        ).cpus_per_task
        == 1
    )


def capacity(nodes: int, **allocatable: str) -> Capacity:
    return Capacity(nodes, {name.replace("_", "/"): parse_quantity(v) for name, v in allocatable.items()})


@pytest.mark.parametrize(
    ("min_resources", "asked", "have"),
    [
        ((("cpu", "9"),), "cpu 9", "8"),
        ((("cpu", "4"), ("memory", "17Gi")), "memory 17Gi", "16Gi"),
        ((("nvidia.com/gpu", "1"),), "nvidia.com/gpu 1", "0"),
    ],
)
def test_a_group_whose_minimum_exceeds_all_the_bridge_nodes_is_refused(
    min_resources: tuple[tuple[str, str], ...], asked: str, have: str
) -> None:
    shape = GroupShape(name="train", min_resources=min_resources)
    message = (
        f"the PodGroup's spec.minResources asks for {asked} for the whole group, more than all 2 of the "
        f"bridge's nodes have together ({have} in their status.allocatable); lower "
        "spec.minResources or add nodes"
    )
    with pytest.raises(TranslationError, match=f"^{re.escape(message)}$"):
        group_job(member("a"), member("b"), shape=shape, capacity=capacity(2, cpu="8", memory="16Gi"))


@pytest.mark.parametrize(
    "min_resources",
    [
        (("cpu", "8"), ("memory", "16Gi")),  # exactly what the nodes have together
        (("pods", "2"),),
        # Devices requested through DRA are not in a node's allocatable: cannot be judged here.
        (("deviceclass.resource.kubernetes.io/gpu.nvidia.com", "4"),),
    ],
)
def test_a_group_whose_minimum_fits_all_the_bridge_nodes_is_placed(
    min_resources: tuple[tuple[str, str], ...],
) -> None:
    shape = GroupShape(name="train", min_resources=min_resources)
    job = group_job(
        member("a"), member("b"), shape=shape, capacity=capacity(2, cpu="8", memory="16Gi", pods="220")
    )
    assert job.cpus_per_task is None  # the pods ask for no CPUs; the minimum sizes nothing


def test_without_known_nodes_the_minimum_is_not_judged() -> None:
    # No bridge node is known (Slurm's node names alone): nothing to compare with.
    shape = GroupShape(name="train", min_resources=(("cpu", "1000"),))
    assert group_job(member("a"), shape=shape, capacity=None).nodes == "1"


def test_total_allocatable_adds_up_the_nodes() -> None:
    def node(**allocatable: str) -> dict[str, Any]:
        return {"metadata": {"name": "n"}, "status": {"allocatable": allocatable}}

    total = total_allocatable(
        [node(cpu="4", memory="8Gi"), node(cpu="3500m", memory="lots"), {"metadata": {}}]
    )
    assert total == Capacity(3, {"cpu": parse_quantity("7500m"), "memory": parse_quantity("8Gi")})


# -- annotations whose values upstream accepts, with upstream's meaning on the job ----------------


@pytest.mark.parametrize(
    ("value", "shared"), [("false", []), ("False", []), ("yes", ["none"]), ("", ["none"])]
)
def test_exclusive_annotation_as_upstream(value: str, shared: list[str]) -> None:
    job = build_pod_job(pod([container()], {P + "exclusive": value}), defaults=Defaults())
    assert job.shared == shared


def test_zero_cpus_and_memory_are_sent_as_upstream_sends_them() -> None:
    # cpu-per-task 0: Slurm gives the task 1 CPU; mem-per-node 0: all of the node's memory.
    job = build_pod_job(
        pod(
            [container(requests={"cpu": "2", "memory": "1Gi"})],
            {P + "cpu-per-task": "0", P + "mem-per-node": "0"},
        ),
        defaults=Defaults(),
    )
    assert job.to_slurm()["cpus_per_task"] == 0
    assert job.to_slurm()["memory_per_node"] == {"set": True, "infinite": False, "number": 0}


def test_an_empty_gres_annotation_asks_for_no_gres() -> None:
    job = build_pod_job(
        pod([container(limits={"nvidia.com/gpu": "2"})], {P + "gres": ""}), defaults=Defaults()
    )
    assert "tres_per_node" not in job.to_slurm()


def test_an_empty_job_name_annotation_names_the_job_empty() -> None:
    job = build_pod_job(pod([container()], {P + "job-name": ""}), defaults=Defaults())
    assert job.to_slurm()["name"] == ""


def test_min_nodes_zero_is_sent() -> None:
    job = group_job(member("a"), member("b"), shape=GroupShape(name="g", min_nodes=2))
    assert job.minimum_nodes == 2
    annotated = build_job(
        [member("a"), member("b")],
        annotations={P + "min-nodes": "0"},
        shape=GroupShape(name="g", min_nodes=2),
        defaults=Defaults(),
    )
    assert annotated.minimum_nodes == 0


def test_unknown_annotations_are_ignored_as_upstream_ignores_them() -> None:
    plain = build_pod_job(pod([container()]), defaults=Defaults())
    job = build_pod_job(pod([container()], {P + "timelimt": "10", P + "colour": "blue"}), defaults=Defaults())
    assert job == plain


def test_group_resources_name_the_pod_with_a_bad_quantity() -> None:
    with pytest.raises(PodSpecError, match=r"pod team-a/b: .*memory"):
        group_resources([member("a"), member("b", requests={"memory": "lots"})])


@pytest.mark.parametrize(
    ("excluded", "expected"),
    [(None, None), ([], None), (["n2", "n1", "n2"], ["n1", "n2"]), (("n3",), ["n3"])],
)
def test_build_job_excluded_nodes(
    excluded: list[str] | tuple[str, ...] | None, expected: list[str] | None
) -> None:
    job = group_job(member("a"), excluded_nodes=excluded)
    assert job.excluded_nodes == expected
    assert "required_nodes" not in job.to_slurm()
