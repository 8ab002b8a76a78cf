"""The Kubernetes client trusts the environment only for a proxy (clients/kube_client.py)."""

import pytest

from clients.kube_client import KubeClient
from testbed.kube_fake import FakeKubeServer


@pytest.mark.parametrize(
    ("environment", "trusted"),
    [({}, False), ({"HTTPS_PROXY": "http://proxy:3128"}, True), ({"http_proxy": "http://proxy:3128"}, True)],
)
async def test_the_environment_is_read_only_when_it_names_a_proxy(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], trusted: bool
) -> None:
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with FakeKubeServer() as kube:
        configuration = kube.aio_configuration()
        client = KubeClient(configuration)
        try:
            assert (configuration.client_session_kwargs or {}).get("trust_env") is trusted
        finally:
            await client.close()


async def test_an_explicit_session_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HTTPS_PROXY", raising=False)
    with FakeKubeServer() as kube:
        configuration = kube.aio_configuration()
        configuration.client_session_kwargs = {"trust_env": True}
        client = KubeClient(configuration)
        try:
            assert (configuration.client_session_kwargs or {}).get("trust_env") is True
        finally:
            await client.close()
