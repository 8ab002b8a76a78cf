"""DRA classes at admission: only those DRA_DEVICE_CLASSES names, and only DeviceClasses the cluster has.

`slurm-bridge webhook` as a cluster runs it (settings, KUBECONFIG, real HTTPS), against the fake
API server serving resource.k8s.io/v1 — or not serving it, as Kubernetes before 1.34 answers
(a plain-text 404). Without these denials such a pod would wait in Slurm's queue and then fail
at binding (tests/e2e/test_dra.py shows that path).
"""

import asyncio
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from bridge.dra import RESOURCE_GROUP
from clients.kube_client import KubeClient
from testbed.kube_fake import DEFAULT_RESOURCES, FakeKubeServer
from testbed.waiting import wait_until
from tests.deploy.chart import manifests, one
from tests.deploy.test_rbac import granted
from tests.e2e.test_rbac_in_use import authorized_as
from tests.webhook.conftest import CertFiles, RunningServer, client_for, serve_command
from tests.webhook.reviews import DRA, JOB, MANAGED_NS, Json, container, pod, response_of, review
from webhook.command import build_server
from webhook.device_classes import DeviceClassCache
from webhook.policy import ClusterDeviceClasses
from webhook.settings import ConfigurationError, load_settings

CLASSES = "deviceclasses.resource.k8s.io"
CLASS_PATH = f"/apis/{RESOURCE_GROUP}/v1/deviceclasses"


def device_class(name: str) -> Json:
    return {
        "apiVersion": f"{RESOURCE_GROUP}/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{name}'"}}]},
    }


def dra_pod(*classes: str, name: str = "p") -> Json:
    return pod(name, containers=[container(limits={DRA + c: "1" for c in classes})])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def single_gets(kube: FakeKubeServer, name: str) -> int:
    """GETs of one DeviceClass: what the cache exists to avoid for classes it has."""
    return len([r for r in kube.requests if r.method == "GET" and r.path == f"{CLASS_PATH}/{name}"])


def watching(kube: FakeKubeServer) -> bool:
    return any(r.path == CLASS_PATH and r.query.get("watch") == "true" for r in kube.requests)


class Webhook:
    """The command's server in a thread of its own, and a client for it."""

    def __init__(self, running: RunningServer, ca: trustme.CA) -> None:
        self.running = running
        self.http = client_for(ca, running.url)

    def validate(self, sent: Json) -> Json:
        return response_of(self.http.post("/validate", json=sent).json(), sent)

    def denial(self, sent: Json) -> str:
        response = self.validate(sent)
        assert not response["allowed"], response
        assert response["status"]["code"] == 403
        message: str = response["status"]["message"]
        return message

    def allowed(self, sent: Json) -> Json:
        response = self.validate(sent)
        assert response["allowed"], response.get("status")
        return response


@pytest.fixture
def kube() -> Iterator[FakeKubeServer]:
    with FakeKubeServer() as server:
        server.create_object(CLASSES, device_class("gpu.nvidia.com"))
        server.create_object(CLASSES, device_class("dra.cpu"))
        yield server


def unserve_dra(kube: FakeKubeServer) -> None:
    """The API server of Kubernetes before 1.34: no resource.k8s.io at all (a plain-text 404)."""
    for plural in ("deviceclasses", "resourceslices", "resourceclaims", "resourceclaimtemplates"):
        kube.registry.unregister(RESOURCE_GROUP, plural)
    assert RESOURCE_GROUP not in kube.registry.groups()


StartWebhook = Callable[..., Webhook]


@pytest.fixture
def start_webhook(
    kube: FakeKubeServer, cert_files: CertFiles, ca: trustme.CA, tmp_path: Path
) -> Iterator[StartWebhook]:
    started: list[Webhook] = []

    def start(**overrides: Any) -> Webhook:
        given = {"kubeconfig": str(kube.kubeconfig(tmp_path / "kubeconfig")), **overrides}
        settings = load_settings(
            tls_cert_file=cert_files.cert,
            tls_key_file=cert_files.key,
            host="127.0.0.1",
            port=free_port(),
            managed_namespaces=MANAGED_NS,
            **given,
        )
        webhook = Webhook(serve_command(settings), ca)
        started.append(webhook)
        return webhook

    yield start
    for webhook in started:
        webhook.http.close()
        webhook.running.stop()


def test_a_class_the_cluster_does_not_have_is_refused_and_one_it_has_is_admitted(
    start_webhook: StartWebhook, kube: FakeKubeServer
) -> None:
    webhook = start_webhook()
    kube.wait_for(lambda: watching(kube), 10)  # the DeviceClass watch (re-checked on each request)

    message = webhook.denial(review(dra_pod("gpu.example.com")))
    assert (
        "deviceclass.resource.kubernetes.io/gpu.example.com asks for DeviceClass gpu.example.com, which does "
        "not exist in the cluster (kubectl get deviceclasses)"
    ) in message
    for name in ("a", "b", "c"):
        webhook.allowed(review(dra_pod("gpu.nvidia.com", name=name)))
        webhook.allowed(review(dra_pod("dra.cpu", name=name)))
    # The classes it has come from the watched list, not a GET per pod; a class it does not
    # have is asked for once per pod (it may have been created a moment ago).
    assert (single_gets(kube, "gpu.nvidia.com"), single_gets(kube, "dra.cpu")) == (0, 0)
    assert single_gets(kube, "gpu.example.com") == 1
    # Pods without DRA requests never wait for a lookup.
    before = len(kube.requests)
    webhook.allowed(review(pod("plain", containers=[container(limits={"nvidia.com/gpu": "1"})])))
    assert [r.path for r in kube.requests[before:]] == []


def test_every_request_of_the_lookup_is_granted_by_the_charts_webhook_role(
    start_webhook: StartWebhook, kube: FakeKubeServer
) -> None:
    webhook = start_webhook()
    kube.wait_for(lambda: watching(kube), 10)  # the DeviceClass watch (re-checked on each request)
    webhook.denial(review(dra_pod("gpu.example.com")))  # not cached: fetched by name

    used = {authorized_as(r) for r in kube.requests}
    role = granted(one(manifests(), "ClusterRole", "slurm-bridge-webhook"))
    assert used == {
        ("resource.k8s.io", "deviceclasses", "list"),
        ("resource.k8s.io", "deviceclasses", "watch"),
        ("resource.k8s.io", "deviceclasses", "get"),
    }
    assert used <= role


def test_a_class_created_after_the_start_is_admitted_and_a_deleted_one_refused(
    start_webhook: StartWebhook, kube: FakeKubeServer
) -> None:
    webhook = start_webhook()
    kube.wait_for(lambda: watching(kube), 10)  # the DeviceClass watch (re-checked on each request)
    assert "does not exist in the cluster" in webhook.denial(review(dra_pod("gpu.example.com")))

    kube.create_object(CLASSES, device_class("gpu.example.com"))
    # At once: a class not in the cache yet is asked for by name.
    webhook.allowed(review(dra_pod("gpu.example.com")))

    kube.delete_object(CLASSES, "gpu.nvidia.com")
    # As soon as the watch tells the webhook.
    wait_until(
        lambda: not webhook.validate(review(dra_pod("gpu.nvidia.com")))["allowed"],
        "the deletion seen by the webhook",
    )


def test_a_class_not_configured_is_refused_naming_the_setting_without_asking_the_cluster(
    start_webhook: StartWebhook, kube: FakeKubeServer
) -> None:
    kube.create_object(CLASSES, device_class("gpu.h100.example.com"))
    webhook = start_webhook(dra_device_classes="gpu.h100.example.com=gpu:h100,dra.cpu=cpu")

    message = webhook.denial(review(dra_pod("gpu.nvidia.com")))
    assert (
        'container "main" uses unsupported DRA device class "gpu.nvidia.com" (supported: dra.cpu, '
        "gpu.h100.example.com; the operator sets them in DRA_DEVICE_CLASSES)"
    ) in message
    assert "does not exist" not in message
    assert single_gets(kube, "gpu.nvidia.com") == 0
    # A configured class the cluster has: admitted (a Job's pod, so the bare-pod translation,
    # which the worker runs on its own defaults, is not asked here).
    owned = dra_pod("gpu.h100.example.com")
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "1", "controller": True}
    ]
    webhook.allowed(review(owned))


def test_a_bare_pod_of_a_configured_class_passes_the_workers_translation_under_the_same_setting(
    start_webhook: StartWebhook, kube: FakeKubeServer
) -> None:
    # A bare pod is translated as the worker would (webhook.checks.translation_problem): with the
    # setting's classes, so a class the setting adds is not refused there as unsupported.
    kube.create_object(CLASSES, device_class("gpu.h100.example.com"))
    webhook = start_webhook(dra_device_classes="gpu.h100.example.com=gpu:h100")
    webhook.allowed(review(dra_pod("gpu.h100.example.com")))


def test_a_cluster_that_does_not_serve_dra_refuses_dra_pods_with_that_reason(
    start_webhook: StartWebhook, kube: FakeKubeServer
) -> None:
    unserve_dra(kube)
    webhook = start_webhook()

    message = webhook.denial(review(dra_pod("gpu.nvidia.com")))
    assert (
        "deviceclass.resource.kubernetes.io/gpu.nvidia.com asks for DeviceClass gpu.nvidia.com, but this "
        "cluster does not serve resource.k8s.io/v1 (Kubernetes 1.34 or later, with DRA), so it has no "
        "DeviceClasses"
    ) in message
    webhook.allowed(review(pod("plain", containers=[container(limits={"nvidia.com/gpu": "1"})])))
    # "Not served" is known from the list: no watch, no GET of the class.
    assert not watching(kube)
    assert single_gets(kube, "gpu.nvidia.com") == 0


def test_a_lookup_that_fails_is_refused_as_one_to_try_again(
    start_webhook: StartWebhook, kube: FakeKubeServer
) -> None:
    webhook = start_webhook()
    kube.wait_for(lambda: watching(kube), 10)  # the DeviceClass watch (re-checked on each request)
    kube.fail_next("GET", f"^{CLASS_PATH}/gpu.example.com$", 403, message="deviceclasses is forbidden")

    message = webhook.denial(review(dra_pod("gpu.example.com")))
    assert "cannot tell whether DeviceClass gpu.example.com exists (" in message
    assert "403" in message
    assert message.endswith("; try again")
    assert "does not exist" not in message


def test_an_update_of_a_pod_whose_class_is_gone_is_not_refused(
    start_webhook: StartWebhook, kube: FakeKubeServer
) -> None:
    webhook = start_webhook()
    old = dra_pod("gpu.example.com")
    new = dra_pod("gpu.example.com")
    new["metadata"]["labels"] = {"team": "a"}
    webhook.allowed(review(new, operation="UPDATE", old=old))
    assert single_gets(kube, "gpu.example.com") == 0


def test_a_workload_whose_pods_ask_for_a_missing_class_is_refused(
    start_webhook: StartWebhook, kube: FakeKubeServer
) -> None:
    webhook = start_webhook()
    template = dra_pod("gpu.example.com")
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": MANAGED_NS},
        "spec": {"template": {"metadata": {}, "spec": template["spec"]}},
    }
    message = webhook.denial(review(job, gvkr=JOB))
    assert (
        "in spec.template: deviceclass.resource.kubernetes.io/gpu.example.com asks for DeviceClass" in message
    )


def test_with_no_class_configured_every_dra_request_is_refused_and_the_cluster_is_not_asked(
    start_webhook: StartWebhook, kube: FakeKubeServer
) -> None:
    webhook = start_webhook(dra_device_classes="", kubeconfig="/nonexistent/kubeconfig")
    assert "(supported: none; the operator sets them in DRA_DEVICE_CLASSES)" in webhook.denial(
        review(dra_pod("gpu.nvidia.com"))
    )
    assert kube.requests == []


async def test_without_a_kubernetes_configuration_the_webhook_stops_at_start(cert_files: CertFiles) -> None:
    settings = load_settings(
        tls_cert_file=cert_files.cert, tls_key_file=cert_files.key, kubeconfig="/nonexistent/kubeconfig"
    )
    with pytest.raises(ConfigurationError) as caught:
        await build_server(settings)
    message = str(caught.value)
    assert message.startswith(
        "invalid setting KUBECONFIG (--kubeconfig): cannot load a Kubernetes configuration"
    )
    assert "DRA_DEVICE_CLASSES" in message
    assert "\n" not in message


# -- the cache itself -------------------------------------------------------------------------------


async def test_a_cluster_that_starts_serving_dra_is_noticed_without_a_restart(kube: FakeKubeServer) -> None:
    served = [rt for rt in DEFAULT_RESOURCES if rt.group == RESOURCE_GROUP]
    unserve_dra(kube)
    cache = DeviceClassCache(KubeClient(kube.aio_configuration()), unserved_recheck=0.05, max_backoff=0.05)
    # Asked before its first list: it lists for itself, and tells "not served" from "no such class".
    assert await cache.lookup(["gpu.nvidia.com"]) == ClusterDeviceClasses(
        unserved=True, missing=frozenset({"gpu.nvidia.com"})
    )
    await cache.start()
    try:
        for rt in served:  # the cluster is upgraded: its DeviceClasses (the fixture's) are served
            kube.register_resource(rt)
        seen = cache.wait_until(lambda: bool(cache.served) and "gpu.nvidia.com" in cache.names)
        await asyncio.wait_for(seen, 10)
        assert await cache.lookup(["gpu.nvidia.com"]) == ClusterDeviceClasses()
        assert single_gets(kube, "gpu.nvidia.com") == 0
    finally:
        await cache.stop()
