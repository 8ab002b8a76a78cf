"""A Kubeflow Trainer TrainJob placed by Slurm, end to end: the real kube-apiserver, real Slurm.

No controller runs here: the test plays Trainer (with `podGroupPolicy: coscheduling`), JobSet
and the Job controller, creating the TrainJob, the PodGroup and JobSet Trainer makes, the Job
the JobSet controller makes and the Indexed pods the Job controller makes, each as that
controller creates it (tests/e2e/controllers.py). The TrainJob, JobSet and PodGroup CRDs are
structural stand-ins (testbed/kube_real/crds.py).

The bridge runs with a token of the Helm chart's worker ServiceAccount, bound to the chart's
RBAC, which grants nothing on TrainJobs, and every request it sends is recorded with the API
server's answer: a read of a TrainJob, even one whose refusal the code absorbed, fails the test.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from activities.placement import SIZED_BY_LARGEST_POD
from bridge import keys
from clients.kube_client import load_configuration
from testbed.kube_real.apiserver import TEST_PROBE_AGENT, ApiServer
from testbed.kube_real.cluster import RealCluster
from tests.deploy.chart import NAMESPACE, manifests
from tests.deploy.real_chart import RecordingKubeClient, install_identity, refused
from tests.e2e import controllers
from tests.e2e.conftest import ON_REAL_KUBE, StackFactory
from tests.e2e.harness import bound, finished_cleanly, job_id_of

pytestmark = [pytest.mark.slurm, ON_REAL_KUBE]


@pytest.fixture(scope="module")
def worker_token(real_apiserver: ApiServer) -> Iterator[str]:
    """A token of the chart's worker ServiceAccount, its RBAC applied as `helm install` would."""
    release = RealCluster(real_apiserver, NAMESPACE)
    try:
        yield install_identity(release, manifests()).worker.token
    finally:
        release.close()


@pytest.mark.parametrize("gpus", [0, 8], ids=["cpus", "8-gpus-per-node"])
async def test_a_train_job_is_one_slurm_job_and_its_train_job_is_never_read(
    make_stack: StackFactory, real_apiserver: ApiServer, worker_token: str, tmp_path: Path, gpus: int
) -> None:
    nodes = 2
    stack = await make_stack(nodes=nodes, cpus=4, gres=f"gpu:{gpus}" if gpus else None, bridge=False)
    kubeconfig = real_apiserver.kubeconfig(tmp_path / "worker", token=worker_token)
    client = RecordingKubeClient(await load_configuration(str(kubeconfig)))
    await stack.start_bridge(client)
    kube, ns = stack.kube, stack.namespace

    # resourcesPerNode of the TrainJob: what every trainer node's pod asks for.
    resources: dict[str, Any] = {"cpu": "2", "memory": "1Gi"}
    if gpus:
        resources["nvidia.com/gpu"] = str(gpus)
    trainjob = controllers.train_job(kube, ns, "llama", nodes, resources)
    pod_group = controllers.trainer_pod_group(kube, trainjob, nodes, resources)
    assert pod_group["spec"]["minResources"] == {
        "cpu": "4",
        "memory": "2Gi",
        **({"nvidia.com/gpu": str(gpus * nodes)} if gpus else {}),
    }
    jobset = controllers.trainer_job_set(kube, trainjob, nodes, resources, stack.settings.scheduler_name)
    [job] = controllers.job_set_jobs(kube, jobset)
    assert job["metadata"]["name"] == "llama-node-0"
    pods = [controllers.job_pod(kube, job, index) for index in range(nodes)]
    names = [p["metadata"]["name"] for p in pods]

    placed = [await stack.wait_pod(name, bound) for name in names]
    [job_id] = {job_id_of(p) for p in placed}  # the group is one Slurm job
    assert job_id is not None
    assert sorted(bound(p) or "" for p in placed) == sorted(stack.partition.node_names)  # a node each
    slurm_job = (await stack.slurm.get_job(job_id)).model_dump(mode="json")
    assert slurm_job["name"] == "llama"  # the PodGroup's (the TrainJob's) name
    assert slurm_job["node_count"]["number"] == nodes
    # Sized per pod, never by minResources (the whole group's need): each node is asked for
    # what one trainer node asks.
    assert slurm_job["cpus_per_task"]["number"] == 2
    assert slurm_job["memory_per_node"]["number"] == 1024
    if gpus:
        assert slurm_job["tres_per_node"] == f"gres/gpu={gpus}"
        assert slurm_job["gres_detail"] == [f"gpu:{gpus}(IDX:0-{gpus - 1})"] * nodes
    else:
        assert not slurm_job.get("tres_per_node")
    assert slurm_job["comment"].startswith(
        f"placement/{stack.settings.installation_id}/{ns}/podgroup/llama/{pod_group['metadata']['uid']}@"
    )
    for pod in placed:
        # The Job controller's marks are kept beside the bridge's.
        assert pod["metadata"]["labels"][controllers.COMPLETION_INDEX] in {"0", "1"}
        finalizers = pod["metadata"]["finalizers"]
        assert controllers.JOB_TRACKING_FINALIZER in finalizers
        assert keys.FINALIZER in finalizers
        # Equal pods: nothing to say about sizing.
        assert not [e for e in stack.events(pod["metadata"]["name"]) if e["reason"] == SIZED_BY_LARGEST_POD]

    for name in names:
        kube.set_pod_phase(ns, name, "Succeeded")
    for name in names:
        await stack.wait_pod(name, finished_cleanly)

    calls = list(client.calls)
    assert refused(calls) == []
    assert [str(c) for c in calls if "trainjobs" in c.path] == []
    # The PodGroup label decides the group before any owner is looked at: no Job or JobSet read.
    assert [str(c) for c in calls if "/jobs/" in c.path or "/jobsets/" in c.path] == []
    assert any(
        c.method == "GET" and c.path.endswith(f"/podgroups/{pod_group['metadata']['name']}") for c in calls
    )
    # The identity the bridge ran with may not read the TrainJob at all.
    async with httpx.AsyncClient(
        base_url=real_apiserver.url,
        verify=real_apiserver.tls_context(),
        # Marked as the test's own probe: the stack's check of the bridge's refusals skips it.
        headers={"Authorization": f"Bearer {worker_token}", "User-Agent": TEST_PROBE_AGENT},
    ) as as_worker:
        path = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/llama"
        assert (await as_worker.get(path)).status_code == 403
