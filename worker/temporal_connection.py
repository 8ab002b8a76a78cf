"""The worker's connection to Temporal: connect, renew credentials, register search attributes.

`connect_temporal` makes the one `Client` a worker process shares (the Temporal
worker, the watchers, the schedules, the readiness check): TLS and API key
from TemporalSettings, the pydantic data converter, and, when METRICS_PORT is
set, a runtime serving the SDK's metrics. With credential files configured,
`CredentialReloader` reconnects when they rotate, under every holder of the
client at once. `ensure_search_attributes` registers the bridge's search
attributes where the server lets it.

worker/main.py composes these; `slurm-bridge doctor` and `status` connect
through `connect_temporal` too.
"""

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from google.protobuf.message import Message
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client, ClientConfig, WorkflowHistory
from temporalio.client import Plugin as ClientPlugin
from temporalio.common import SearchAttributeKey
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
from temporalio.worker import Replayer, ReplayerConfig, Worker, WorkerConfig, WorkflowReplayResult

from bridge import search_attributes as sa
from worker.settings import TemporalSettings

# The name these lines were logged under before the connection had a module of its
# own: log filters and alerts select on it (the `logger` field with LOG_FORMAT=json).
log = logging.getLogger("worker.main")


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

    temporalio's private API is used here, and only here, because the SDK has
    no public way to swap the connection under a `Client` (its service client is
    fixed when it is made, and a `Client` made anew would not reach the watchers,
    the activities and the schedules holding the old one). Its one extension
    point is a `ServiceClient` subclass returned by a client plugin
    (`connect_service_client`), and the `ServiceClient` ABC itself demands the
    private names: the abstract `_rpc_call`, through which every generated
    service call goes (delegated as is), and `worker_service_client`, typed
    `_BridgeServiceClient` (the connection a `Worker` polls on; Worker's
    documentation asks wrappers to expose the original one there).
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
