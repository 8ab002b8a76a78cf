"""Behaviour 10: fault injection, request log, direct store access, waits, kubeconfig, transport.

Fake only: these are the fake's own test helpers, which a real server does not have.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from testbed.kube_fake import FakeKubeServer
from testbed.kube_fake.builders import Client, error_body, header, kube_config, pod_body, watch


def test_clear_faults_ends_an_outage(kube_fake: FakeKubeServer, core: Client) -> None:
    kube_fake.fail_next("*", r"/nodes", 500, count=1_000_000)
    with pytest.raises(ApiException) as exc:
        core.list_node()
    assert exc.value.status == 500
    kube_fake.clear_faults()
    assert core.list_node().items == []


def test_fail_next_answers_status_for_matching_requests(kube_fake: FakeKubeServer, core: Client) -> None:
    kube_fake.fail_next("POST", r"/pods$", 500, count=2)
    kube_fake.fail_next("GET", r"/pods/p$", 429, count=4, retry_after=0)
    kube_fake.fail_next("*", r"/nodes", 503, message="etcd is sad")
    for _ in range(2):
        with pytest.raises(ApiException) as exc:
            core.create_namespaced_pod("default", pod_body("p"))
        assert exc.value.status == 500
        assert error_body(exc.value)["reason"] == "InternalError"
    core.create_namespaced_pod("default", pod_body("p"))  # rule used up
    core.list_namespaced_pod("default")  # GET on the collection does not match /pods/p$
    kube_fake.clear_requests()
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod("p", "default")
    assert (exc.value.status, header(exc.value, "Retry-After")) == (429, "0")
    assert error_body(exc.value)["details"]["retryAfterSeconds"] == 0
    # urllib3 honours Retry-After on 429/503: the sync client tried 1 + 3 times.
    assert len(kube_fake.requests) == 4
    with pytest.raises(ApiException) as exc:
        core.list_node()
    body = error_body(exc.value)
    assert (exc.value.status, body["reason"], body["message"]) == (503, "ServiceUnavailable", "etcd is sad")
    assert core.read_namespaced_pod("p", "default").metadata.name == "p"
    kube_fake.fail_next("PUT", "/pods/p", 409, reason="Conflict")
    pod = core.read_namespaced_pod("p", "default")
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_pod("p", "default", pod)
    assert error_body(exc.value)["reason"] == "Conflict"


def _raw(kube: FakeKubeServer, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    """One request over plain http.client: no client-side retries hide an answer."""
    conn = http.client.HTTPConnection(kube.host, kube.port)
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    answer = (resp.status, json.loads(resp.read() or b"{}"))
    conn.close()
    return answer


def test_fail_randomly_fails_a_fraction_with_the_given_statuses(kube_fake: FakeKubeServer) -> None:
    kube_fake.fail_randomly("*", r"/pods", (500, 429, 409), 0.25, seed=7)
    statuses = [_raw(kube_fake, "GET", "/api/v1/namespaces/default/pods")[0] for _ in range(400)]
    failed = [s for s in statuses if s != 200]
    assert 60 <= len(failed) <= 140  # about a quarter of 400
    assert set(failed) == {500, 429, 409}  # each status is drawn
    assert kube_fake.injected_failures == {s: failed.count(s) for s in (500, 429, 409)}
    # Other paths are not matched; a failed write is not applied.
    assert _raw(kube_fake, "GET", "/api/v1/nodes")[0] == 200
    created = 0
    for i in range(40):
        status, _ = _raw(kube_fake, "POST", "/api/v1/namespaces/default/pods", pod_body(f"p{i}"))
        created += status == 201
    assert len(kube_fake.objects("pods", "default")) == created < 40
    status, body = _raw(kube_fake, "GET", "/api/v1/namespaces/default/pods")
    while status == 200:  # the next failure carries a Status body like a real server's
        status, body = _raw(kube_fake, "GET", "/api/v1/namespaces/default/pods")
    assert (body["kind"], body["code"]) == ("Status", status)
    totals = kube_fake.stop_random_failures()
    assert sum(totals.values()) >= len(failed) + 40 - created + 1
    assert all(_raw(kube_fake, "GET", "/api/v1/namespaces/default/pods")[0] == 200 for _ in range(50))


def test_fail_randomly_can_spare_watches(kube_fake: FakeKubeServer, core: Client) -> None:
    kube_fake.fail_randomly("GET", r"/pods$", (500,), 1.0, watches=False)
    with pytest.raises(ApiException):
        core.list_namespaced_pod("default")
    w: Client = watch.Watch()
    for event in w.stream(core.list_namespaced_pod, "default", resource_version="1", timeout_seconds=1):
        raise AssertionError(f"no event expected, got {event}")  # the watch itself was answered
    kube_fake.stop_random_failures()
    kube_fake.fail_randomly("GET", r"/pods$", (500,), 1.0)  # watches included
    with pytest.raises(ApiException) as exc:
        for _ in w.stream(core.list_namespaced_pod, "default", resource_version="1", timeout_seconds=1):
            pass
    assert exc.value.status == 500


def test_delay_next(kube_fake: FakeKubeServer, core: Client) -> None:
    kube_fake.delay_next("GET", "/api/v1/nodes", 0.3)
    started = time.monotonic()
    core.list_node()
    assert time.monotonic() - started >= 0.3
    started = time.monotonic()
    core.list_node()
    assert time.monotonic() - started < 0.3


def test_request_log(kube_fake: FakeKubeServer, core: Client) -> None:
    kube_fake.clear_requests()
    core.create_namespaced_pod("default", pod_body("p"))
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "b"}}})
    core.list_namespaced_pod("default", label_selector="a=b")
    create, patch, listing = kube_fake.requests
    assert (create.method, create.path, create.body["metadata"]["name"]) == (
        "POST",
        "/api/v1/namespaces/default/pods",
        "p",
    )
    assert (patch.method, patch.content_type) == ("PATCH", "application/strategic-merge-patch+json")
    assert patch.body == {"metadata": {"labels": {"a": "b"}}}
    assert (listing.method, listing.query, listing.body) == ("GET", {"labelSelector": "a=b"}, None)


def test_direct_store_access_and_pod_phase(kube_fake: FakeKubeServer, core: Client) -> None:
    created = kube_fake.create_object("pods", pod_body("p"), namespace="default")
    assert core.read_namespaced_pod("p", "default").metadata.uid == created["metadata"]["uid"]
    kube_fake.create_object("jobsets.jobset.x-k8s.io", {"metadata": {"name": "js", "namespace": "default"}})
    assert [o["metadata"]["name"] for o in kube_fake.objects("jobsets.jobset.x-k8s.io")] == ["js"]
    assert kube_fake.objects("pods", namespace="kube-system") == []
    rv = created["metadata"]["resourceVersion"]
    pod = kube_fake.set_pod_phase("default", "p", "Failed", reason="Evicted", message="node pressure")
    assert int(pod["metadata"]["resourceVersion"]) > int(rv)
    kube_fake.update_object("pods", "p", lambda o: o["metadata"].update(labels={"x": "y"}), "default")
    read = core.read_namespaced_pod("p", "default")
    assert (read.status.phase, read.status.reason, read.status.message) == (
        "Failed",
        "Evicted",
        "node pressure",
    )
    w: Client = watch.Watch()
    seen = []
    for event in w.stream(core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=5):
        obj = event["object"]
        seen.append((event["type"], obj.status.phase, obj.status.reason, obj.metadata.labels))
        if len(seen) == 2:
            w.stop()
    assert seen == [("MODIFIED", "Failed", "Evicted", {}), ("MODIFIED", "Failed", "Evicted", {"x": "y"})]
    kube_fake.delete_object("pods", "p", "default")
    assert kube_fake.get_object("pods", "p", "default") is None


def test_wait_for_is_event_driven(kube_fake: FakeKubeServer, core: Client) -> None:
    core.create_namespaced_pod("default", pod_body("p"))
    writer = threading.Thread(target=kube_fake.set_pod_phase, args=("default", "p", "Running"))
    writer.start()

    def running() -> dict[str, Any] | None:
        pod = kube_fake.get_object("pods", "p", "default")
        return pod if pod is not None and pod["status"]["phase"] == "Running" else None

    pod = kube_fake.wait_for(running)
    writer.join()
    assert pod is not None
    assert pod["status"]["phase"] == "Running"
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        kube_fake.wait_for(lambda: kube_fake.get_object("pods", "nope", "default"), timeout=0.1)
    assert time.monotonic() - started < 1


def test_kubeconfig_and_token(tmp_path: Path) -> None:
    with FakeKubeServer(token="s3cret") as server:
        path = server.kubeconfig(tmp_path / "kubeconfig")
        cfg: Client = kubernetes.client.Configuration()
        kube_config.load_kube_config(config_file=str(path), client_configuration=cfg)
        assert cfg.host == server.url
        with kubernetes.client.ApiClient(cfg) as client:
            core: Client = kubernetes.client.CoreV1Api(client)
            assert core.read_namespace("default").metadata.name == "default"
        anonymous: Client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=server.url))
        with pytest.raises(ApiException) as exc:
            kubernetes.client.CoreV1Api(anonymous).list_node()
        assert exc.value.status == 401
        anonymous.close()


def test_keep_alive_and_json_content_type(kube_fake: FakeKubeServer) -> None:
    conn = http.client.HTTPConnection(kube_fake.host, kube_fake.port)
    for _ in range(3):  # three requests over one TCP connection
        conn.request("GET", "/api/v1/namespaces/default")
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.getheader("Content-Type") == "application/json"
        assert json.loads(resp.read())["metadata"]["name"] == "default"
    assert resp.version == 11
    conn.close()
