"""The bind step's read of the job decides, comment included, on the real Slurm test bed.

The job watcher tells a placement that its job started from the state probe alone when
it never read the job, so the bind step's read is where "this id is our job" is checked:
after Slurm's state was wiped, an id the pods name may belong to another job.
"""

from collections.abc import AsyncIterator

import pytest

from activities.kube import KubeActivities, KubeSettings
from activities.placement import PlacementActivities
from activities.slurm import SlurmActivities
from bridge.models import BindInput, PodRef, admin_comment_for
from clients.kube_client import KubeClient
from clients.slurm_client import SlurmClient
from testbed.kube_fake import FakeKubeServer
from testbed.kube_fake.builders import pod_body
from tests.slurm.conftest import MakePartition
from tests.slurm.test_slurm_client import external_job, wait_for_job

pytestmark = pytest.mark.slurm

OURS = "placement/bind-test/pod/default/p/u1@u1"
ANOTHER = "placement/bind-test/pod/default/q/u2@u2"


@pytest.fixture
async def steps(slurm_client: SlurmClient) -> AsyncIterator[tuple[FakeKubeServer, PlacementActivities]]:
    with FakeKubeServer() as kube:
        client = KubeClient(kube.aio_configuration())
        yield kube, PlacementActivities(KubeActivities(client, KubeSettings()), SlurmActivities(slurm_client))
        await client.close()


async def running_pod_job(
    kube: FakeKubeServer, slurm_client: SlurmClient, slurm_partition: MakePartition
) -> tuple[str, PodRef, int]:
    """A node, a pod `default/p` and this placement's job, RUNNING on that node."""
    partition = slurm_partition()
    (node,) = partition.node_names[:1]
    kube.create_node(node)
    pod = kube.create_object("pods", pod_body("p"), "default")
    ref = PodRef(namespace="default", name="p", uid=pod["metadata"]["uid"])
    job_id = await slurm_client.submit_job(
        external_job(partition.name, comment=OURS, admin_comment=admin_comment_for([ref.key]))
    )
    await wait_for_job(slurm_client, job_id, lambda job: "RUNNING" in (job.job_state or []), "running")
    return node, ref, job_id


@pytest.mark.parametrize("comment", [OURS, ANOTHER])
async def test_a_running_job_is_bound_only_when_its_comment_names_the_placement(
    steps: tuple[FakeKubeServer, PlacementActivities],
    slurm_client: SlurmClient,
    slurm_partition: MakePartition,
    comment: str,
) -> None:
    kube, activities = steps
    partition = slurm_partition()
    kube.create_node(partition.node_names[0])
    pod = kube.create_object("pods", pod_body("p"), "default")
    ref = PodRef(namespace="default", name="p", uid=pod["metadata"]["uid"])
    job_id = await slurm_client.submit_job(
        external_job(partition.name, comment=comment, admin_comment=admin_comment_for([ref.key]))
    )
    await wait_for_job(slurm_client, job_id, lambda job: "RUNNING" in (job.job_state or []), "running")

    result = await activities.bind(BindInput(pods=[ref], job_id=job_id, placement_id=OURS))

    bound = (kube.get_object("pods", "p", "default") or {}).get("spec", {}).get("nodeName")
    if comment == OURS:
        assert result.nodes == [partition.node_names[0]]
        assert bound == partition.node_names[0]
    else:
        assert (result.job.gone, result.nodes) == (True, [])
        assert bound is None
    await slurm_client.cancel_job(job_id)


async def test_pods_an_earlier_attempt_bound_stay_bound_after_their_job_ended(
    steps: tuple[FakeKubeServer, PlacementActivities],
    slurm_client: SlurmClient,
    slurm_partition: MakePartition,
) -> None:
    """A local bind attempt can bind and still time out (an Event write hanging while the API
    server shuts down). If the job ends before the retry, the retry must report the pods bound,
    so the placement evicts them with the job's reason instead of calling them never placed."""
    kube, activities = steps
    node, ref, job_id = await running_pod_job(kube, slurm_client, slurm_partition)
    first = await activities.bind(BindInput(pods=[ref], job_id=job_id, placement_id=OURS))
    assert first.nodes == [node]

    await slurm_client.cancel_job(job_id)
    await wait_for_job(slurm_client, job_id, lambda job: "CANCELLED" in (job.job_state or []), "cancelled")
    retry = await activities.bind(BindInput(pods=[ref], job_id=job_id, placement_id=OURS))

    assert not retry.job.running
    assert (retry.slurm_nodes, retry.nodes) == ([node], [node])


async def test_the_nodes_pods_are_listed_from_the_api_servers_cache(
    steps: tuple[FakeKubeServer, PlacementActivities],
    slurm_client: SlurmClient,
    slurm_partition: MakePartition,
) -> None:
    """Every bind lists the pods on its nodes (those of an ended job may still hold one). Without
    resourceVersion=0 that list is a consistent read, which kube-apiserver answers by reading
    every pod in etcd: on the real API server at 10,000 pods, binds took seconds."""
    kube, activities = steps
    node, ref, job_id = await running_pod_job(kube, slurm_client, slurm_partition)
    kube.clear_requests()

    result = await activities.bind(BindInput(pods=[ref], job_id=job_id, placement_id=OURS))

    assert result.nodes == [node]
    listings = [
        r.query
        for r in kube.requests
        if r.method == "GET"
        and r.path == "/api/v1/pods"
        and "spec.nodeName" in r.query.get("fieldSelector", "")
    ]
    assert listings, "bind did not look at the node's pods"
    assert all(query.get("resourceVersion") == "0" for query in listings), listings
    await slurm_client.cancel_job(job_id)
