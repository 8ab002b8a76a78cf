"""Composition root: settings → clients → Temporal worker + watchers.

`Bridge` is what a `slurm-bridge worker` process runs, and what the end-to-end
tests run in-process: the same wiring, only the addresses differ.
"""

import asyncio
import logging
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import RPCError, TLSConfig
from temporalio.worker import Worker

from activities.kube import KubeActivities, KubeSettings
from activities.kube_client import KubeClient, load_configuration
from activities.nodes import NodeActivities
from activities.slurm import SlurmActivities
from activities.slurm_client import SlurmClient
from bridge import search_attributes as sa
from bridge.translate import Defaults
from worker.job_watcher import JobWatcher
from worker.metrics import slurm_observer
from worker.node_watcher import NodeWatcher
from worker.pod_watcher import PodWatcher
from worker.schedules import NODE_SYNC_SCHEDULE_ID, ensure_node_sync_schedule
from worker.settings import TemporalSettings, WorkerSettings
from workflows.node_sync import NodeSyncWorkflow
from workflows.placement import PlacementWorkflow

log = logging.getLogger(__name__)


async def connect_temporal(settings: TemporalSettings, *, metrics_port: int = 0) -> Client:
    runtime = None
    if metrics_port:
        runtime = Runtime(
            telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=f"0.0.0.0:{metrics_port}"))
        )
    api_key = settings.temporal_api_key_file.read_text().strip() if settings.temporal_api_key_file else None
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=pydantic_data_converter,
        tls=TLSConfig() if settings.temporal_tls else False,
        api_key=api_key,
        runtime=runtime,
    )


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


@dataclass
class Bridge:
    """The worker and its three watchers, sharing one Temporal client, one Kubernetes and one Slurm client."""

    temporal: Client
    kube: KubeClient
    slurm: SlurmClient
    settings: WorkerSettings
    node_sync_schedule_id: str = NODE_SYNC_SCHEDULE_ID
    pod_watcher: PodWatcher = field(init=False)
    job_watcher: JobWatcher = field(init=False)
    node_watcher: NodeWatcher = field(init=False)
    worker: Worker = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        kube_activities = KubeActivities(
            self.kube,
            KubeSettings(scheduler_name=s.scheduler_name, defaults=Defaults(s.partition, s.mcs_label)),
        )
        slurm_activities = SlurmActivities(self.slurm)
        node_activities = NodeActivities(self.kube, self.slurm, scheduler_name=s.scheduler_name)
        self.worker = Worker(
            self.temporal,
            task_queue=s.temporal_task_queue,
            workflows=[PlacementWorkflow, NodeSyncWorkflow],
            activities=[
                kube_activities.add_finalizer,
                kube_activities.remove_finalizer,
                kube_activities.translate,
                kube_activities.label_job_id,
                kube_activities.resolve_nodes,
                kube_activities.bind_pods,
                kube_activities.record_event,
                kube_activities.set_unschedulable,
                kube_activities.delete_pods,
                slurm_activities.submit_job,
                slurm_activities.update_job,
                slurm_activities.get_job,
                slurm_activities.cancel_job,
                node_activities.read_node_snapshot,
                node_activities.apply_node_actions,
            ],
        )
        self.pod_watcher = PodWatcher(
            self.kube, self.temporal, task_queue=s.temporal_task_queue, scheduler_name=s.scheduler_name
        )
        self.job_watcher = JobWatcher(
            self.slurm,
            self.temporal,
            ready=self.pod_watcher.synced,
            interval=s.job_watch_interval,
        )
        self.node_watcher = NodeWatcher(self.kube, self.temporal, schedule_id=self.node_sync_schedule_id)

    async def run(self) -> None:
        """Run until cancelled."""
        async with self.worker:
            tasks = [
                asyncio.create_task(self.pod_watcher.run(), name="pod watcher"),
                asyncio.create_task(self.job_watcher.run(), name="job watcher"),
                asyncio.create_task(self.node_watcher.run(), name="node watcher"),
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
        slurm = SlurmClient(
            settings.slurm_rest_url,
            user_name=settings.slurm_user_name,
            token_file=settings.slurm_jwt_file,
            # The runtime serving the SDK's metrics serves the bridge's too.
            observer=slurm_observer(
                (temporal.service_client.config.runtime or Runtime.default()).metric_meter
            )
            if settings.metrics_port
            else None,
        )
        stack.push_async_callback(slurm.close)
        log.info(
            "worker on task queue %s (Temporal %s/%s, Slurm %s, scheduler %s)",
            settings.temporal_task_queue,
            settings.temporal_address,
            settings.temporal_namespace,
            settings.slurm_rest_url,
            settings.scheduler_name,
        )
        await ensure_node_sync_schedule(temporal, settings)
        await Bridge(temporal, kube, slurm, settings).run()
