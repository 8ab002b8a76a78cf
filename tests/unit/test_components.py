"""Heterogeneous jobs in the domain: which groups split, what each component asks, how a job reads back.

bridge/components.py splits a group by pod shape; bridge/translate.py's build_parts_job makes one
component per part; bridge/slurm_jobs.py reads a job given as its components. The real Slurm side
is tests/slurm/test_het_jobs.py and tests/e2e/test_het_groups.py.
"""

from fractions import Fraction
from typing import Any

import pytest

from bridge.components import SizingError, component_summary, sizing_of, split_by_shape
from bridge.device_classes import DEFAULT_DEVICE_CLASSES
from bridge.models import JobDescription
from bridge.resources import Capacity
from bridge.slurm_jobs import het_offset, job_event_of
from bridge.sweep import job_facts
from bridge.translate import Defaults, GroupShape, TranslationError, build_parts_job
from tests.unit.test_translate import member

P = "slurmjob.slinky.slurm.net/"
GPU = "nvidia.com/gpu"


def leader_and_workers(workers: int = 3) -> list[dict[str, Any]]:
    """An LWS-like group: a 2-CPU leader without GPUs and 8-GPU, 16-CPU workers."""
    leader = member("leader", {"cpu": "2", "memory": "4Gi"})
    return [leader] + [
        member(f"w{i}", {"cpu": "16", "memory": "64Gi", GPU: "8"}, {GPU: "8"}) for i in range(workers)
    ]


def split(
    pods: list[dict[str, Any]], annotations: dict[str, str] | None = None, sizing: Any = "per-pod"
) -> Any:
    return split_by_shape(pods, annotations, sizing=sizing, devices=DEFAULT_DEVICE_CLASSES)


def het_job(pods: list[dict[str, Any]], annotations: dict[str, str] | None = None) -> JobDescription:
    parts = split(pods, annotations)
    return build_parts_job(
        [(part, None) for part in parts],
        annotations=annotations,
        shape=GroupShape(name="g"),
        defaults=Defaults(),
    )


# -- which groups split --------------------------------------------------------------------------


def names(parts: list[list[dict[str, Any]]]) -> list[list[str]]:
    return [[p["metadata"]["name"] for p in part] for part in parts]


def test_a_group_of_two_shapes_splits_with_the_gres_component_first() -> None:
    # Slurm picks nodes component by component: the GPU workers go first, or the leader's
    # component could take a GPU node they need (tests/e2e/test_het_groups.py).
    pods = leader_and_workers()
    assert names(split(pods)) == [["w0", "w1", "w2"], ["leader"]]
    # Interleaved members keep their order within each shape.
    assert names(split([pods[2], pods[0], pods[1]])) == [["w1", "w0"], ["leader"]]


def test_components_with_node_rules_come_before_those_without_and_ties_keep_their_order() -> None:
    small, big, pinned = (
        member("small", {"cpu": "1"}),
        member("big", {"cpu": "8"}),
        member("pinned", {"cpu": "2"}),
    )
    pinned["spec"]["nodeSelector"] = {"pool": "fast"}
    assert names(split([small, big, pinned])) == [["pinned"], ["small"], ["big"]]


def test_what_binding_adds_to_a_pod_does_not_change_its_component() -> None:
    # A placement read again after binding (a reset, `explain` of a running group) must find
    # the components it submitted: nodeName and the managed-node toleration are binding's.
    pods = leader_and_workers(2)
    before = names(split(pods))
    for i, pod in enumerate(pods):
        pod["spec"]["nodeName"] = f"n{i}"
        if i:
            toleration = {
                "key": "slinky.slurm.net/managed-node",
                "operator": "Equal",
                "value": "s",
                "effect": "NoExecute",
            }
            pod["spec"]["tolerations"] = [toleration]
    assert names(split(pods)) == before


def test_node_rules_alone_make_a_shape() -> None:
    a, b = member("a", {"cpu": "1"}), member("b", {"cpu": "1"})
    b["spec"]["nodeSelector"] = {"pool": "gpu"}
    assert len(split([a, b])) == 2


@pytest.mark.parametrize(
    ("why", "pods", "annotations", "sizing"),
    [
        ("equal pods", [member("a", {"cpu": "2"}), member("b", {"cpu": "2"})], None, "per-pod"),
        ("a single pod", [member("a", {"cpu": "2"})], None, "per-pod"),
        ("largest-pod sizing", leader_and_workers(), None, "largest-pod"),
        ("cpu-per-task sizes every node", leader_and_workers(), {P + "cpu-per-task": "4"}, "per-pod"),
        ("mem-per-node sizes every node", leader_and_workers(), {P + "mem-per-node": "1024"}, "per-pod"),
        ("gres sizes every node", leader_and_workers(), {P + "gres": "gpu:1"}, "per-pod"),
        ("min-nodes counts the nodes", leader_and_workers(), {P + "min-nodes": "2"}, "per-pod"),
        ("an annotation that does not parse", leader_and_workers(), {P + "cpu-per-task": "x"}, "per-pod"),
        (
            "a DRA pod",
            [
                member("a", {"cpu": "1"}),
                member("b", {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "1"}),
            ],
            None,
            "per-pod",
        ),
    ],
)
def test_groups_that_stay_one_job(
    why: str, pods: list[dict[str, Any]], annotations: dict[str, str] | None, sizing: Any
) -> None:
    assert split(pods, annotations, sizing) == [pods], why


def test_the_workload_chooses_its_sizing_over_the_installations() -> None:
    assert sizing_of({"slurm-bridge/sizing": "largest-pod"}, "per-pod") == "largest-pod"
    assert sizing_of({"slurm-bridge/sizing": " per-pod "}, "largest-pod") == "per-pod"
    assert sizing_of({}, "largest-pod") == "largest-pod"
    with pytest.raises(SizingError, match=r'"exact" is neither "per-pod"'):
        sizing_of({"slurm-bridge/sizing": "exact"}, "per-pod")


# -- what each component asks for -------------------------------------------------------------------


def test_each_component_asks_for_what_its_pods_ask_for() -> None:
    job = het_job(leader_and_workers())
    workers, leader = job.components
    assert (leader.nodes, leader.minimum_nodes, leader.maximum_nodes) == ("1", 1, 1)
    assert (leader.cpus_per_task, leader.tres_per_node) == (2, None)
    assert leader.memory_per_node is not None
    assert leader.memory_per_node.number == 4096
    assert (workers.nodes, workers.cpus_per_task, workers.tres_per_node) == ("3", 16, "gres/gpu=8")
    assert workers.memory_per_node is not None
    assert workers.memory_per_node.number == 65536
    # Reserved = asked: 2 + 3 x 16 CPUs and 24 GPUs, where one job would hold 64 CPUs and 32 GPUs.
    reserved_cpus = sum(int(c.nodes) * (c.cpus_per_task or 0) for c in job.components)
    assert reserved_cpus == 2 + 3 * 16
    # The whole group's description lists every pod, in component order; each component its own.
    assert job.pod_keys == ["team-a/w0", "team-a/w1", "team-a/w2", "team-a/leader"]
    assert leader.pod_keys == ["team-a/leader"]
    assert workers.pod_keys == ["team-a/w0", "team-a/w1", "team-a/w2"]
    assert all(c.flags == ["EXTERNAL_JOB"] for c in job.components)


def test_the_submission_carries_every_component_with_the_placement_id() -> None:
    job = het_job(leader_and_workers(2)).with_comment("placement/x/team-a/g@1")
    body = job.submission()
    assert set(body) == {"jobs"}
    jobs = body["jobs"]
    assert isinstance(jobs, list)
    assert len(jobs) == 2
    assert [component["comment"] for component in jobs] == ["placement/x/team-a/g@1"] * 2
    assert all("components" not in component for component in jobs)
    # An ordinary job is submitted as before.
    plain = het_job([member("a", {"cpu": "1"}), member("b", {"cpu": "1"})])
    assert not plain.components
    assert set(plain.submission()) == {"job"}


def test_annotations_and_per_component_exclusions_apply() -> None:
    pods = leader_and_workers(1)
    parts = split(pods)
    job = build_parts_job(
        [(parts[0], ["gpu-1"]), (parts[1], ["cpu-1", "cpu-2"])],
        annotations={P + "partition": "gpu", P + "timelimit": "30"},
        shape=GroupShape(name="g"),
        defaults=Defaults(),
    )
    assert [c.pod_keys for c in job.components] == [["team-a/w0"], ["team-a/leader"]]
    assert [c.excluded_nodes for c in job.components] == [["gpu-1"], ["cpu-1", "cpu-2"]]
    assert [c.partition for c in job.components] == ["gpu", "gpu"]
    assert all(c.time_limit is not None and c.time_limit.number == 30 for c in job.components)


def test_a_pod_group_whose_total_no_node_set_holds_is_refused_as_a_whole() -> None:
    shape = GroupShape(name="g", min_resources=(("cpu", "1000"),))
    parts = split(leader_and_workers(1))
    with pytest.raises(TranslationError, match="minResources"):
        build_parts_job(
            [(part, None) for part in parts],
            annotations=None,
            shape=shape,
            defaults=Defaults(),
            capacity=Capacity(nodes=2, allocatable={"cpu": Fraction(64)}),
        )


def test_component_summary() -> None:
    assert component_summary([1, 8]) == "2 components: 1 + 8 pods"


# -- reading a heterogeneous job back ------------------------------------------------------------------


def component(job_id: int, offset: int, state: str, nodes: list[str], pods: list[str]) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "het_job_id": {"set": True, "infinite": False, "number": job_id - offset},
        "het_job_offset": {"set": True, "infinite": False, "number": offset},
        "job_state": [state],
        "state_reason": "None" if state != "PENDING" else "Resources",
        "comment": "placement/prod/team-a/g@1",
        "admin_comment": '{"pods":[' + ",".join(f'"{p}"' for p in pods) + "]}",
        "job_resources": {"nodes": {"allocation": [{"name": n} for n in nodes]}},
    }


def test_a_job_read_as_components_is_one_job_with_every_components_nodes_in_order() -> None:
    workers = component(11, 1, "RUNNING", ["n2", "n3"], ["team-a/w0", "team-a/w1"])
    leader = component(10, 0, "RUNNING", ["n1"], ["team-a/leader"])
    event = job_event_of([workers, leader])  # any order: by offset
    assert (event.job_id, event.states, event.nodes, event.running) == (
        10,
        ["RUNNING"],
        ["n1", "n2", "n3"],
        True,
    )
    assert het_offset(workers) == 1
    assert het_offset({"het_job_offset": {"set": False, "number": 0}}) is None


def test_a_component_caught_pending_or_ended_decides() -> None:
    pending = job_event_of(
        [component(10, 0, "RUNNING", ["n1"], ["a"]), component(11, 1, "PENDING", [], ["b"])]
    )
    assert (pending.running, pending.pending, pending.reason) == (False, True, "Resources")
    assert pending.states == ["PENDING"]
    ended = job_event_of(
        [component(10, 0, "RUNNING", ["n1"], ["a"]), component(11, 1, "NODE_FAIL", ["n2"], ["b"])]
    )
    assert ended.states == ["NODE_FAIL"]
    assert not ended.running


def test_the_sweep_sees_a_heterogeneous_job_as_one_with_all_its_pods() -> None:
    facts = job_facts(
        [
            component(11, 1, "RUNNING", ["n2"], ["team-a/w0"]),
            component(10, 0, "RUNNING", ["n1"], ["team-a/leader"]),
        ],
        "prod",
    )
    assert facts is not None
    assert (facts.job_id, facts.pods, facts.live) == (10, ["team-a/leader", "team-a/w0"], True)


# -- Slurm refusing a heterogeneous job -------------------------------------------------------------


async def test_a_refused_het_job_says_how_to_size_the_group_as_one_job() -> None:
    from temporalio.exceptions import ApplicationError

    from activities.slurm import SlurmActivities
    from clients.slurm_errors import SlurmRejected

    class Refusing:
        """A Slurm whose job_submit plugin refuses heterogeneous jobs."""

        async def submit_het_job(self, components: list[Any]) -> int:
            assert len(components) == 2
            raise SlurmRejected("HetJob submission failed", operation="POST /job/submit", status=422)

        async def list_jobs(self, update_time: int | None = None) -> Any:
            raise AssertionError("a first submission never lists")

    activities = SlurmActivities(Refusing())  # type: ignore[arg-type]
    job = het_job(leader_and_workers(2))
    with pytest.raises(ApplicationError) as refused:
        await activities.submit_once(job, "placement/prod/team-a/g@1", since=0, recovery=False)
    message = str(refused.value)
    assert "Slurm rejected the heterogeneous job (2 components: 2 + 1 pods)" in message
    assert "HetJob submission failed" in message
    assert "slurm-bridge/sizing: largest-pod" in message
    assert "HETEROGENEOUS_JOBS=false" in message
    assert (refused.value.type, refused.value.non_retryable) == ("SlurmRejected", True)
