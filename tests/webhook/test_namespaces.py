"""Managed namespaces by label selector: a list + watch cache against the fake API server.

Label changes change the decision with no GET per request; an expired watch
(410) is followed by a re-list; the whole command, configured by KUBECONFIG,
serves decisions from the cache over HTTPS.
"""

import asyncio
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from bridge.labels import parse_selector
from clients.kube_client import KubeClient
from testbed.kube_fake import FakeKubeServer
from testbed.waiting import wait_until
from tests.webhook.conftest import CertFiles, RunningServer, client_for, serve_command
from tests.webhook.reviews import SCHEDULER, pod, response_of, review
from webhook.namespaces import NamespaceLabelCache, SelectedNamespaces
from webhook.settings import load_settings

SELECTOR = "slurm-bridge=managed"


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def relabel(kube: FakeKubeServer, name: str, **labels: str) -> None:
    def change(obj: dict[str, Any]) -> None:
        obj["metadata"]["labels"] = labels

    kube.update_object("namespaces", name, change)


def single_gets(kube: FakeKubeServer) -> list[str]:
    """GETs of one namespace: what the cache exists to avoid."""
    return [r.path for r in kube.requests if r.method == "GET" and r.path.startswith("/api/v1/namespaces/")]


def watches(kube: FakeKubeServer) -> int:
    return len(
        [r for r in kube.requests if r.path == "/api/v1/namespaces" and r.query.get("watch") == "true"]
    )


async def cache_shows(selected: SelectedNamespaces, check: Callable[[], bool]) -> None:
    """Until the label cache shows `check()`: re-checked on each of its watch's events, no polling."""
    await asyncio.wait_for(selected.cache.store.wait_until(check), 5)


def selects(selected: SelectedNamespaces, name: str) -> bool:
    """The cache's answer for `name`, read without the GET `is_managed` makes for a namespace not seen."""
    labels = selected.cache.labels.get(name)
    return labels is not None and selected.selector.matches(labels)


@pytest.fixture
def kube() -> Iterator[FakeKubeServer]:
    with FakeKubeServer() as server:
        server.create_object("namespaces", namespace("hpc", **{"slurm-bridge": "managed"}))
        server.create_object("namespaces", namespace("web", team="web"))
        yield server


@pytest.fixture
async def selected(kube: FakeKubeServer) -> AsyncIterator[SelectedNamespaces]:
    cache = NamespaceLabelCache(
        KubeClient(kube.aio_configuration()), watch_timeout_seconds=1, max_backoff=0.2
    )
    namespaces = SelectedNamespaces(parse_selector(SELECTOR), cache)
    await namespaces.start()
    yield namespaces
    await namespaces.stop()


async def test_decisions_follow_label_changes_without_a_get_per_request(
    kube: FakeKubeServer, selected: SelectedNamespaces
) -> None:
    await asyncio.wait_for(selected.cache.synced.wait(), 5)
    assert selected.not_ready_reason() is None
    assert await selected.is_managed("hpc")
    assert not await selected.is_managed("web")

    relabel(kube, "web", **{"slurm-bridge": "managed"})
    relabel(kube, "hpc", team="hpc")

    await cache_shows(selected, lambda: selects(selected, "web") and not selects(selected, "hpc"))
    assert await selected.is_managed("web")
    assert not await selected.is_managed("hpc")
    for _ in range(100):
        await selected.is_managed("web")
    kube.create_object("namespaces", namespace("new", **{"slurm-bridge": "managed"}))

    await cache_shows(selected, lambda: "new" in selected.cache.labels)
    assert await selected.is_managed("new")
    assert single_gets(kube) == []
    assert selected.cache.lookups == 0
    assert selected.cache.lists == 1


async def test_an_expired_watch_is_followed_by_a_relist(
    kube: FakeKubeServer, selected: SelectedNamespaces
) -> None:
    await asyncio.wait_for(selected.cache.synced.wait(), 5)
    assert await kube.wait_for_async(lambda: kube.active_watches == 1)
    # Hold the next watch request (the resume after the 1 s stream ends) while
    # the namespace changes and the API server forgets the history before it.
    kube.delay_next("GET", r"^/api/v1/namespaces$", 1.0)
    assert await kube.wait_for_async(lambda: watches(kube) >= 2, 5)
    relabel(kube, "web", **{"slurm-bridge": "managed"})
    kube.compact_history()

    await cache_shows(selected, lambda: selected.cache.lists >= 2 and selects(selected, "web"))
    assert await selected.is_managed("web")
    assert single_gets(kube) == []


async def test_a_namespace_not_yet_seen_is_fetched_once(kube: FakeKubeServer) -> None:
    # Not started: as if a pod arrived for a namespace whose watch event is still on its way.
    cache = NamespaceLabelCache(KubeClient(kube.aio_configuration()))
    namespaces = SelectedNamespaces(parse_selector(SELECTOR), cache)
    assert namespaces.not_ready_reason() == "namespace labels not listed yet"
    assert await namespaces.is_managed("hpc")
    assert await namespaces.is_managed("hpc")
    assert not await namespaces.is_managed("missing")
    assert single_gets(kube) == ["/api/v1/namespaces/hpc", "/api/v1/namespaces/missing"]
    await cache.kube.close()


async def test_the_cache_survives_api_errors(kube: FakeKubeServer) -> None:
    kube.fail_next("GET", r"^/api/v1/namespaces$", 500, count=2)
    cache = NamespaceLabelCache(KubeClient(kube.aio_configuration()), max_backoff=0.1)
    await cache.start()
    try:
        await asyncio.wait_for(cache.synced.wait(), 5)
        # The API server labels every namespace with its own name.
        assert cache.labels["hpc"] == {"slurm-bridge": "managed", "kubernetes.io/metadata.name": "hpc"}
    finally:
        await cache.stop()
        await cache.kube.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def command_server(kube: FakeKubeServer, cert_files: CertFiles, tmp_path: Path) -> Iterator[RunningServer]:
    """`slurm-bridge webhook` as configured in a cluster: selector mode, KUBECONFIG, real HTTPS."""
    settings = load_settings(
        tls_cert_file=cert_files.cert,
        tls_key_file=cert_files.key,
        host="127.0.0.1",
        port=free_port(),
        managed_namespace_selector=SELECTOR,
        managed_namespaces="web",  # ignored: the selector wins
        kubeconfig=str(kube.kubeconfig(tmp_path / "kubeconfig")),
    )
    running = serve_command(settings)
    yield running
    running.stop()


def test_the_command_decides_from_namespace_labels(
    command_server: RunningServer, kube: FakeKubeServer, ca: trustme.CA
) -> None:
    with client_for(ca, command_server.url) as http:
        wait_until(lambda: http.get("/readyz").status_code == 200, "the webhook's /readyz", timeout=5)

        def scheduler_after_mutation(ns: str) -> str | None:
            sent = review(pod(namespace=ns), namespace=ns)
            response = response_of(http.post("/mutate", json=sent).json(), sent)
            return SCHEDULER if "patch" in response else None

        assert scheduler_after_mutation("hpc") == SCHEDULER
        assert scheduler_after_mutation("web") is None
        relabel(kube, "web", **{"slurm-bridge": "managed"})
        wait_until(lambda: scheduler_after_mutation("web"), "the label change seen by the webhook", timeout=5)
        for _ in range(20):
            assert scheduler_after_mutation("web") == SCHEDULER
    assert single_gets(kube) == []
