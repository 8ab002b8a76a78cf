"""Fixtures: a fresh fake apiserver per test (startup is a few ms) and clients for it; and
``kube_api``, which runs a test once against the fake and once against the real kube-apiserver."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import kubernetes.aio.client
import kubernetes.client
import pytest

from testbed.kube_fake import FakeKubeServer
from testbed.kube_fake.backend import (
    WIDGETS,
    CustomResource,
    KubeApi,
    fake_api,
    install_custom_resource,
    real_api,
    uninstall_custom_resource,
)
from testbed.kube_real.apiserver import ApiServer


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


@pytest.fixture(scope="session")
def real_widgets(real_apiserver: ApiServer) -> Iterator[CustomResource]:
    """The custom resource of the both-backend tests, as a CRD on the session's real server
    (created once: it takes the server a second or two to serve a new CRD), deleted at the end."""
    install_custom_resource(real_apiserver, WIDGETS)
    try:
        yield WIDGETS
    finally:
        uninstall_custom_resource(real_apiserver, WIDGETS)


@pytest.fixture(params=["fake", "real"])
def kube_api(request: pytest.FixtureRequest) -> Iterator[KubeApi]:
    """The same test against the fake and against the real kube-apiserver (testbed/kube_fake/backend.py);
    the real one skips where its binaries are absent."""
    if request.param == "fake":
        with fake_api() as api:
            yield api
    else:
        with real_api(request.getfixturevalue("real_apiserver")) as api:
            yield api


@pytest.fixture
def widgets(kube_api: KubeApi, request: pytest.FixtureRequest) -> CustomResource:
    """A namespaced custom resource served by the test's server."""
    if kube_api.fake is not None:
        kube_api.fake.register_resource(WIDGETS.resource_type())
        return WIDGETS
    resource: CustomResource = request.getfixturevalue("real_widgets")
    return resource
