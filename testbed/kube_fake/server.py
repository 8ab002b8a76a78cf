"""``FakeKubeServer``: lifecycle, client wiring and test helpers.

The HTTP side lives in ``handler``; state in ``store``.  All helpers are
thread-safe and may be called from tests while clients talk to the server.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import kubernetes.aio.client
import kubernetes.client

from .builders import node_body
from .clock import Clock, FakeClock, RealClock
from .controllers import ControllerManager
from .disruption import DisruptionController
from .faults import Faults, Hold, RecordedRequest
from .handler import KubeHTTPServer
from .kubelet import FakeKubelet
from .resources import DEFAULT_RESOURCES, SCHEDULING_PLURALS, Registry, ResourceType, scheduling_resources
from .store import Store
from .subresources import EvictionGate
from .taint_eviction import TaintEvictionController
from .util import JSON, now_rfc3339

T = TypeVar("T")


class FakeKubeServer:
    """A fake kube-apiserver on ``http://host:port`` (port 0 = ephemeral).

    ``history_size`` bounds the watch event log; ``kubelet`` turns on the
    simulated kubelet; ``token`` makes every API call require
    ``Authorization: Bearer <token>``; ``require_namespaces`` makes creates in
    a missing namespace fail with 404 like a real server (off by default:
    only default/kube-system/kube-public/kube-node-lease exist).

    Like a real cluster, the taint-eviction and disruption controllers run by
    default; ``taint_manager=False`` / ``disruption_controller=False`` leave
    them out (with the latter, evictions read PDB status as stored, so a test
    writes it).  ``clock`` times controller delays (tolerationSeconds): pass a
    ``FakeClock`` and call ``advance_clock`` to cross them without waiting.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        history_size: int = 1000,
        kubelet: bool = False,
        token: str | None = None,
        require_namespaces: bool = False,
        extra_resources: Iterable[ResourceType] = (),
        taint_manager: bool = True,
        disruption_controller: bool = True,
        clock: Clock | None = None,
    ) -> None:
        self.registry = Registry((*DEFAULT_RESOURCES, *extra_resources))
        self.store = Store(self.registry, history_size, require_namespaces)
        self.faults = Faults(self.store.cond)
        self.evictions = EvictionGate()
        self.token = token
        self.kubelet = FakeKubelet(self.store, self.registry) if kubelet else None
        self.clock: Clock = clock or RealClock()
        self.taint_manager = (
            TaintEvictionController(self.store, self.registry, self.clock) if taint_manager else None
        )
        self.disruption_controller = (
            DisruptionController(self.store, self.registry) if disruption_controller else None
        )
        running = [c for c in (self.taint_manager, self.disruption_controller) if c is not None]
        self.controllers = ControllerManager(self.store, self.clock, running) if running else None
        self._bind = (host, port)
        self._httpd: KubeHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> FakeKubeServer:
        self._httpd = KubeHTTPServer(self._bind, self)
        # A short poll interval keeps stop() (which waits for the serve loop) fast.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.02,), name="kube-fake-http", daemon=True
        )
        self._thread.start()
        if self.kubelet is not None:
            self.kubelet.start()
        if self.controllers is not None:
            self.controllers.start()
        return self

    def stop(self) -> None:
        """Close watches and connections promptly, then the listening socket."""
        self.store.close()
        self.faults.cancel()
        if self.kubelet is not None:
            self.kubelet.stop()
        if self.controllers is not None:
            self.controllers.stop()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.drop_connections()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeKubeServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def host(self) -> str:
        return self._bind[0]

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("kube_fake: server not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def register_resource(self, rt: ResourceType) -> None:
        self.registry.register(rt)

    def serve_scheduling_versions(self, *versions: str) -> None:
        """Serve scheduling.k8s.io's Workload and PodGroup at ``versions`` instead (one
        release's: ``"v1alpha2"`` of 1.36 by default, or any of 1.37's ``"v1beta1"``,
        ``"v1alpha3"``; the first is the storage version). Only before any such object
        exists: the fake does not convert between the releases' schemas."""
        resources = scheduling_resources(versions)
        with self.store.cond:
            for plural in SCHEDULING_PLURALS:
                if self.store.snapshot(self.registry.resolve(f"{plural}.scheduling.k8s.io"), None):
                    raise RuntimeError(f"kube_fake: {plural}.scheduling.k8s.io exist; switch versions first")
            for plural in SCHEDULING_PLURALS:
                self.registry.unregister("scheduling.k8s.io", plural)
            for rt in resources:
                self.registry.register(rt)

    # -------------------------------------------------------------- clients
    def kubeconfig(self, path: str | Path, *, token: str | None = None, namespace: str = "default") -> Path:
        """Write a kubeconfig (JSON, which is valid YAML) for ``load_kube_config``."""
        user: JSON = {}
        if token or self.token:
            user["token"] = token or self.token
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kube-fake", "cluster": {"server": self.url}}],
            "users": [{"name": "kube-fake", "user": user}],
            "contexts": [
                {
                    "name": "kube-fake",
                    "context": {"cluster": "kube-fake", "user": "kube-fake", "namespace": namespace},
                }
            ],
            "current-context": "kube-fake",
        }
        out = Path(path)
        out.write_text(json.dumps(doc, indent=2))
        return out

    def configuration(self) -> kubernetes.client.Configuration:
        cfg = kubernetes.client.Configuration(host=self.url)
        if self.token:
            cfg.api_key = {"authorization": f"Bearer {self.token}"}
        return cfg

    def api_client(self) -> kubernetes.client.ApiClient:
        """A sync client; close it (``with`` or ``.close()``) when done."""
        return kubernetes.client.ApiClient(self.configuration())

    def aio_configuration(self) -> kubernetes.aio.client.Configuration:
        cfg = kubernetes.aio.client.Configuration(host=self.url)
        if self.token:
            cfg.api_key = {"authorization": f"Bearer {self.token}"}
        return cfg

    def aio_api_client(self) -> kubernetes.aio.client.ApiClient:
        """A ``kubernetes.aio`` client; ``await client.close()`` (or ``async with``) when done."""
        return kubernetes.aio.client.ApiClient(self.aio_configuration())

    # --------------------------------------------------------- requests/faults
    @property
    def requests(self) -> list[RecordedRequest]:
        return self.faults.requests

    def clear_requests(self) -> None:
        self.faults.clear()

    def fail_next(
        self,
        method: str,
        path_regex: str,
        status: int,
        count: int = 1,
        reason: str | None = None,
        message: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        """Answer the next ``count`` requests matching method ("*" = any) and
        ``re.search(path_regex, path)`` with a Failure Status of ``status``."""
        self.faults.fail_next(method, path_regex, status, count, reason, message, retry_after)

    def delay_next(self, method: str, path_regex: str, seconds: float, count: int = 1) -> None:
        self.faults.delay_next(method, path_regex, seconds, count)

    def clear_faults(self) -> None:
        """Drop the faults still pending (fail_next, delay_next): an outage that ends."""
        self.faults.clear_rules()

    def hold_next(self, method: str, path_regex: str, *, body: str | None = None, applied: bool) -> Hold:
        """Park the next request matching method, ``re.search(path_regex, path)`` and (if given) a
        substring of its body, until ``release()`` or ``drop()`` on the returned hold.

        ``applied=False`` parks it before the store sees it; ``applied=True`` makes the change and
        parks the answer. ``hold.arrived`` turns true (and store waiters wake) once one is parked:
        a test can act exactly between two writes of a client, e.g. kill it."""
        return self.faults.hold_next(method, path_regex, body=body, applied=applied)

    def disarm(self, hold: Hold) -> None:
        """Take back a hold: no later request is parked by it; a parked one goes on."""
        self.faults.disarm(hold)

    def fail_randomly(
        self,
        method: str,
        path_regex: str,
        statuses: Iterable[int],
        fraction: float,
        *,
        seed: int | None = None,
        watches: bool = True,
    ) -> None:
        """Answer a random ``fraction`` of the requests matching method ("*" = any)
        and ``re.search(path_regex, path)`` with a Failure Status whose code is drawn
        from ``statuses`` (the request is not applied), until ``stop_random_failures``.
        ``seed`` makes the draws repeatable; ``watches=False`` spares watch requests."""
        self.faults.fail_randomly(method, path_regex, tuple(statuses), fraction, seed=seed, watches=watches)

    def stop_random_failures(self) -> dict[int, int]:
        """End every ``fail_randomly`` rule; returns how many answers of each status were injected."""
        return self.faults.stop_random_failures()

    @property
    def injected_failures(self) -> dict[int, int]:
        """Answers injected so far by the ``fail_randomly`` rules in place, per status."""
        return self.faults.injected()

    def drop_watches(self) -> None:
        """Break off every open watch stream mid-stream (no final chunk, connection closed),
        leaving other connections alone: what a client sees when an apiserver restarts."""
        self.store.drop_watches()

    def block_evictions(self, count: int | None = None) -> None:
        """Make the next ``count`` evictions (None: all, until unblocked) fail
        with 429 as if a PodDisruptionBudget forbade them."""
        self.evictions.block(count)

    def unblock_evictions(self) -> None:
        self.evictions.block(0)

    def compact_history(self) -> None:
        """Drop the watch event log: any watch from an older RV now gets 410."""
        self.store.compact()

    @property
    def active_watches(self) -> int:
        """Open watch streams (wait on this instead of sleeping until a client watches)."""
        return self.store.active_watches

    def break_connections(self) -> None:
        """Cut every open connection, watch streams included, as a network failure would."""
        if self._httpd is not None:
            self._httpd.drop_connections()

    def send_bookmarks(self) -> None:
        """Every watch that allows bookmarks sends one now."""
        self.store.request_bookmarks()

    # -------------------------------------------------------- direct access
    def objects(self, resource: str, namespace: str | None = None) -> list[JSON]:
        """Snapshot of ``resource`` ("pods", "deployments.apps", ...)."""
        return self.store.snapshot(self.registry.resolve(resource), namespace)

    def get_object(self, resource: str, name: str, namespace: str | None = None) -> JSON | None:
        return self.store.peek(self.registry.resolve(resource), namespace, name)

    def create_object(
        self, resource: str, obj: JSON, namespace: str | None = None, *, keep_status: bool = False
    ) -> JSON:
        ns = namespace or (obj.get("metadata") or {}).get("namespace")
        return self.store.create(self.registry.resolve(resource), ns, obj, keep_status=keep_status)

    def update_object(
        self, resource: str, name: str, fn: Callable[[JSON], JSON | None], namespace: str | None = None
    ) -> JSON:
        """Server-side read-modify-write, no validation (spec and status both writable)."""
        return self.store.mutate(self.registry.resolve(resource), namespace, name, fn)

    def delete_object(
        self,
        resource: str,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
    ) -> JSON:
        """DELETE as a client would; grace_period_seconds=0 forces a bound pod out at once."""
        options = None if grace_period_seconds is None else {"gracePeriodSeconds": grace_period_seconds}
        return self.store.delete(self.registry.resolve(resource), namespace, name, options)

    def set_pod_phase(
        self, namespace: str, name: str, phase: str, reason: str | None = None, message: str | None = None
    ) -> JSON:
        """Act as the kubelet: write ``status.phase`` (+reason/message)."""

        def apply(pod: JSON) -> None:
            status = pod.setdefault("status", {})
            status["phase"] = phase
            for key, value in (("reason", reason), ("message", message)):
                if value is None:
                    status.pop(key, None)
                else:
                    status[key] = value
            if phase == "Running":
                status.setdefault("startTime", now_rfc3339())

        return self.store.mutate(self.registry.resolve("pods"), namespace, name, apply, mode="status")

    def create_node(
        self,
        name: str,
        *,
        cpu: str = "4",
        memory: str = "8000Mi",
        ready: bool = True,
        labels: dict[str, str] | None = None,
    ) -> JSON:
        node = node_body(name, cpu=cpu, memory=memory, ready=ready, labels=labels, now=now_rfc3339())
        return self.create_object("nodes", node)

    # ---------------------------------------------------------------- waits
    def wait_for(self, predicate: Callable[[], T], timeout: float = 5.0) -> T:
        """Block until ``predicate()`` is truthy, re-checked on every store
        change and every request; returns its value or raises TimeoutError."""
        return self.store.wait_for(predicate, timeout)

    def settle(self, timeout: float = 5.0) -> None:
        """Block until the controllers have handled every change so far and
        have no overdue timer, so a test can assert that something did *not*
        happen (e.g. a tolerated pod survived)."""
        manager = self.controllers
        if manager is not None:
            self.store.wait_for(manager.caught_up, timeout)

    def advance_clock(self, seconds: float) -> None:
        """Move a ``FakeClock`` on and wake the controllers waiting on it."""
        if not isinstance(self.clock, FakeClock):
            raise RuntimeError("kube_fake: advance_clock needs FakeKubeServer(clock=FakeClock())")
        with self.store.cond:
            self.clock.advance(seconds)
            self.store.cond.notify_all()

    async def wait_for_async(self, predicate: Callable[[], T], timeout: float = 5.0) -> T:
        """``wait_for`` off the event loop, so aio clients keep running meanwhile."""
        return await asyncio.to_thread(self.store.wait_for, predicate, timeout)

    def __repr__(self) -> str:
        state = self.url if self._httpd is not None else "not started"
        return f"<FakeKubeServer {state}>"
