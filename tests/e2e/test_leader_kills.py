"""Three real `slurm-bridge worker` processes on real Slurm; the leader is SIGKILLed, then the next.

Each process has its own metrics and health ports. The leader is whoever the
Lease in the real API server names (each process tells its identity on
/readyz). A pod is created right after each kill, during the hand-over. In the
end: every pod placed, one Slurm job per pod, one binding per pod, and the
Slurm job listings (`GET /jobs/`, `GET /jobs/state/`, counted from each
process's own metrics) made only by the leader of the moment.
"""

import asyncio
import contextlib
import json
import re
import signal
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testbed.kube_real.cluster import RealCluster
from tests.e2e.conftest import ON_REAL_KUBE, StackFactory
from tests.e2e.harness import (
    Stack,
    bound,
    finished_cleanly,
    free_port,
    job_id_of,
    leader_worker_env,
    running_process,
    unique,
)
from tests.health_probe import probe, ready_body, sees_leader

pytestmark = pytest.mark.slurm

# Longer than the in-process test's: three processes share two cores here.
LEASE = {"lease_duration": 4.0, "renew_deadline": 3.0, "retry_period": 0.5}
LISTINGS = re.compile(
    r'^slurm_bridge_slurm_requests\{[^}]*operation="GET /jobs/(?:state/)?"[^}]*\} (\S+)$', re.M
)


@dataclass
class WorkerProcess:
    process: asyncio.subprocess.Process
    metrics_port: int
    health_port: int
    identity: str = ""

    async def readyz(self) -> tuple[int, dict[str, Any]]:
        return await probe(self.health_port, "/readyz")

    async def wait_ready(self) -> None:
        """Until /readyz says 200."""
        self.identity = (await ready_body(self.process, self.health_port))["identity"]

    async def listings(self) -> int:
        """Slurm job listings this process made, from its own metrics."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
        return int(sum(float(value) for value in LISTINGS.findall(text)))

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)


@contextlib.asynccontextmanager
async def worker_process(stack: Stack, log: Path) -> AsyncIterator[WorkerProcess]:
    """A `slurm-bridge worker` with its own ports, logging to `log` (kept in the test's tmp_path)."""
    metrics_port, health_port = free_port(), free_port()
    # No orphan sweep: it lists every job, which is not part of what is counted here.
    env = leader_worker_env(stack, health_port, METRICS_PORT=str(metrics_port))
    command = (str(Path(sys.executable).with_name("slurm-bridge")), "worker")
    with log.open("wb") as stderr:
        async with running_process(*command, env=env, stderr=stderr) as process:
            yield WorkerProcess(process, metrics_port, health_port)


async def next_holder(stack: Stack, among: set[str]) -> str:
    """The identity the Lease names once it names one of `among` (event-driven: the Lease is watched)."""

    def holder() -> str | None:
        settings = stack.settings
        lease = stack.kube.get_object(
            "leases.coordination.k8s.io", settings.lease_name, settings.lease_namespace
        )
        name = ((lease or {}).get("spec") or {}).get("holderIdentity")
        return name if name in among else None

    found = await stack.kube.wait_for_async(holder, timeout=30)
    assert found is not None
    return found


async def slurm_bridge_cli(stack: Stack, *args: str) -> tuple[str, str]:
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("slurm-bridge")),
        *args,
        "--temporal-address",
        stack.temporal.service_client.config.target_host,
        "--kubeconfig",
        str(stack.kubeconfig),
        "--lease-namespace",
        stack.settings.lease_namespace,
        "--lease-name",
        stack.settings.lease_name,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return out.decode(), err.decode()


@pytest.mark.slow
@ON_REAL_KUBE
async def test_three_worker_processes_survive_killing_the_leader_twice(
    make_stack: StackFactory, tmp_path: Path
) -> None:
    stack = await make_stack(
        nodes=3,
        bridge=False,
        leader_election=True,
        lease_name=unique("lease"),  # the real API server is shared by the session's tests
        # A process runs node sync, which claims the Kubernetes-labelled Slurm nodes of its scheduler
        # and removes those it owns whose Kubernetes node is missing: a scheduler name of its own
        # keeps it to this test's nodes on the shared Slurm.
        scheduler_name=unique("sched"),
        **LEASE,
    )
    async with contextlib.AsyncExitStack() as processes:
        workers = [
            await processes.enter_async_context(worker_process(stack, tmp_path / f"worker-{n}.log"))
            for n in range(3)
        ]
        await asyncio.gather(*(w.wait_ready() for w in workers))
        alive = {w.identity: w for w in workers}
        assert len(alive) == 3, "each process has its own identity"

        pods = []
        for name in ("first", "second", "third"):
            # For "second" and "third" the pod is created while the Lease still names the dead leader.
            stack.create_pod(name)
            leader = alive[await next_holder(stack, set(alive))]
            pods.append(await stack.wait_pod(name, bound, timeout=60))

            # Only the leader of the moment has asked Slurm for job listings: the
            # others never led (the dead ones cannot be asked, and ask nothing).
            counts = {who: await w.listings() for who, w in alive.items()}
            assert counts[leader.identity] > 0, counts
            assert all(n == 0 for who, n in counts.items() if who != leader.identity), counts
            status, body = await leader.readyz()
            assert (status, body["watching"]) == (200, True)
            for standby in (w for w in alive.values() if w is not leader):
                await sees_leader(standby.health_port, leader.identity, watching=False)

            if name == "third":
                # The CLI tells the same story: the leader, and its watchers' health.
                out, _ = await slurm_bridge_cli(stack, "status", f"{stack.namespace}/third", "--json")
                leadership = json.loads(out)["leadership"]
                assert leadership["holder"] == leader.identity
                assert leadership["report"]["identity"] == leader.identity
                watchers = leadership["report"]["watchers"]
                assert set(watchers) == {"pod", "job", "node"}
                assert all(w["synced"] and w["failing"] == 0 for w in watchers.values()), watchers
                table, _ = await slurm_bridge_cli(stack, "list", "--namespace", stack.namespace)
                lease = f"{stack.settings.lease_namespace}/{stack.settings.lease_name}"
                assert f"leader: {leader.identity} (Lease {lease}" in table
                assert "pod watcher: ok" in table
                break
            leader.kill()
            await leader.process.wait()
            del alive[leader.identity]

        for pod in pods:
            stack.kube.set_pod_phase(stack.namespace, pod["metadata"]["name"], "Succeeded")
        for pod in pods:
            await stack.wait_pod(pod["metadata"]["name"], finished_cleanly, timeout=60)

    # Every pod placed once: one job each, one binding each, each on its own node.
    job_ids = sorted(job_id_of(pod) or 0 for pod in pods)
    assert sorted(job["job_id"] for job in await stack.partition_jobs()) == job_ids
    assert len(set(job_ids)) == 3
    # One Binding sent for each, as the API server's audit log records them. (Not the Bound Events: a
    # replica killed after its binding but before its workflow task completed leaves the next
    # one to repeat the step, which finds the pod bound and tells it again.)
    assert isinstance(stack.kube, RealCluster)
    assert sorted(stack.kube.server.bindings(stack.namespace)) == ["first", "second", "third"]
    assert len({bound(pod) for pod in pods}) == 3
