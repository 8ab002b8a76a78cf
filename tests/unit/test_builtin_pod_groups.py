"""Built-in PodGroups at the version the cluster serves: Kubernetes 1.36 and 1.37.

Over the fake API server (real HTTP), switched to a release's versions with
`serve_scheduling_versions`: discovery finds the version, the group is read with
that version's field names, waited for (watched) there, and its status condition
is the one that version names.
"""

import asyncio
from typing import Any

import pytest

from activities.kube_reader import KubeReader, SchedulingDiscovery, scheduling_discovery
from activities.pod_group_status import set_scheduled
from bridge import grouping
from bridge.grouping import (
    SCHEDULING_V1ALPHA2,
    SCHEDULING_V1ALPHA3,
    SCHEDULING_V1BETA1,
    BuiltinSchedulingApi,
    PodGroupNotFound,
)
from clients.kube_client import KubeClient
from testbed.kube_fake import FakeKubeServer
from testbed.kube_fake.builders import pod_body
from worker.pod_group_waits import PodGroupWaits

P = "slurmjob.slinky.slurm.net/"
PODGROUPS = "podgroups.scheduling.k8s.io"
STAMP = "2026-11-25T00:00:00Z"


def serve(kube: FakeKubeServer, api: BuiltinSchedulingApi) -> None:
    versions = {"v1alpha2": ("v1alpha2",), "v1alpha3": ("v1alpha3",), "v1beta1": ("v1beta1", "v1alpha3")}
    kube.serve_scheduling_versions(*versions[api.version])


def pod_group(api: BuiltinSchedulingApi, name: str = "train", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": api.pod_group.api_version,
        "kind": "PodGroup",
        "metadata": {"name": name, "annotations": {P + "qos": "from-pod-group"}},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 3}}, **spec},
    }


def workload_ref(api: BuiltinSchedulingApi, workload: str) -> dict[str, Any]:
    """How a PodGroup of this version names the Workload (and template) it was made from."""
    if api is SCHEDULING_V1ALPHA2:
        return {"podGroupTemplateRef": {"workload": {"workloadName": workload, "podGroupTemplateName": "w"}}}
    return {"workloadRef": {"workloadName": workload, "templateName": "w"}}


def member(kube: FakeKubeServer, group: str = "train") -> dict[str, Any]:
    return kube.create_object("pods", pod_body("train-0", schedulingGroup={"podGroupName": group}), "default")


def discovery_reads(kube: FakeKubeServer) -> list[str]:
    return [
        r.path for r in kube.requests if r.path.rstrip("/").count("/") <= 3 and "/scheduling.k8s.io" in r.path
    ]


# -- discovery ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("served", "found"),
    [
        (("v1alpha2",), SCHEDULING_V1ALPHA2),  # 1.36
        (("v1beta1", "v1alpha3"), SCHEDULING_V1BETA1),  # 1.37, both enabled: the newest
        (("v1alpha3",), SCHEDULING_V1ALPHA3),  # 1.37, alpha only
        (("v1beta1",), SCHEDULING_V1BETA1),  # 1.37, beta only
    ],
)
async def test_discovery_finds_the_version_that_serves_pod_groups(
    kube: FakeKubeServer, client: KubeClient, served: tuple[str, ...], found: BuiltinSchedulingApi
) -> None:
    kube.serve_scheduling_versions(*served)
    assert await KubeReader(client).served_scheduling_api() == found


async def test_discovery_answers_none_when_no_version_serves_pod_groups(
    kube: FakeKubeServer, client: KubeClient
) -> None:
    for plural in ("podgroups", "workloads"):
        kube.registry.unregister("scheduling.k8s.io", plural)  # only PriorityClass's v1 is left
    assert await SchedulingDiscovery(client).served() is None


async def test_discovery_is_asked_once_per_ttl_and_shared_by_a_client(
    kube: FakeKubeServer, client: KubeClient
) -> None:
    now = [0.0]
    discovery = SchedulingDiscovery(client, ttl_seconds=300, clock=lambda: now[0])
    answers = await asyncio.gather(*(discovery.served() for _ in range(5)))
    assert answers == [SCHEDULING_V1ALPHA2] * 5
    # The group's versions, then the resources of the newest one it lists that the bridge reads.
    assert discovery_reads(kube) == ["/apis/scheduling.k8s.io", "/apis/scheduling.k8s.io/v1alpha2"]

    kube.serve_scheduling_versions("v1beta1", "v1alpha3")  # the API server is upgraded to 1.37
    now[0] = 299.0
    assert await discovery.served() == SCHEDULING_V1ALPHA2  # remembered
    now[0] = 300.0
    assert await discovery.served() == SCHEDULING_V1BETA1  # asked again
    assert len(discovery_reads(kube)) == 4
    assert scheduling_discovery(client) is scheduling_discovery(client)


# -- reading the group ----------------------------------------------------------------------


@pytest.mark.parametrize("api", [SCHEDULING_V1ALPHA2, SCHEDULING_V1ALPHA3, SCHEDULING_V1BETA1])
async def test_a_pod_group_is_read_with_its_version_s_field_names(
    kube: FakeKubeServer, client: KubeClient, api: BuiltinSchedulingApi
) -> None:
    serve(kube, api)
    kube.create_object(
        f"workloads.{api.workload.group}",
        {
            "apiVersion": api.workload.api_version,
            "kind": "Workload",
            "metadata": {"name": "wl", "annotations": {P + "qos": "from-workload"}},
            "spec": {"podGroupTemplates": [{"name": "w", "schedulingPolicy": {"gang": {"minCount": 3}}}]},
        },
        "default",
    )
    kube.create_object(PODGROUPS, pod_group(api, **workload_ref(api, "wl")), "default")
    group = await grouping.resolve(KubeReader(client), member(kube))
    assert (group.kind, group.name, group.min_pods) == ("PodGroup", "train", 3)
    assert group.annotations[P + "qos"] == "from-workload"  # the Workload was found through its reference
    reads = {r.path for r in kube.requests if "/namespaces/default/" in r.path and "scheduling" in r.path}
    assert reads == {
        f"/apis/{api.pod_group.api_version}/namespaces/default/podgroups/train",
        f"/apis/{api.pod_group.api_version}/namespaces/default/workloads/wl",
    }


async def test_a_missing_pod_group_is_waited_for_at_the_served_version(
    kube: FakeKubeServer, client: KubeClient
) -> None:
    serve(kube, SCHEDULING_V1BETA1)
    with pytest.raises(PodGroupNotFound) as missing:
        await grouping.resolve(KubeReader(client), member(kube))
    assert missing.value.kind == SCHEDULING_V1BETA1.pod_group
    assert (
        "PodGroup default/train (scheduling.k8s.io/v1beta1) named by spec.schedulingGroup does not exist"
        in (str(missing.value))
    )


async def test_a_cluster_serving_no_pod_groups_keeps_the_pod_waiting_and_says_why(
    kube: FakeKubeServer, client: KubeClient
) -> None:
    kube.registry.unregister("scheduling.k8s.io", "podgroups")
    with pytest.raises(PodGroupNotFound) as missing:
        await grouping.resolve(KubeReader(client), member(kube))
    assert "cannot exist yet: the cluster serves PodGroups at none of scheduling.k8s.io/v1beta1, " in str(
        missing.value
    )


async def test_a_wait_watches_the_served_version_and_ends_when_the_group_appears(
    kube: FakeKubeServer, client: KubeClient
) -> None:
    serve(kube, SCHEDULING_V1BETA1)
    pod = member(kube)
    appeared: asyncio.Queue[list[dict[str, Any]]] = asyncio.Queue()
    waits = PodGroupWaits(client, appeared.put_nowait)
    assert waits.add(SCHEDULING_V1BETA1.pod_group, "default", "train", pod)
    assert waits.watching == {SCHEDULING_V1BETA1.pod_group}
    await kube.wait_for_async(lambda: kube.active_watches == 1)
    kube.create_object(PODGROUPS, pod_group(SCHEDULING_V1BETA1), "default")
    started = await asyncio.wait_for(appeared.get(), 5)
    assert [p["metadata"]["name"] for p in started] == ["train-0"]
    await asyncio.wait_for(waits.idle.wait(), 5)
    assert any(r.path == "/apis/scheduling.k8s.io/v1beta1/podgroups" for r in kube.requests)
    await waits.close()


# -- the status condition -------------------------------------------------------------------


def conditions(kube: FakeKubeServer) -> list[tuple[str, str, str]]:
    found = kube.get_object(PODGROUPS, "train", "default") or {}
    return [
        (c["type"], c["status"], c["reason"]) for c in (found.get("status") or {}).get("conditions") or []
    ]


@pytest.mark.parametrize(
    ("api", "after_pending_again"),
    [
        # 1.36: the condition follows the group, False again when it is pending again.
        (SCHEDULING_V1ALPHA2, ("PodGroupScheduled", "False", "Unschedulable")),
        # 1.37: once initially scheduled, it stays True.
        (SCHEDULING_V1BETA1, ("PodGroupInitiallyScheduled", "True", "Scheduled")),
        (SCHEDULING_V1ALPHA3, ("PodGroupInitiallyScheduled", "True", "Scheduled")),
    ],
)
async def test_the_condition_is_the_one_the_served_version_names(
    kube: FakeKubeServer, client: KubeClient, api: BuiltinSchedulingApi, after_pending_again: tuple[str, ...]
) -> None:
    serve(kube, api)
    kube.create_object(PODGROUPS, pod_group(api), "default")
    pod = member(kube)
    name = api.scheduled_condition
    await set_scheduled(client, pod, False, "0/2 nodes are available", stamp=STAMP)
    assert conditions(kube) == [(name, "False", "Unschedulable")]
    await set_scheduled(client, pod, True, "Slurm job 7 allocated n1; bound to n1", stamp=STAMP)
    assert conditions(kube) == [(name, "True", "Scheduled")]
    await set_scheduled(client, pod, False, "Slurm job 8 is pending: Resources", stamp=STAMP)
    assert conditions(kube) == [after_pending_again]
    patches = [r.path for r in kube.requests if r.method == "PATCH"]
    assert set(patches) == {f"/apis/{api.pod_group.api_version}/namespaces/default/podgroups/train/status"}


async def test_no_condition_is_written_where_no_version_serves_pod_groups(
    kube: FakeKubeServer, client: KubeClient
) -> None:
    kube.registry.unregister("scheduling.k8s.io", "podgroups")
    await set_scheduled(client, member(kube), True, "bound", stamp=STAMP)  # logged, not raised
    assert [r for r in kube.requests if r.method == "PATCH"] == []
