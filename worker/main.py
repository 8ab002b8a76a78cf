"""Composition root: settings → clients → Temporal worker + watchers.

`Bridge` is what a `slurm-bridge worker` process runs, and what the end-to-end
tests run in-process: the same wiring, only the addresses differ.
"""

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from google.protobuf.message import Message
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client, ClientConfig, WorkflowHistory
from temporalio.client import Plugin as ClientPlugin
from temporalio.common import MetricMeter, SearchAttributeKey
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import (
    ConnectConfig,
    RPCError,
    ServiceClient,
    ServiceResponse,
    TLSConfig,
    _BridgeServiceClient,
)
from temporalio.worker import Plugin as WorkerPlugin
from temporalio.worker import (
    Replayer,
    ReplayerConfig,
    UnsandboxedWorkflowRunner,
    Worker,
    WorkerConfig,
    WorkflowReplayResult,
    WorkflowRunner,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from activities.kube import KubeActivities, KubeSettings
from activities.nodes import NodeActivities
from activities.placement import PlacementActivities
from activities.slurm import SlurmActivities
from activities.sweep import SweepActivities
from bridge import search_attributes as sa
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
from worker.node_rules import ExclusionRefresher
from worker.node_watcher import NodeWatcher
from worker.pod_watcher import PodWatcher
from worker.schedules import NODE_SYNC_SCHEDULE_ID, ensure_node_sync_schedule, ensure_sweep_schedule
from worker.settings import TemporalSettings, WorkerSettings
from worker.slurm_waker import SlurmWaker
from worker.watcher_health import WatcherHealth, annotation, rfc3339
from workflows.node_sync import NodeSyncWorkflow
from workflows.placement import PlacementWorkflow
from workflows.sweep import SweepWorkflow

log = logging.getLogger(__name__)


async def connect_temporal(settings: TemporalSettings, *, metrics_port: int = 0) -> Client:
    runtime = None
    if metrics_port:
        runtime = Runtime(
            telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=f"0.0.0.0:{metrics_port}"))
        )
    credentials = TemporalCredentials.read(settings)
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=pydantic_data_converter,
        tls=credentials.tls,
        api_key=credentials.api_key,
        runtime=runtime,
        # Credentials from files are watched while a worker runs on this client.
        plugins=[CredentialReloader(settings, credentials)] if any(credential_files(settings)) else [],
    )


@dataclass(frozen=True)
class TemporalCredentials:
    """What the connection authenticates with, as the files hold it now."""

    tls: TLSConfig | bool
    api_key: str | None

    @classmethod
    def read(cls, settings: TemporalSettings) -> "TemporalCredentials":
        def read(path: Path | None) -> bytes | None:
            return path.read_bytes() if path is not None else None

        tls: TLSConfig | bool = settings.temporal_tls_enabled
        if any(credential_files(settings)[:3]) or settings.temporal_tls_server_name:
            tls = TLSConfig(
                client_cert=read(settings.temporal_tls_cert_file),
                client_private_key=read(settings.temporal_tls_key_file),
                server_root_ca_cert=read(settings.temporal_tls_ca_file),
                domain=settings.temporal_tls_server_name,
            )
        api_key = read(settings.temporal_api_key_file)
        return cls(tls, api_key.decode().strip() if api_key is not None else None)


def credential_files(settings: TemporalSettings) -> tuple[Path | None, ...]:
    """Client certificate, key, CA and API key files (None where not configured)."""
    return (
        settings.temporal_tls_cert_file,
        settings.temporal_tls_key_file,
        settings.temporal_tls_ca_file,
        settings.temporal_api_key_file,
    )


class _ReconnectingServiceClient(ServiceClient):
    """The client's connection, replaceable by a new one (new credentials) under it.

    Every call of the Temporal client goes to the current connection, so the
    pod, job and node watchers follow a reconnection without knowing; a worker
    follows when its `client` is set again (Worker.client's setter).
    """

    def __init__(self, connection: ServiceClient) -> None:
        super().__init__(connection.config)
        self._connection = connection

    def use(self, connection: ServiceClient) -> None:
        self._connection = connection
        self.config = connection.config

    @property
    def worker_service_client(self) -> _BridgeServiceClient:
        return self._connection.worker_service_client

    def update_rpc_metadata(self, metadata: Mapping[str, str | bytes]) -> None:
        self._connection.update_rpc_metadata(metadata)

    def update_api_key(self, api_key: str | None) -> None:
        self._connection.update_api_key(api_key)

    async def _rpc_call(
        self,
        rpc: str,
        req: Message,
        resp_type: type[ServiceResponse],
        *,
        service: str,
        retry: bool,
        metadata: Mapping[str, str | bytes],
        timeout: timedelta | None,
    ) -> ServiceResponse:
        return await self._connection._rpc_call(
            rpc, req, resp_type, service=service, retry=retry, metadata=metadata, timeout=timeout
        )


class CredentialReloader(ClientPlugin, WorkerPlugin):
    """Reconnects to Temporal with the new files when the certificate, key, CA or API key rotate.

    The Python SDK cannot change a connection's TLS in place, so the supported
    way is a new connection on the same runtime, handed to the worker through
    `Worker.client` (its pollers move over; calls under way finish on the old
    one). The files are compared by content every
    TEMPORAL_CREDENTIALS_RELOAD_INTERVAL seconds while a worker runs: a
    Kubernetes Secret volume is updated by swapping a symlink, which a
    modification time of the path does not always show. New files that do not
    connect (a key that does not match its certificate, half of a rotation)
    are logged and tried again at the next check; the connection in use stays.
    """

    def __init__(self, settings: TemporalSettings, credentials: TemporalCredentials) -> None:
        self.settings = settings
        self.in_use = credentials
        self._service: _ReconnectingServiceClient | None = None
        self._workers: set[Worker] = set()
        self._watch: asyncio.Task[None] | None = None
        self._refused: TemporalCredentials | None = None

    def name(self) -> str:
        return "slurm-bridge.CredentialReloader"

    def configure_client(self, config: ClientConfig) -> ClientConfig:
        return config

    async def connect_service_client(
        self, config: ConnectConfig, next: Callable[[ConnectConfig], Awaitable[ServiceClient]]
    ) -> ServiceClient:
        self._service = _ReconnectingServiceClient(await next(config))
        return self._service

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        return config

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        self._workers.add(worker)
        if self._watch is None:
            self._watch = asyncio.create_task(self._watch_files(), name="Temporal credential reloader")
        try:
            await next(worker)
        finally:
            self._workers.discard(worker)
            if not self._workers and self._watch is not None:
                self._watch.cancel()
                await asyncio.gather(self._watch, return_exceptions=True)
                self._watch = None

    def configure_replayer(self, config: ReplayerConfig) -> ReplayerConfig:
        return config

    def run_replayer(
        self,
        replayer: Replayer,
        histories: AsyncIterator[WorkflowHistory],
        next: Callable[
            [Replayer, AsyncIterator[WorkflowHistory]],
            AbstractAsyncContextManager[AsyncIterator[WorkflowReplayResult]],
        ],
    ) -> AbstractAsyncContextManager[AsyncIterator[WorkflowReplayResult]]:
        return next(replayer, histories)

    async def _watch_files(self) -> None:
        while True:
            await asyncio.sleep(self.settings.temporal_credentials_reload_interval)
            try:
                await self.reload()
            except Exception:  # the watch must outlive any one bad check
                log.exception("checking the Temporal credential files failed")

    async def reload(self) -> bool:
        """Reconnect if the files changed since the connection in use was made; True if it did."""
        files = ", ".join(str(path) for path in credential_files(self.settings) if path is not None)
        try:
            fresh = TemporalCredentials.read(self.settings)
        except OSError as error:
            log.warning("cannot read the Temporal credentials (%s): %s; the connection stays", files, error)
            return False
        if fresh == self.in_use or self._service is None:
            return False
        config = replace(self._service.config, tls=fresh.tls, api_key=fresh.api_key)
        try:
            connection = await ServiceClient.connect(config)
        except RuntimeError as error:
            if fresh != self._refused:
                log.warning(
                    "the renewed Temporal credentials (%s) do not connect: %s; the connection in use "
                    "stays and they are tried again every %g s",
                    files,
                    error,
                    self.settings.temporal_credentials_reload_interval,
                )
            self._refused = fresh
            return False
        self._service.use(connection)
        for worker in self._workers:
            worker.client = worker.client  # the setter moves the worker to the new connection
        self.in_use, self._refused = fresh, None
        log.info("reconnected to Temporal with the renewed credentials (%s)", files)
        return True


async def ensure_search_attributes(client: Client, keys: Sequence[SearchAttributeKey[Any]] = sa.ALL) -> None:
    """Register the bridge's search attributes where the server lets us (a dev or self-hosted server)."""
    try:
        existing = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace)
        )
        missing = {
            key.name: IndexedValueType.ValueType(key.indexed_value_type)
            for key in keys
            if key.name not in existing.custom_attributes
        }
        if missing:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
            )
            log.info("registered search attributes %s", ", ".join(sorted(missing)))
    except RPCError as error:
        commands = "; ".join(
            f"temporal operator search-attribute create --name {k.name} --type {_type_name(k)}" for k in keys
        )
        log.warning("could not register search attributes (%s); register them once with: %s", error, commands)


def _type_name(key: SearchAttributeKey[Any]) -> str:
    # INDEXED_VALUE_TYPE_KEYWORD_LIST → KeywordList, as the CLI spells it.
    name = IndexedValueType.Name(IndexedValueType.ValueType(key.indexed_value_type))
    return "".join(part.title() for part in name.removeprefix("INDEXED_VALUE_TYPE_").split("_"))


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
                defaults=Defaults(s.partition, s.mcs_label, s.device_classes),
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
                node_activities.read_node_snapshot,
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
            self.kube, self.temporal, schedule_id=self.node_sync_schedule_id, refresher=refresher
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
