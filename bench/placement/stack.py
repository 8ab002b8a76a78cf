"""`Bench`: stands up the stack of tests/e2e (a Temporal dev server, the fake Kubernetes API in its
own process, one in-process `Bridge` with an installation id of its own), runs the scenario,
and takes it all down again."""

import asyncio
import contextlib
import sys
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from bench.kube import CountingKube, KubeDriver, KubeProcess, PodObserver, RealKube
from bench.placement.environment import TEMPORAL_CLI, count_slurm_jobs, environment
from bench.placement.results import Results
from bench.placement.site import SiteScenario
from bench.probes import CountingTransport, child_pid, free_port, pids_by_comm
from bench.slurm import ActivitySlurm, WatcherSlurm
from bridge import search_attributes as sa
from clients.kube_client import load_configuration
from testbed.worker_env import settings_env, stop_process
from worker.main import Bridge, prefer_the_event_loop
from worker.schedules import NODE_SYNC_SCHEDULE_ID, node_sync_schedule
from worker.settings import WorkerSettings, load_settings


async def pause_node_sync(settings: WorkerSettings, temporal: Client) -> None:
    """The node sync Schedule, created paused before any follower starts.

    The worker's entry point creates or updates the node sync Schedule, which the benchmark's
    bridge runs without (a node sync would take the probes' nodes into the bridge's partition);
    a worker's update keeps a paused schedule paused.
    """
    paused = node_sync_schedule(settings)
    paused.state.paused = True
    paused.state.note = "the benchmark's bridge runs without node sync"
    await temporal.create_schedule(NODE_SYNC_SCHEDULE_ID, paused)


async def start_follower(settings: WorkerSettings, temporal: Client, log: Path) -> asyncio.subprocess.Process:
    """`slurm-bridge worker` with the in-process bridge's settings and Lease: a follower, which
    takes workflow and activity tasks from the same task queue and runs no watcher."""
    env = settings_env(
        settings,
        temporal.service_client.config.target_host,
        LEADER_ELECTION="true",
        LEASE_NAMESPACE=settings.lease_namespace,
        LEASE_NAME=settings.lease_name,
        INSTALLATION_ID=settings.installation_id,
        METRICS_PORT="0",
        SWEEP_INTERVAL="0",
    )
    command = str(Path(sys.executable).with_name("slurm-bridge"))
    with log.open("wb") as stderr:
        return await asyncio.create_subprocess_exec(command, "worker", env=env, stderr=stderr)


class Bench(SiteScenario):
    async def run(self) -> Results:
        o, r = self.o, self.results
        self.loop = asyncio.get_running_loop()
        self._background: set[asyncio.Future[Any]] = set()
        self.follower_pids = []
        r.started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        r.environment = environment(self.bed)
        metrics_port = free_port()
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        async with contextlib.AsyncExitStack() as stack:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
            if o.kube == "real":
                real = RealKube()
                self.kube_process = real
                await asyncio.to_thread(real.start)
                stack.callback(real.stop)
                kubeconfig = real.kubeconfig
                self.kube = KubeDriver(real.endpoint)
                await asyncio.to_thread(self.kube.create_namespace, self.namespace)
            else:
                kubeconfig = tmp / "kubeconfig"
                fake = KubeProcess(kubeconfig, tmp / "kube_fake.log")
                self.kube_process = fake
                await asyncio.to_thread(fake.start)
                stack.callback(fake.stop)
                self.kube = KubeDriver(fake.endpoint)
            nodes = [(n, self.partition.cpus, self.partition.memory_mb) for n in self.partition.node_names]
            if self.spare is not None:
                nodes += [(n, self.spare.cpus, self.spare.memory_mb) for n in self.spare.node_names]
            for name, cpus, memory in nodes:
                await asyncio.to_thread(self.kube.create_node, name, cpus, memory)
            env = await WorkflowEnvironment.start_local(
                dev_server_existing_path=str(TEMPORAL_CLI),
                data_converter=pydantic_data_converter,
                search_attributes=sa.ALL,
                dev_server_log_level="error",
                dev_server_extra_args=["--metrics-port", str(metrics_port)],
            )
            await stack.enter_async_context(env)
            self.temporal = env.client
            self.server_pid = child_pid("temporal")
            chroot = self.bed.jwt_file.parent / "root"
            self.slurmctld_pid = next(iter(pids_by_comm("slurmctld", chroot)), None)
            self.slurmrestd_pid = next(iter(pids_by_comm("slurmrestd", chroot)), None)

            run_id = uuid.uuid4().hex[:8]
            self.task_queue = f"bench-{run_id}"
            # An installation of its own: other sessions' bridges (and sweeps) on this shared Slurm
            # act only on their installation's jobs, so they never touch the run's jobs.
            self.installation = f"bench-{run_id}"
            settings = load_settings(
                temporal_task_queue=self.task_queue,
                slurm_rest_url=self.bed.rest_url,
                slurm_user_name=self.bed.user_name,
                slurm_jwt_file=self.bed.jwt_file,
                kubeconfig=str(kubeconfig),
                partition=self.partition.name,
                job_watch_interval=o.watch_interval,
                installation_id=self.installation,
                metrics_port=0,
                # With a follower, the in-process bridge leads: the watchers run there alone.
                **({"leader_election": True, "lease_name": f"bench-{run_id}"} if o.followers else {}),
                **(
                    {"temporal_max_cached_workflows": o.max_cached_workflows}
                    if o.max_cached_workflows is not None
                    else {}
                ),
            )
            r.cache_size = settings.temporal_max_cached_workflows
            r.activity_slots = settings.temporal_max_concurrent_activities
            slurm_kwargs: dict[str, Any] = {"user_name": self.bed.user_name, "token_file": self.bed.jwt_file}
            self.activity_slurm = ActivitySlurm(
                self.bed.rest_url, counter=CountingTransport(), **slurm_kwargs
            )
            self.watcher_slurm = WatcherSlurm(self.bed.rest_url, counter=CountingTransport(), **slurm_kwargs)
            self.started = True
            stack.push_async_callback(self.activity_slurm.close)
            stack.push_async_callback(self.watcher_slurm.close)
            self.kube_client = CountingKube(await load_configuration(str(kubeconfig)))
            stack.push_async_callback(self.kube_client.close)
            prefer_the_event_loop()  # as the worker process does
            bridge = Bridge(self.temporal, self.kube_client, self.activity_slurm, settings)
            bridge.job_watcher.slurm = self.watcher_slurm  # its own connection and counters
            self.job_watcher = bridge.job_watcher  # its passes, counted by itself
            observer = PodObserver(self.kube, self.namespace, self.pods, self._notify)
            observer.start()
            stack.callback(observer.stop)
            bridge_task = asyncio.create_task(bridge.run(), name="bridge")

            async def stop_bridge() -> None:
                bridge_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await bridge_task
                for task in list(self._background):
                    task.cancel()

            stack.push_async_callback(stop_bridge)
            await asyncio.wait_for(bridge.pod_watcher.synced.wait(), 30)
            if o.followers:
                # Leading by now: the pod watcher runs in the leader only.
                await pause_node_sync(settings, self.temporal)
                for index in range(o.followers):
                    follower = await start_follower(settings, self.temporal, tmp / f"follower-{index}.log")
                    self.follower_pids.append(follower.pid)
                    stack.push_async_callback(stop_process, follower)
            r.slurm_jobs_at_start = await asyncio.to_thread(count_slurm_jobs, self.bed)

            if o.scenario == "pending":
                await self.run_pending()
            elif o.scenario == "site":
                await self.run_site()
            else:
                await self.run_batch()
            r.observer = {"lost": observer.lost, **observer.errors}
        return r
