"""The doctor's Temporal checks: the connection (TLS, API key), the namespace, and the bridge's
search attributes with their types."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeIndexedValueType, SearchAttributeKey
from temporalio.service import RPCError, RPCStatusCode

from bridge import search_attributes as sa
from worker.doctor.check import TIMEOUT, Check
from worker.settings import WorkerSettings
from worker.temporal_connection import connect_temporal


async def temporal_checks(settings: WorkerSettings) -> list[Check]:
    area = "Temporal"
    s = settings
    tls = []
    if s.temporal_tls_cert_file:
        tls.append("client certificate")
    if s.temporal_api_key_file:
        tls.append("API key")
    how = f"{'TLS' if s.temporal_tls_enabled else 'plaintext'}{', ' + ', '.join(tls) if tls else ''}"
    try:
        client = await asyncio.wait_for(connect_temporal(s), TIMEOUT)
    except (RuntimeError, OSError, TimeoutError) as error:
        return [
            Check(
                area,
                "connection",
                "fail",
                f"cannot connect to {s.temporal_address} ({how}): {error or 'timed out'}",
                "check TEMPORAL_ADDRESS (--temporal-address); for TLS: TEMPORAL_TLS, "
                "TEMPORAL_TLS_CA_FILE, TEMPORAL_TLS_SERVER_NAME; for mTLS: TEMPORAL_TLS_CERT_FILE, "
                "TEMPORAL_TLS_KEY_FILE",
            )
        ]
    checks = [Check(area, "connection", "ok", f"{s.temporal_address} ({how})")]
    namespace = await _namespace(client)
    checks.append(namespace)
    if namespace.status == "ok":
        checks.append(await search_attributes_check(client))
    return checks


async def _namespace(client: Client) -> Check:
    namespace = client.namespace
    try:
        described = await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=namespace), timeout=timedelta(seconds=TIMEOUT)
        )
    except RPCError as error:
        if error.status == RPCStatusCode.NOT_FOUND:
            return Check(
                "Temporal",
                "namespace",
                "fail",
                f"namespace {namespace} does not exist",
                "set TEMPORAL_NAMESPACE (--temporal-namespace) to an existing namespace (Temporal Cloud: "
                f"the id <name>.<account>), or create it: temporal operator namespace create {namespace}",
            )
        return Check(
            "Temporal",
            "namespace",
            "fail",
            f"namespace {namespace}: {error.message}",
            "the credentials were refused: check TEMPORAL_API_KEY_FILE or the client certificate "
            "(TEMPORAL_TLS_CERT_FILE, TEMPORAL_TLS_KEY_FILE) and their access to this namespace",
        )
    retention = described.config.workflow_execution_retention_ttl.ToTimedelta()
    return Check("Temporal", "namespace", "ok", f"{namespace} (retention {retention.days} days)")


async def search_attributes_check(client: Client, keys: Sequence[SearchAttributeKey[Any]] = sa.ALL) -> Check:
    """Every search attribute the bridge sets, registered with its type."""
    namespace = client.namespace
    expected = {key.name: IndexedValueType.ValueType(key.indexed_value_type) for key in keys}
    try:
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace), timeout=timedelta(seconds=TIMEOUT)
        )
        registered: dict[str, int | None] = dict(listed.custom_attributes)
    except RPCError:
        # Not allowed to list (Temporal Cloud with a namespace-scoped key): ask with queries instead.
        registered = await _probe_search_attributes(client, keys)
    missing = [name for name in expected if name not in registered]
    wrong = [
        f"{name} is {_type_name(registered[name])}, must be {_type_name(kind)}"
        for name, kind in expected.items()
        if name in registered and registered[name] is not None and registered[name] != kind
    ]
    if not missing and not wrong:
        return Check("Temporal", "search attributes", "ok", f"registered: {', '.join(expected)}")
    problems = ([f"missing {', '.join(missing)}"] if missing else []) + wrong
    todo = [k for k in keys if k.name in missing]
    self_hosted = "; ".join(
        f"temporal operator search-attribute create --namespace {namespace} --name {k.name} "
        f"--type {_type_name(k.indexed_value_type)}"
        for k in todo
    )
    cloud = f"tcld namespace search-attributes add --namespace {namespace} " + " ".join(
        f"--search-attribute {k.name}={_type_name(k.indexed_value_type)}" for k in todo
    )
    fix = (
        f"register them once: {self_hosted} (Temporal Cloud: {cloud}); the worker does it at start "
        "where the server lets it"
        if todo
        else "the bridge needs these types: remove and register them again, or use another namespace"
    )
    return Check("Temporal", "search attributes", "fail", "; ".join(problems), fix)


async def _probe_search_attributes(
    client: Client, keys: Sequence[SearchAttributeKey[Any]]
) -> dict[str, int | None]:
    """A query naming an unknown attribute is refused (InvalidArgument); the type is not learned."""
    found: dict[str, int | None] = {}
    for key in keys:
        value = "0" if key.indexed_value_type == SearchAttributeIndexedValueType.INT else '"doctor"'
        try:
            await client.count_workflows(f"{key.name} = {value}")
            found[key.name] = None
        except RPCError as error:
            if error.status != RPCStatusCode.INVALID_ARGUMENT:
                raise
    return found


def _type_name(kind: int | None) -> str:
    # INDEXED_VALUE_TYPE_KEYWORD_LIST -> KeywordList, as both CLIs spell it.
    name = IndexedValueType.Name(IndexedValueType.ValueType(kind or 0))
    return "".join(part.title() for part in name.removeprefix("INDEXED_VALUE_TYPE_").split("_"))
