"""The same contract through ``kubernetes.aio`` (client, watch, kubeconfig loading).

The tests taking ``aio_kube`` run against the fake and the real kube-apiserver alike;
the others use the fake's request log, history compaction or bookmark helper.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import kubernetes.aio.client
import pytest
from kubernetes.aio.client.exceptions import ApiException

from testbed.kube_fake import FakeKubeServer
from testbed.kube_fake.backend import KubeApi
from testbed.kube_fake.builders import Client, aio_kube_config, aio_watch, error_body, pod_body


@pytest.fixture
async def aio_kube(kube_api: KubeApi) -> AsyncIterator[tuple[Client, str]]:
    """A ``kubernetes.aio`` CoreV1Api for the test's server, and its namespace."""
    client = kube_api.aio_api_client()
    try:
        yield kubernetes.aio.client.CoreV1Api(client), kube_api.namespace
    finally:
        await client.close()  # type: ignore[no-untyped-call]


async def test_crud_binding_and_errors(aio_kube: tuple[Client, str]) -> None:
    aio_core, ns = aio_kube
    pod = await aio_core.create_namespaced_pod(ns, pod_body("p"))
    assert pod.status.phase == "Pending"
    assert pod.spec.scheduler_name == "default-scheduler"
    with pytest.raises(ApiException) as exc:
        await aio_core.create_namespaced_pod(ns, pod_body("p"))
    assert exc.value.status == 409
    assert error_body(exc.value)["reason"] == "AlreadyExists"
    binding = {"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}}
    resp = await aio_core.create_namespaced_pod_binding_without_preload_content("p", ns, binding)
    assert resp.status == 201
    assert json.loads(await resp.read())["status"] == "Success"
    assert (await aio_core.read_namespaced_pod("p", ns)).spec.node_name == "n1"
    resp = await aio_core.create_namespaced_pod_binding_without_preload_content("p", ns, binding)
    assert resp.status == 409
    assert 'is already assigned to node "n1"' in json.loads(await resp.read())["message"]
    patched = await aio_core.patch_namespaced_pod(
        "p", ns, [{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}]
    )
    assert patched.metadata.labels == {"a": "b"}
    with pytest.raises(ApiException) as exc:
        await aio_core.read_namespaced_pod("missing", ns)
    assert exc.value.status == 404


async def test_aio_watch_replay_and_live(aio_kube: tuple[Client, str]) -> None:
    aio_core, ns = aio_kube
    rv = (await aio_core.create_namespaced_pod(ns, pod_body("a"))).metadata.resource_version
    await aio_core.create_namespaced_pod(ns, pod_body("b"))
    seen = []
    async with aio_watch.Watch() as w:
        async for event in w.stream(aio_core.list_namespaced_pod, ns, resource_version=rv, timeout_seconds=5):
            seen.append((event["type"], event["object"].metadata.name))
            if len(seen) == 1:
                await aio_core.delete_namespaced_pod("a", ns)
            elif event["type"] == "DELETED":
                w.stop()
    # The deletion: marked (deletionTimestamp), then removed.
    assert seen == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "a")]


async def _drain(core: Client, **kwargs: object) -> None:
    async with aio_watch.Watch() as w:
        async for _ in w.stream(core.list_namespaced_pod, "default", **kwargs):
            pass


async def test_aio_watch_410_then_relist_and_rewatch(kube_fake: FakeKubeServer, aio_core: Client) -> None:
    """Fake only: counts the client's watch requests in the fake's request log."""
    old = (await aio_core.create_namespaced_pod("default", pod_body("a"))).metadata.resource_version
    await aio_core.create_namespaced_pod("default", pod_body("b"))
    kube_fake.compact_history()
    for kwargs, attempts in (({"timeout_seconds": 5}, 1), ({}, 2)):  # raised at once / after one resume
        kube_fake.clear_requests()
        with pytest.raises(ApiException) as exc:
            await _drain(aio_core, resource_version=old, **kwargs)
        assert exc.value.status == 410
        assert len([r for r in kube_fake.requests if r.query.get("watch") == "true"]) == attempts
    listed = await aio_core.list_namespaced_pod("default")
    await aio_core.create_namespaced_pod("default", pod_body("c"))
    seen = []
    async with aio_watch.Watch() as w:
        stream = w.stream(
            aio_core.list_namespaced_pod,
            "default",
            resource_version=listed.metadata.resource_version,
            timeout_seconds=5,
        )
        async for event in stream:
            seen.append((event["type"], event["object"].metadata.name))
            w.stop()
    assert seen == [("ADDED", "c")]


async def test_aio_bookmark_and_wait_for_async(kube_fake: FakeKubeServer, aio_core: Client) -> None:
    """Fake only: ``send_bookmarks`` and ``wait_for_async``."""
    await aio_core.create_namespaced_pod("default", pod_body("a"))
    kinds = []
    async with aio_watch.Watch() as w:
        stream = w.stream(
            aio_core.list_namespaced_pod, "default", allow_watch_bookmarks=True, timeout_seconds=5
        )
        async for event in stream:
            kinds.append(event["type"])
            if event["type"] == "ADDED":
                assert await kube_fake.wait_for_async(lambda: kube_fake.active_watches == 1)
                kube_fake.send_bookmarks()
            else:
                w.stop()
    assert kinds == ["ADDED", "BOOKMARK"]


async def test_aio_kubeconfig_loading(kube_api: KubeApi, tmp_path: Path) -> None:
    if kube_api.fake is not None:
        path = kube_api.fake.kubeconfig(tmp_path / "config", namespace=kube_api.namespace)
    else:
        assert kube_api.real is not None
        path = kube_api.real.kubeconfig(tmp_path / "config", namespace=kube_api.namespace)
    cfg: Client = kubernetes.aio.client.Configuration()
    await aio_kube_config.load_kube_config(config_file=str(path), client_configuration=cfg)
    assert cfg.host == kube_api.url
    kube_api.core.create_namespaced_pod(kube_api.namespace, pod_body("p"))
    async with kubernetes.aio.client.ApiClient(cfg) as client:
        core: Client = kubernetes.aio.client.CoreV1Api(client)
        pods = await core.list_namespaced_pod(kube_api.namespace)
    assert [p.metadata.name for p in pods.items] == ["p"]
