"""The Kubernetes side of the benchmark: the API server, the driver and the kubelet.

The API server is the fake (`python -m testbed.kube_fake`, `KubeProcess`) or the
real kube-apiserver v1.28 + etcd of testbed/kube_real (`RealKube`); either runs in
processes of its own, so its work neither competes with the bridge for the GIL nor
counts in the bridge's CPU and memory. The benchmark talks to it over HTTP(S) like
any client:

* `KubeDriver` creates nodes and pods and writes pod phases (the kubelet's part);
* `PodObserver` watches the run's pods on a thread of its own and stamps each
  change as it arrives (`time.time()`, the clock every other timestamp uses);
* `CountingKube` is the bridge's own `KubeClient`, counting its requests by
  operation (watches are marked as such).

Its size (about 480 lines) is the two servers, the driver, the observer and their one HTTP
connection, written with http.client on purpose (their CPU is counted on the bridge's GIL).
"""

import contextlib
import http.client
import json
import os
import queue
import select
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from bench.probes import kube_operation
from bridge import keys
from bridge.tolerations import managed_node_toleration
from clients.kube_client import KubeClient
from testbed.kube_real.apiserver import ApiServer

REPO = Path(__file__).resolve().parent.parent

Json = dict[str, Any]


class HttpError(RuntimeError):
    """The API server answered an error, or the connection failed."""


@dataclass(frozen=True)
class Endpoint:
    """Where the API server is, and how the benchmark's own requests get in (the real one: TLS
    and the admin's bearer token)."""

    url: str
    token: str | None = None
    ca_file: Path | None = None


class _Connection:
    """One keep-alive HTTP/1.1 connection to the API server, from the standard library.

    The driver and the observer run on threads of the bridge's process and hold its GIL while
    they work; `http.client` costs a fraction of an httpx client's CPU per request (fewer
    transport layers), so the simulated kubelet takes less from the bridge.
    """

    def __init__(self, endpoint: Endpoint, timeout: float) -> None:
        parsed = urlsplit(endpoint.url)
        self._tls = parsed.scheme == "https"
        self._host = parsed.hostname or "127.0.0.1"
        self._port = parsed.port or (443 if self._tls else 80)
        self._timeout = timeout
        self._headers = {"Authorization": f"Bearer {endpoint.token}"} if endpoint.token else {}
        self._context = (
            ssl.create_default_context(cafile=str(endpoint.ca_file) if endpoint.ca_file else None)
            if self._tls
            else None
        )
        self._conn: http.client.HTTPConnection | None = None

    def _open(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._context is not None:
                self._conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=self._timeout, context=self._context
                )
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        return self._conn

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def request(
        self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json"
    ) -> http.client.HTTPResponse:
        """Send a request; the response must be read (or closed) before the next one."""
        headers = {**self._headers, **({"Content-Type": content_type} if body is not None else {})}
        # A kept-alive connection the server closed while it lay idle (kube-apiserver does, after
        # a while) fails at once: asked again on a new one. A new connection's failure is told.
        for fresh in (self._conn is None, True):
            try:
                conn = self._open()
                conn.request(method, path, body=body, headers=headers)
                return conn.getresponse()
            except (OSError, http.client.HTTPException) as error:
                self.close()
                if fresh:
                    raise HttpError(f"{method} {path}: {type(error).__name__}: {error}") from error
        raise AssertionError("unreachable: the second try is on a new connection")

    def call(
        self, method: str, path: str, body: Json | None = None, content_type: str = "application/json"
    ) -> Json:
        """A request answered with JSON; an error status raises HttpError."""
        response = self.request(
            method, path, None if body is None else json.dumps(body).encode(), content_type
        )
        try:
            data = response.read()
        except (OSError, http.client.HTTPException) as error:
            self.close()
            raise HttpError(f"{method} {path}: {type(error).__name__}: {error}") from error
        if response.status >= 300:
            raise HttpError(f"{method} {path}: HTTP {response.status} {data[:300].decode(errors='replace')}")
        result: Json = json.loads(data)
        return result


class KubeProcessError(RuntimeError):
    """The fake API process did not start."""


class KubeProcess:
    """`python -m testbed.kube_fake` as a child process; stopped by its pid."""

    def __init__(self, kubeconfig: Path, log_file: Path, history_size: int = 50_000) -> None:
        self.kubeconfig = kubeconfig
        self.log_file = log_file
        self.history_size = history_size
        self.url = ""
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def pids(self) -> list[int]:
        return [self.pid] if self.pid is not None else []

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.url)

    def start(self, timeout: float = 30.0) -> "KubeProcess":
        command = [
            sys.executable,
            "-m",
            "testbed.kube_fake",
            "--port",
            "0",
            "--kubeconfig",
            str(self.kubeconfig),
            "--history-size",
            str(self.history_size),
        ]
        with self.log_file.open("wb") as log:
            self._process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=log)
        assert self._process.stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        while time.monotonic() < deadline and not line.endswith(b"\n"):
            ready, _, _ = select.select([self._process.stdout], [], [], 0.2)
            if ready:
                chunk = os.read(self._process.stdout.fileno(), 4096)
                if not chunk:
                    break
                line += chunk
        text = line.decode(errors="replace").strip()
        if not text.startswith("kube_fake serving at "):
            self.stop()
            raise KubeProcessError(f"the fake Kubernetes API did not start: {text!r}; see {self.log_file}")
        self.url = text.removeprefix("kube_fake serving at ").strip()
        return self

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


class RealKube:
    """The real kube-apiserver v1.28 + etcd (testbed/kube_real), an instance of the run's own.

    The benchmark's driver and the bridge both come in as the cluster's admin. No controller
    runs: the driver lifts the not-ready taint of a node it creates (the node lifecycle
    controller's part) and creates a namespace's default ServiceAccount (the controller
    manager's).
    """

    def __init__(self) -> None:
        self.server: ApiServer | None = None

    def start(self) -> "RealKube":
        self.server = ApiServer.start()
        return self

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop()

    @property
    def kubeconfig(self) -> Path:
        assert self.server is not None
        return self.server.admin_kubeconfig

    @property
    def endpoint(self) -> Endpoint:
        assert self.server is not None
        return Endpoint(self.server.url, self.server.admin_token, self.server.ca_file)

    @property
    def pids(self) -> list[int]:
        """kube-apiserver's and etcd's, as recorded by hack/kube-apiserver.sh."""
        if self.server is None:
            return []
        found = []
        for name in ("kube-apiserver", "etcd"):
            with contextlib.suppress(OSError, ValueError):
                found.append(int((self.server.directory / f"{name}.pid").read_text().strip()))
        return found


def node_manifest(name: str, cpu: int, memory_mb: int) -> Json:
    resources = {"cpu": str(cpu), "memory": f"{memory_mb}Mi", "pods": "110", "ephemeral-storage": "100Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            # As node sync registers an external node: the bridge's nodes are found by this label.
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                keys.LABEL_EXTERNAL_NODE: "true",
            },
        },
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        },
    }


def pod_manifest(
    namespace: str,
    name: str,
    cpu: str = "1",
    memory: str = "256Mi",
    annotations: dict[str, str] | None = None,
) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": namespace,
            "name": name,
            # Shared nodes: several 1-CPU pods per node.
            "annotations": {keys.SLURMJOB_PREFIX + "exclusive": "false", **(annotations or {})},
        },
        "spec": {
            "schedulerName": keys.DEFAULT_SCHEDULER_NAME,
            # As the mutating webhook leaves a pod of a managed namespace.
            "tolerations": [managed_node_toleration(keys.DEFAULT_SCHEDULER_NAME)],
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"requests": {"cpu": cpu, "memory": memory}},
                }
            ],
        },
    }


class KubeDriver:
    """Plain HTTP(S) calls to the API server, from any thread (one connection per thread)."""

    def __init__(self, endpoint: Endpoint | str) -> None:
        self.endpoint = endpoint if isinstance(endpoint, Endpoint) else Endpoint(endpoint)
        self._local = threading.local()

    @property
    def url(self) -> str:
        return self.endpoint.url

    def connection(self, timeout: float) -> _Connection:
        """A connection of the caller's own (the observer's watch)."""
        return _Connection(self.endpoint, timeout)

    def _call(
        self, method: str, path: str, body: Json | None, content_type: str = "application/json"
    ) -> Json:
        connection: _Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._local.connection = _Connection(self.endpoint, timeout=30)
        return connection.call(method, path, body, content_type)

    def create_node(self, name: str, cpu: int, memory_mb: int) -> None:
        manifest = node_manifest(name, cpu, memory_mb)
        created = self._call("POST", "/api/v1/nodes", manifest)
        # A real API server keeps no status from a create and gives every new node the
        # not-ready taint (TaintNodesByCondition): the kubelet and the node lifecycle
        # controller would set the one and lift the other.
        if not (created.get("status") or {}).get("conditions"):
            self._call(
                "PATCH",
                f"/api/v1/nodes/{name}/status",
                {"status": manifest["status"]},
                "application/merge-patch+json",
            )
        if (created.get("spec") or {}).get("taints"):
            self._call(
                "PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": None}}, "application/merge-patch+json"
            )

    def create_namespace(self, name: str) -> None:
        """The namespace and its default ServiceAccount (a real API server's controller manager
        would make that one); either already there is fine."""
        for path, body in (
            ("/api/v1/namespaces", {"metadata": {"name": name}}),
            (f"/api/v1/namespaces/{name}/serviceaccounts", {"metadata": {"name": "default"}}),
        ):
            try:
                self._call("POST", path, body)
            except HttpError as error:
                if "HTTP 409" not in str(error):
                    raise

    def create_pod(self, manifest: Json) -> Json:
        namespace = manifest["metadata"]["namespace"]
        return self._call("POST", f"/api/v1/namespaces/{namespace}/pods", manifest)

    def set_phase(self, namespace: str, name: str, phase: str) -> None:
        self._call(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}/status",
            {"status": {"phase": phase}},
            "application/merge-patch+json",
        )


@dataclass
class PodTimes:
    """One pod's story, every moment on this process's clock (time.time())."""

    name: str
    uid: str = ""
    created: float | None = None
    claimed: float | None = None  # finalizer added
    labelled: float | None = None  # job id label: the job was submitted
    bound: float | None = None
    succeeded: float | None = None
    released: float | None = None  # finalizer removed: the placement's last side effect
    job_id: int | None = None
    node: str | None = None
    failure: str | None = None


@dataclass
class PodObserver:
    """Watches the run's namespace on its own thread; plays the kubelet for bound pods.

    A bound pod is turned Running by a second thread (the kubelet), so a slow
    write never delays the stamping of the next change. `notify(name, what)`
    is called when a pod is "labelled" (its job was submitted) and "bound"
    (on the observer's thread), and "running" (on the kubelet's).
    """

    driver: KubeDriver
    namespace: str
    pods: dict[str, PodTimes]
    notify: Callable[[str, str], None]
    lost: int = 0  # watches that expired (410): changes in between may be stamped late
    errors: Counter[str] = field(default_factory=Counter)
    _stop: threading.Event = field(default_factory=threading.Event)
    _kubelet: "queue.Queue[str | None]" = field(default_factory=queue.Queue)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for target, name in ((self._watch, "bench-pod-observer"), (self._run_kubelet, "bench-kubelet")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self._kubelet.put(None)
        for thread in self._threads:
            thread.join(timeout=10)

    def _watch(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        connection = self.driver.connection(timeout=30)
        version = ""
        try:
            while not self._stop.is_set():
                try:
                    if not version:
                        listed = connection.call("GET", path)
                        now = time.time()
                        for pod in listed.get("items") or []:
                            self._see(pod, now)
                        version = str((listed.get("metadata") or {}).get("resourceVersion", ""))
                    version = self._follow(connection, path, version)
                except (HttpError, ValueError) as error:
                    if self._stop.is_set():
                        return
                    self.errors[type(error).__name__] += 1
                    time.sleep(0.2)
        finally:
            connection.close()

    def _follow(self, connection: _Connection, path: str, version: str) -> str:
        """One watch from `version`, for a few seconds (so that stop() is noticed); the newest version."""
        params = {
            "watch": "true",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "5",
        }
        response = connection.request("GET", f"{path}?{urlencode(params)}")
        try:
            if response.status != 200:
                response.read()  # the Status object: the connection stays usable
                if response.status != 410:
                    raise HttpError(f"watch {path}: HTTP {response.status}")
                self.lost += 1
                return ""
            while line := response.readline():
                if not line.strip():
                    continue
                now = time.time()
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    self.lost += 1
                    return ""
                version = str((obj.get("metadata") or {}).get("resourceVersion", version))
                if event.get("type") in ("ADDED", "MODIFIED"):
                    self._see(obj, now)
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            raise HttpError(f"watch {path}: {type(error).__name__}: {error}") from error
        finally:
            if not response.isclosed():
                # Left mid-stream (an ERROR event): the rest of it would be read as the next
                # answer on this connection, so the connection goes with it.
                connection.close()
        return version

    def _see(self, pod: Json, now: float) -> None:
        meta = pod.get("metadata") or {}
        times = self.pods.get(meta.get("name", ""))
        if times is None or (times.uid and meta.get("uid") != times.uid):
            return
        finalizers = meta.get("finalizers") or []
        if keys.FINALIZER in finalizers:
            times.claimed = times.claimed or now
        elif times.claimed and not times.released:
            times.released = now
        label = (meta.get("labels") or {}).get(keys.LABEL_SLURM_JOB_ID)
        if label and times.labelled is None:
            times.labelled = now
            times.job_id = int(label)
            self.notify(times.name, "labelled")
        node = (pod.get("spec") or {}).get("nodeName")
        if node and times.bound is None:
            times.bound = now
            times.node = node
            self._kubelet.put(times.name)
            self.notify(times.name, "bound")

    def _run_kubelet(self) -> None:
        while (name := self._kubelet.get()) is not None:
            with contextlib.suppress(HttpError):
                self.driver.set_phase(self.namespace, name, "Running")
            # Only now may the pod finish: a late "Running" would undo "Succeeded".
            self.notify(name, "running")


class CountingKube(KubeClient):
    """The bridge's Kubernetes client, counting its requests by operation (watches included, marked)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests: Counter[str] = Counter()
        self.seconds: defaultdict[str, float] = defaultdict(float)  # by operation: sent -> answer read

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Any,
        body: Any,
        content_type: str,
        timeout: float | None,
    ) -> Any:
        operation = kube_operation(method, path, dict(query or {}))
        self.requests[operation] += 1
        started = time.monotonic()
        try:
            return await super()._send(
                method, path, query=query, body=body, content_type=content_type, timeout=timeout
            )
        finally:
            self.seconds[operation] += time.monotonic() - started
