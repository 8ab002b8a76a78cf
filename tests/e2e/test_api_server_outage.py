"""The real kube-apiserver stops and starts again under a running bridge, on real Slurm.

While it is away, Slurm goes on: a bound pod's job is cancelled (what `scancel`
does). The bridge cannot evict the pod meanwhile; once the API server is back its
watchers re-list, the pod is evicted with the reason, and a pod created after the
outage is placed as usual. The API server is stopped right after the binding, so
the bind step's last writes meet its shutdown: that step is retried after the job
ended, and must still count the pod as bound. etcd keeps running: the cluster's state survives, as
it does when a control-plane node restarts.
"""

import pytest

from testbed.kube_real.cluster import RealCluster
from tests.e2e.conftest import ON_REAL_KUBE, StackFactory
from tests.e2e.harness import bound, finished_cleanly, job_id_of, kubelet_stops, wait_job_state

pytestmark = [pytest.mark.slurm, ON_REAL_KUBE]


async def test_the_bridge_catches_up_after_the_api_server_was_away(make_stack: StackFactory) -> None:
    stack = await make_stack(nodes=2)
    assert isinstance(stack.kube, RealCluster)
    server = stack.kube.server
    stack.create_pod("before")
    pod = await stack.wait_pod("before", bound)
    job_id = job_id_of(pod)
    assert job_id is not None

    server.stop_apiserver()
    try:
        await stack.slurm.cancel_job(job_id)
        await wait_job_state(stack.slurm, job_id, lambda states: "CANCELLED" in states)
    finally:
        server.start_apiserver()

    await stack.wait_pod("before", lambda p: p is None or p["metadata"].get("deletionTimestamp"), timeout=90)
    told = [e for e in stack.events("before") if e["reason"] == "SlurmJobCancelled"]
    assert told, [e["reason"] for e in stack.events("before")]
    kubelet_stops(stack.kube, stack.namespace, "before")  # no kubelet runs: the test confirms the stop
    await stack.wait_pod("before", lambda p: p is None)

    stack.create_pod("after")
    await stack.wait_pod("after", bound, timeout=60)
    stack.kube.set_pod_phase(stack.namespace, "after", "Succeeded")
    await stack.wait_pod("after", finished_cleanly)
