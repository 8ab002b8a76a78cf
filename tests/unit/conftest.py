"""Fixtures shared by the unit tests that talk to the fake Kubernetes API server over HTTP."""

from collections.abc import AsyncIterator, Iterator

import pytest

from clients.kube_client import KubeClient
from testbed.kube_fake import FakeKubeServer


@pytest.fixture
def kube() -> Iterator[FakeKubeServer]:
    """A fresh fake API server (a test module may override it to seed objects)."""
    with FakeKubeServer() as server:
        yield server


@pytest.fixture
async def client(kube: FakeKubeServer) -> AsyncIterator[KubeClient]:
    """The bridge's Kubernetes client, talking to `kube`."""
    client = KubeClient(kube.aio_configuration())
    yield client
    await client.close()
