"""A Temporal namespace other than `default`, on the session's dev server."""

import uuid

import pytest
from google.protobuf.duration_pb2 import Duration
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from testbed.waiting import until

NAMESPACE = "slurm-bridge-prod"


@pytest.fixture(scope="session")
async def other_namespace(temporal_env: WorkflowEnvironment) -> str:
    """`slurm-bridge-prod`, registered once and usable (the frontend's namespace cache has it)."""
    client = temporal_env.client
    try:
        await client.workflow_service.register_namespace(
            RegisterNamespaceRequest(
                namespace=NAMESPACE, workflow_execution_retention_period=Duration(seconds=86400)
            )
        )
    except RPCError as error:
        if "already" not in error.message.lower():
            raise
    scoped = Client(client.service_client, namespace=NAMESPACE, data_converter=client.data_converter)

    async def usable() -> bool:  # refused (RPCError) until the frontend's namespace cache has it
        await scoped.count_workflows(f'WorkflowId = "{uuid.uuid4()}"')
        return True

    await until(usable, f"namespace {NAMESPACE} usable", 30, 0.25, ignoring=RPCError)
    return NAMESPACE
