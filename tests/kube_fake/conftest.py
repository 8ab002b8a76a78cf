"""Fixtures: a fresh fake apiserver per test (startup is a few ms) and clients for it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import kubernetes.aio.client
import kubernetes.client
import pytest

from tests.kube_fake import FakeKubeServer


@pytest.fixture
def kube_fake() -> Iterator[FakeKubeServer]:
    with FakeKubeServer() as server:
        yield server


@pytest.fixture
def api_client(kube_fake: FakeKubeServer) -> Iterator[kubernetes.client.ApiClient]:
    client = kube_fake.api_client()
    yield client
    cast(Any, client).close()  # unannotated in the client


@pytest.fixture
def core(api_client: kubernetes.client.ApiClient) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(api_client)


@pytest.fixture
async def aio_client(kube_fake: FakeKubeServer) -> AsyncIterator[kubernetes.aio.client.ApiClient]:
    client = kube_fake.aio_api_client()
    yield client
    await cast(Any, client).close()  # unannotated in the client


@pytest.fixture
def aio_core(aio_client: kubernetes.aio.client.ApiClient) -> kubernetes.aio.client.CoreV1Api:
    return kubernetes.aio.client.CoreV1Api(aio_client)
