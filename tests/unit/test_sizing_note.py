"""The notice a group of unequal pods gets: every node is sized by its largest pod, and the cost.

`bridge.translate.sizing_note` words it; `prepare_and_submit` records it once per placement in a
`SizedByLargestPod` Event on each pod (an Event named after the placement, so a repeated step
finds it there); `slurm-bridge explain` shows it as `sizing_note` (tests/unit/test_explain.py).
"""

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from activities.kube import KubeActivities, KubeSettings
from activities.placement import SIZED_BY_LARGEST_POD, told_once
from bridge.models import PodRef
from bridge.translate import Defaults, GroupShape, build_job, sizing_note
from clients.kube_client import KubeClient, KubeConflict
from testbed.kube_fake import FakeKubeServer
from testbed.kube_fake.builders import pod_body
from tests.unit.test_translate import member

P = "slurmjob.slinky.slurm.net/"


def note(*pods: dict[str, Any], annotations: dict[str, str] | None = None) -> str | None:
    job = build_job(list(pods), annotations=annotations, shape=GroupShape(name="g"), defaults=Defaults())
    return sizing_note(list(pods), job, "Slurm job 42")


def test_a_leader_and_smaller_workers_are_told_what_the_largest_costs() -> None:
    # docs/groups.md's example: a leader of 8 CPUs with seven 1-CPU workers.
    leader = member("leader", {"cpu": "8", "memory": "1Gi"})
    workers = [member(f"w{i}", {"cpu": "1", "memory": "1Gi"}) for i in range(7)]
    assert note(leader, *workers) == (
        "every node of Slurm job 42 is asked for 8 CPUs: the group's largest pod; pods asking less "
        "are given more (the job holds 64 CPUs on its 8 nodes, for pods that ask for 15 CPUs in all). "
        "Give the group's pods equal requests to avoid it"
    )


def test_each_resource_that_differs_is_told_with_its_own_largest() -> None:
    # A 2-GPU, 1-CPU pod and a 1-GPU, 8-CPU pod: 8 CPUs and 2 GPUs per node; memory is equal.
    a = member("a", {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "2"})
    b = member("b", {"cpu": "8", "memory": "2Gi", "nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "1"})
    told = note(a, b) or ""
    assert told.startswith("every node of Slurm job 42 is asked for 8 CPUs, 2 GPUs: the group's largest pod")
    assert "the job holds 16 CPUs, 4 GPUs on its 2 nodes, for pods that ask for 9 CPUs, 3 GPUs in all" in told
    assert "memory" not in told


def test_memory_is_told_in_the_units_a_node_is_asked_in() -> None:
    told = note(member("a", {"cpu": "1", "memory": "4Gi"}), member("b", {"cpu": "1", "memory": "512Mi"}))
    assert told is not None
    assert "is asked for 4Gi memory:" in told
    assert "holds 8Gi memory on its 2 nodes, for pods that ask for 4608Mi memory in all" in told


def test_equal_pods_a_single_pod_and_rounding_alone_are_not_told() -> None:
    equal = [member(f"p{i}", {"cpu": "2", "memory": "1Gi"}) for i in range(3)]
    assert note(*equal) is None
    assert note(member("solo", {"cpu": "1"})) is None
    # Half a CPU and a whole one: each pod gets a whole CPU anyway, the group changes nothing.
    assert note(member("a", {"cpu": "500m"}), member("b", {"cpu": "1"})) is None


def test_a_size_an_annotation_sets_is_the_users_choice_and_not_told() -> None:
    pods = [member("a", {"cpu": "8", "memory": "1Gi"}), member("b", {"cpu": "1", "memory": "2Gi"})]
    told = note(*pods, annotations={P + "cpu-per-task": "4"}) or ""
    assert "CPU" not in told
    assert "is asked for 2Gi memory" in told
    assert note(*pods, annotations={P + "cpu-per-task": "4", P + "mem-per-node": "4Gi"}) is None


@pytest.fixture
async def activities(kube: FakeKubeServer) -> AsyncIterator[KubeActivities]:
    client = KubeClient(kube.aio_configuration())
    yield KubeActivities(client, KubeSettings())
    await client.close()


async def test_an_event_told_once_is_recorded_once_however_often_the_step_repeats(
    kube: FakeKubeServer, activities: KubeActivities
) -> None:
    pod = kube.create_object("pods", pod_body("p"), "default")
    ref = PodRef(namespace="default", name="p", uid=pod["metadata"]["uid"])
    name = told_once(ref, "placement/bridge/default/p/u1@u1", SIZED_BY_LARGEST_POD)
    for _ in range(2):  # the step's attempt, and a repeat of it after a failure later in the step
        await activities._event(ref, SIZED_BY_LARGEST_POD, "every node ...", False, name=name)
    told = [e for e in kube.objects("events", "default") if e["reason"] == SIZED_BY_LARGEST_POD]
    assert [e["metadata"]["name"] for e in told] == [name]
    # Another placement (the group's next generation) tells again.
    assert told_once(ref, "placement/bridge/default/p/u1@u2", SIZED_BY_LARGEST_POD) != name
    # An Event that is not told once is written as before: a 409 for it still fails the write.
    kube.fail_next("POST", r"^/api/v1/namespaces/default/events$", 409, reason="Conflict")
    with pytest.raises(KubeConflict):
        await activities._event(ref, "Other", "message", False)


def test_the_name_of_an_event_told_once_is_a_dns_subdomain_for_the_longest_pod_names() -> None:
    for name in ("a" * 253, "a" * 199 + "-" + "b" * 53, "p"):
        told = told_once(PodRef(namespace="default", name=name, uid="u"), "placement/x@u", "Reason")
        assert len(told) <= 253
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", told), told
