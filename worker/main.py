"""Composition root: settings → clients → Temporal worker + watchers.

`Bridge` is what a `slurm-bridge worker` process runs, and what the end-to-end
tests run in-process: the same wiring, only the addresses differ. The
connection to Temporal (credentials and their renewal, search attributes) is
worker/temporal_connection.py; the probes on HEALTH_PORT, worker/health.py.
"""

import asyncio
import logging
import sys
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.common import MetricMeter
from temporalio.runtime import Runtime
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from activities.kube import KubeActivities, KubeSettings
from activities.nodes import NodeActivities
from activities.placement import PlacementActivities
from activities.slurm import SlurmActivities
from activities.sweep import SweepActivities
from bridge.models import PodRef
from bridge.translate import Defaults
from clients.kube_client import KubeClient, load_configuration
from clients.leader import LeaderElector, LeaderTimings, default_identity
from clients.policy_file import PolicyFile
from clients.slurm_client import SlurmClient
from clients.slurm_health import SlurmHealth
from worker.health import CachedCheck, HealthServer, Readiness
from worker.heartbeat import HeartbeatInterceptor
from worker.job_registry import LiveJobs
from worker.job_watcher import JobWatcher
from worker.metrics import slurm_health_observer, slurm_observer
from worker.node_cache import NodeCache
from worker.node_rules import ExclusionRefresher, UnschedulableWakes
from worker.node_watcher import NodeWatcher
from worker.pod_watcher import PodWatcher
from worker.schedules import NODE_SYNC_SCHEDULE_ID, ensure_node_sync_schedule, ensure_sweep_schedule
from worker.settings import WorkerSettings
from worker.slurm_waker import SlurmWaker
from worker.start_admission import StartAdmission
from worker.temporal_connection import connect_temporal, ensure_search_attributes
from worker.watcher_health import WatcherHealth, annotation, rfc3339
from workflows.node_sync import NodeSyncWorkflow
from workflows.placement import PlacementWorkflow
from workflows.sweep import SweepWorkflow

log = logging.getLogger(__name__)

# The event loop's thread lets go of the GIL in every socket call and then waits for it while
# another thread holds it: the SDK runs workflow activations in a thread pool. A holder is asked
# to let go only after the switch interval, 5 ms by default, so each of a bind's requests could
# wait that long again. At 1 ms, in the burst of 1,000, Slurm RUNNING -> pod bound p99 went from
# 2.1-2.3 to 1.4-1.5 s at the same rate (bench/results/2026-11-27-gil-switch-interval.md).
GIL_SWITCH_INTERVAL = 0.001


def prefer_the_event_loop() -> None:
    """Shorten the interpreter's GIL switch interval for the worker process (see above)."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)


def unsandboxed_runner(*, sandbox_every_workflow: bool) -> WorkflowRunner:
    """What runs the workflows marked unsandboxed: the sandbox too when `sandbox_every_workflow`."""
    return SandboxedWorkflowRunner() if sandbox_every_workflow else UnsandboxedWorkflowRunner()


@dataclass
class Bridge:
    """The worker and its three watchers, sharing one Temporal client, one Kubernetes and one Slurm client."""

    temporal: Client
    kube: KubeClient
    slurm: SlurmClient
    settings: WorkerSettings
    node_sync_schedule_id: str = NODE_SYNC_SCHEDULE_ID
    identity: str = field(default_factory=default_identity)  # this replica, as the Lease names it
    # Tests set it: workflows marked unsandboxed (the placement) run in the sandbox too, so
    # a non-deterministic call fails there instead of passing unnoticed.
    sandbox_every_workflow: bool = False
    meter: MetricMeter | None = None  # the bridge's own metrics, when they are served
    slurm_health: SlurmHealth = field(init=False)
    live_jobs: LiveJobs = field(init=False)
    pod_watcher: PodWatcher = field(init=False)
    job_watcher: JobWatcher = field(init=False)
    node_watcher: NodeWatcher = field(init=False)
    node_cache: NodeCache = field(init=False)
    worker: Worker = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        # The Slurm-health gate of this replica: its requests wait while Slurm is away.
        self.slurm_health = SlurmHealth(
            self.slurm.probe,
            probe_interval=s.slurm_probe_interval,
            observer=slurm_health_observer(self.meter) if self.meter is not None else None,
        )
        self.slurm.gate = self.slurm_health
        kube_activities = KubeActivities(
            self.kube,
            KubeSettings(
                scheduler_name=s.scheduler_name,
                defaults=Defaults(
                    s.partition,
                    s.mcs_label,
                    s.device_classes,
                    "per-pod" if s.heterogeneous_jobs else "largest-pod",
                ),
                policy=PolicyFile(s.tenant_policy_file),
            ),
        )
        self._kube_activities = kube_activities
        slurm_activities = SlurmActivities(self.slurm)
        # Every replica keeps the bridge's nodes watched: its placements read them from memory.
        self.node_cache = NodeCache(self.kube, s.scheduler_name)
        placement_activities = PlacementActivities(
            kube_activities, slurm_activities, self.node_cache, self.slurm_health, s.device_classes
        )
        node_activities = NodeActivities(
            self.kube,
            self.slurm,
            scheduler_name=s.scheduler_name,
            installation=s.installation_id,
            honoured=s.device_classes,
        )
        sweep_activities = SweepActivities(
            kube_activities, self.slurm, self.temporal, installation=s.installation_id
        )
        self.worker = Worker(
            self.temporal,
            task_queue=s.temporal_task_queue,
            workflows=[PlacementWorkflow, NodeSyncWorkflow, SweepWorkflow],
            activities=[
                *placement_activities.all(),
                node_activities.plan_node_sync,
                node_activities.apply_node_actions,
                sweep_activities.scan,
                sweep_activities.heal,
            ],
            max_concurrent_activities=s.temporal_max_concurrent_activities,
            max_concurrent_workflow_tasks=s.temporal_max_concurrent_workflow_tasks,
            max_cached_workflows=s.temporal_max_cached_workflows,
            unsandboxed_workflow_runner=unsandboxed_runner(
                sandbox_every_workflow=self.sandbox_every_workflow
            ),
            sticky_queue_schedule_to_start_timeout=timedelta(seconds=s.temporal_sticky_timeout),
            interceptors=[HeartbeatInterceptor()],
        )
        self.elector: LeaderElector | None = None
        self._started = time.time()
        self._temporal_check = CachedCheck(
            "Temporal", lambda: self.temporal.service_client.check_health(timeout=timedelta(seconds=3))
        )
        self._new_watchers()

    def _new_watchers(self) -> None:
        """Fresh watchers (and memory) for a term of leadership: nothing stale carries over."""
        s = self.settings
        self.live_jobs = LiveJobs()
        self.pod_watcher = PodWatcher(
            self.kube,
            self.temporal,
            task_queue=s.temporal_task_queue,
            scheduler_name=s.scheduler_name,
            installation=s.installation_id,
            jobs=self.live_jobs,
            deletion_slack_seconds=s.deletion_slack,
            eviction_patience_seconds=s.eviction_patience,
            tell=self._tell_waiting,
            step_heartbeat_seconds=s.step_heartbeat_timeout,
            # Enough placements started ahead of their claim to keep every activity slot busy.
            admission=StartAdmission(limit=2 * s.temporal_max_concurrent_activities),
        )
        self.job_watcher = JobWatcher(
            self.slurm,
            self.temporal,
            self.live_jobs,
            installation=s.installation_id,
            ready=self.pod_watcher.synced,
            interval=s.job_watch_interval,
            slurm_health=self.slurm_health,
        )
        self.slurm_waker = SlurmWaker(self.temporal, self.slurm_health, task_queue=s.temporal_task_queue)
        refresher = ExclusionRefresher(
            self.kube,
            self.slurm,
            self.temporal,
            scheduler_name=s.scheduler_name,
            installation=s.installation_id,
        )
        self.node_watcher = NodeWatcher(
            self.kube,
            self.temporal,
            schedule_id=self.node_sync_schedule_id,
            refresher=refresher,
            unschedulable=UnschedulableWakes(self.kube, scheduler_name=s.scheduler_name),
            task_queue=s.temporal_task_queue,
        )

    async def _tell_waiting(self, pod: PodRef, reason: str, message: str, warning: bool = True) -> None:
        """Why a pod waits before its placement takes it: PodScheduled=False and an Event."""
        await self._kube_activities.set_unschedulable([pod], reason, message)
        await self._kube_activities.record_event([pod], reason, message, warning)

    async def run(self) -> None:
        """Run until cancelled: the worker always, the cluster-wide watchers in the leader only.

        Every replica serves workflow and activity tasks on the task queue. With
        LEADER_ELECTION the pod, job and node watchers run in the one replica that
        holds the Lease; another takes over (re-listing everything) when it goes.
        """
        # Every replica: the Slurm-health prober, and the watched bridge nodes its placements read.
        background = [
            asyncio.create_task(self.slurm_health.run(), name="Slurm health prober"),
            asyncio.create_task(self.node_cache.run(), name="bridge node cache"),
        ]
        try:
            async with self.worker:
                await self._serve()
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)

    async def _serve(self) -> None:
        s = self.settings
        self._started = time.time()
        if not s.leader_election:
            await self._watch()
            return
        self.elector = LeaderElector(
            self.kube,
            s.lease_namespace,
            s.lease_name,
            self.identity,
            LeaderTimings(s.lease_duration, s.renew_deadline, s.retry_period),
            annotate=lambda: annotation(self.identity, self.watcher_health()),
        )
        await self.elector.run(self._lead)

    @property
    def watching(self) -> bool:
        """Whether this replica runs the watchers now."""
        return self.elector is None or self.elector.is_leader

    def watcher_health(self) -> dict[str, WatcherHealth]:
        pods, jobs, nodes = self.pod_watcher.informer, self.job_watcher, self.node_watcher.informer
        return {
            "pod": WatcherHealth(
                synced=pods.synced.is_set(),
                last_success=rfc3339(pods.last_success),
                failing=pods.failing,
                errors=pods.failures,
            ),
            "job": WatcherHealth(
                synced=self.pod_watcher.synced.is_set(),  # it follows the jobs the pod watcher listed
                last_success=rfc3339(jobs.last_success),
                failing=jobs.failing,
                errors=jobs.errors,
            ),
            "node": WatcherHealth(
                synced=nodes.synced.is_set(),
                last_success=rfc3339(nodes.last_success),
                failing=nodes.failing,
                errors=nodes.failures,
            ),
        }

    async def readiness(self, kube_grace: float = 15.0) -> Readiness:
        """Whether this replica can serve (worker/health.py says what counts)."""
        problems = []
        if not self.worker.is_running:
            problems.append("the Temporal worker is not running")
        if (temporal := await self._temporal_check.problem()) is not None:
            problems.append(temporal)
        if self.elector is not None:
            if (election := self.elector.check()) is not None:
                problems.append(election)
        else:
            pods = self.pod_watcher.informer
            quiet = time.time() - (pods.last_success or self._started)
            if pods.failing and quiet > kube_grace:
                problems.append(f"Kubernetes: the pod list/watch has failed for {quiet:.0f}s")
        detail: dict[str, Any] = {
            "identity": self.identity,
            "leader": self.elector.leader if self.elector is not None else None,
            "watching": self.watching,
        }
        if self.watching:
            detail["watchers"] = {name: health.model_dump() for name, health in self.watcher_health().items()}
        return Readiness(problems, detail)

    async def _lead(self) -> None:
        try:
            await self._watch()
        finally:
            self._new_watchers()  # the next term starts from a full list, as a new leader must

    async def _watch(self) -> None:
        tasks = [
            asyncio.create_task(self.pod_watcher.run(), name="pod watcher"),
            asyncio.create_task(self.job_watcher.run(), name="job watcher"),
            asyncio.create_task(self.node_watcher.run(), name="node watcher"),
            asyncio.create_task(self.slurm_waker.run(), name="Slurm waker"),
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.pod_watcher.close()
            await self.job_watcher.close()


async def run_worker(settings: WorkerSettings) -> None:
    """The `slurm-bridge worker` process."""
    prefer_the_event_loop()
    async with AsyncExitStack() as stack:
        temporal = await connect_temporal(settings, metrics_port=settings.metrics_port)
        await ensure_search_attributes(temporal)
        kube = KubeClient(await load_configuration(settings.kubeconfig))
        stack.push_async_callback(kube.close)
        # The runtime serving the SDK's metrics serves the bridge's too.
        meter = (
            (temporal.service_client.config.runtime or Runtime.default()).metric_meter
            if settings.metrics_port
            else None
        )
        slurm = SlurmClient(
            settings.slurm_rest_url,
            user_name=settings.slurm_user_name,
            token_file=settings.slurm_jwt_file,
            api_version=settings.slurm_api_version,
            observer=slurm_observer(meter) if meter is not None else None,
        )
        stack.push_async_callback(slurm.close)
        log.info(
            "worker on task queue %s (Temporal %s/%s, Slurm %s REST %s, scheduler %s)",
            settings.temporal_task_queue,
            settings.temporal_address,
            settings.temporal_namespace,
            settings.slurm_rest_url,
            settings.slurm_api_version,
            settings.scheduler_name,
        )
        await ensure_node_sync_schedule(temporal, settings)
        await ensure_sweep_schedule(temporal, settings)
        bridge = Bridge(temporal, kube, slurm, settings, meter=meter)
        if settings.health_port:
            await stack.enter_async_context(HealthServer(bridge.readiness, settings.health_port))
        await bridge.run()
