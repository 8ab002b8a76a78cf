"""The benchmark's Kubernetes driver and pod observer over HTTP, against the in-repo fake API.

The benchmark's figures are only as good as these stamps: a pod the observer misses, or a
kubelet write that never lands, would show as a slow bridge.
"""

import http.server
import queue
import threading
from collections.abc import Iterator

import pytest

from bench.kube import Endpoint, HttpError, KubeDriver, PodObserver, PodTimes, _Connection, pod_manifest
from bridge import keys
from testbed.kube_fake import FakeKubeServer

NAMESPACE = "bench"


@pytest.fixture
def fake() -> Iterator[FakeKubeServer]:
    with FakeKubeServer() as server:
        yield server


def test_the_driver_creates_pods_and_writes_their_phase(fake: FakeKubeServer) -> None:
    driver = KubeDriver(fake.url)
    created = driver.create_pod(pod_manifest(NAMESPACE, "p-1"))
    assert created["metadata"]["uid"]
    driver.set_phase(NAMESPACE, "p-1", "Succeeded")
    pod = fake.get_object("pods", "p-1", NAMESPACE)
    assert pod is not None
    assert pod["status"]["phase"] == "Succeeded"
    with pytest.raises(HttpError, match="HTTP 404"):
        driver.set_phase(NAMESPACE, "missing", "Running")
    driver.set_phase(NAMESPACE, "p-1", "Succeeded")  # the connection survives the error


def test_the_observer_stamps_each_step_and_plays_the_kubelet_across_a_broken_watch(
    fake: FakeKubeServer,
) -> None:
    driver = KubeDriver(fake.url)
    uid = driver.create_pod(pod_manifest(NAMESPACE, "p-1"))["metadata"]["uid"]
    pods = {"p-1": PodTimes("p-1", uid=uid)}
    told: queue.Queue[tuple[str, str]] = queue.Queue()
    observer = PodObserver(driver, NAMESPACE, pods, lambda name, what: told.put((name, what)))
    observer.start()
    try:

        def edit(change: dict[str, object]) -> None:
            def apply(pod: dict[str, object]) -> None:
                meta = pod["metadata"]
                assert isinstance(meta, dict)
                meta.update(change.get("metadata", {}))  # type: ignore[call-overload]
                if "spec" in change:
                    pod["spec"] = {**pod["spec"], **change["spec"]}  # type: ignore[dict-item]

            fake.update_object("pods", "p-1", apply, NAMESPACE)

        edit({"metadata": {"finalizers": [keys.FINALIZER], "labels": {keys.LABEL_SLURM_JOB_ID: "42"}}})
        assert told.get(timeout=10) == ("p-1", "labelled")
        fake.drop_watches()  # an apiserver restart: the observer watches again from its version
        edit({"spec": {"nodeName": "node-1"}})
        assert told.get(timeout=10) == ("p-1", "bound")
        assert told.get(timeout=10) == ("p-1", "running")
        fake.wait_for(
            lambda: (fake.get_object("pods", "p-1", NAMESPACE) or {})["status"]["phase"] == "Running"
        )
        times = pods["p-1"]
        assert times.claimed is not None
        assert times.labelled is not None
        assert times.bound is not None
        assert (times.job_id, times.node) == (42, "node-1")
    finally:
        observer.stop()
    assert not [t for t in threading.enumerate() if t.name.startswith("bench-")]


def test_a_watch_from_an_expired_version_is_counted_lost_and_the_next_request_answered(
    fake: FakeKubeServer,
) -> None:
    driver = KubeDriver(fake.url)
    driver.create_pod(pod_manifest(NAMESPACE, "p-1"))
    driver.set_phase(NAMESPACE, "p-1", "Running")
    fake.compact_history()
    observer = PodObserver(driver, NAMESPACE, {}, lambda name, what: None)
    connection = _Connection(Endpoint(fake.url), timeout=10)
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    assert observer._follow(connection, path, "1") == ""  # 410 Gone: list again
    assert observer.lost == 1
    assert connection.call("GET", path)["items"]  # not read as the rest of the stream
    connection.close()


def test_a_connection_the_server_closed_while_idle_is_opened_again() -> None:
    """kube-apiserver closes a kept-alive connection that lay idle: the site run of 2026-11-27
    on the real API server died on the first pod created after a long fill (SSLEOFError)."""
    served: list[str] = []

    class ClosingAfterEach(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            served.append(self.path)
            body = b"{}"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True  # and says nothing: as an idle timeout would

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ClosingAfterEach)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        connection = _Connection(Endpoint(f"http://127.0.0.1:{server.server_address[1]}"), timeout=10)
        assert connection.call("GET", "/first") == {}
        assert connection.call("GET", "/second") == {}
        connection.close()
    finally:
        server.shutdown()
    assert served == ["/first", "/second"]
