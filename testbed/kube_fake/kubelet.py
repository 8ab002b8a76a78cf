"""Simulated kubelet for the local demo stack (off by default).

Behaviour, deliberately small:

* a pod bound (``spec.nodeName``) to a Node that exists, still ``Pending`` and
  not being deleted, goes ``Running`` right away: conditions
  PodReadyToStartContainers/Initialized/ContainersReady/Ready/PodScheduled
  True, a running ``containerStatuses`` entry per container, pod/host IPs;
* with annotation ``kube-fake.slurm-bridge.dev/run-seconds: "N"`` it finishes
  N seconds after it started: ``Succeeded`` (exit code 0), or ``Failed`` when
  ``kube-fake.slurm-bridge.dev/exit-code`` is non-zero;
* deletion of a pod on one of its nodes is confirmed at once (a delete with
  grace 0, as a kubelet does once containers stopped): the object disappears
  when its finalizers are gone. Without this kubelet (the default) a bound pod
  stays Terminating, as on a node whose kubelet is gone.

It runs in its own thread and reacts to store changes (condition variable),
waking early only for the next run-seconds deadline.
"""

from __future__ import annotations

import functools
import hashlib
import sys
import time
import traceback
from typing import Any

from .loop import StoreLoop
from .resources import Registry
from .store import Store
from .subresources import set_condition
from .util import JSON, now_rfc3339

RUN_SECONDS = "kube-fake.slurm-bridge.dev/run-seconds"
EXIT_CODE = "kube-fake.slurm-bridge.dev/exit-code"


def _ip_for(uid: str) -> str:
    digest = hashlib.sha256(uid.encode()).digest()
    return f"10.244.{digest[0]}.{digest[1] % 254 + 1}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _container_id(uid: str, name: str) -> str:
    return "containerd://" + _digest(f"{uid}/{name}")


def _node_ip(node: JSON) -> str:
    for addr in (node.get("status") or {}).get("addresses") or []:
        if addr.get("type") == "InternalIP":
            return str(addr.get("address"))
    return "127.0.0.1"


def running_status(pod: JSON, node: JSON) -> JSON:
    now = now_rfc3339()
    status: JSON = dict(pod.get("status") or {})
    uid = pod["metadata"]["uid"]
    ip, host_ip = _ip_for(uid), _node_ip(node)
    status.update(
        phase="Running",
        hostIP=host_ip,
        hostIPs=[{"ip": host_ip}],
        podIP=ip,
        podIPs=[{"ip": ip}],
        startTime=now,
    )
    for ctype in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready", "PodScheduled"):
        set_condition(status, ctype, "True")
    status["containerStatuses"] = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": f"{c.get('image', '')}@sha256:{_digest(str(c.get('image')))}",
            "containerID": _container_id(uid, c["name"]),
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": now}},
        }
        for c in (pod.get("spec") or {}).get("containers") or []
    ]
    return status


def finished_status(pod: JSON, exit_code: int) -> JSON:
    now = now_rfc3339()
    status: JSON = dict(pod.get("status") or {})
    ok = exit_code == 0
    status["phase"] = "Succeeded" if ok else "Failed"
    for ctype in ("ContainersReady", "Ready"):
        set_condition(status, ctype, "False", reason="PodCompleted" if ok else "PodFailed")
    finished = []
    for cs in status.get("containerStatuses") or []:
        started = ((cs.get("state") or {}).get("running") or {}).get("startedAt", now)
        terminated = {
            "exitCode": exit_code,
            "reason": "Completed" if ok else "Error",
            "startedAt": started,
            "finishedAt": now,
            "containerID": cs.get("containerID", ""),
        }
        finished.append({**cs, "ready": False, "started": False, "state": {"terminated": terminated}})
    status["containerStatuses"] = finished
    return status


class FakeKubelet(StoreLoop):
    def __init__(self, store: Store, registry: Registry) -> None:
        super().__init__(store, "kube-fake-kubelet")
        self.pods = registry.resolve("pods")
        self.nodes = registry.resolve("nodes")
        self._started: dict[str, float] = {}  # pod uid -> monotonic start (startTime is 1s-granular)

    def _run(self) -> None:
        store = self.store
        with store.cond:
            while not (self._stop or store.closing):
                seen = store.rv
                try:
                    next_due = self._reconcile()
                except Exception:
                    # Keep the kubelet alive; a bug here must be visible, not fatal.
                    traceback.print_exc(file=sys.stderr)
                    next_due = None
                wait = None if next_due is None else max(next_due - time.monotonic(), 0.0)
                store.cond.wait_for(functools.partial(self._woken, seen), timeout=wait)

    def _woken(self, seen_rv: int) -> bool:
        return self._stop or self.store.closing or self.store.rv != seen_rv

    def _reconcile(self) -> float | None:
        """One pass over all pods (caller holds the store lock); returns the next deadline."""
        next_due: float | None = None
        for pod in self.store.snapshot(self.pods, None):
            meta: dict[str, Any] = pod["metadata"]
            spec, status = pod.get("spec") or {}, pod.get("status") or {}
            if meta.get("deletionTimestamp"):
                # It stops the containers at once and confirms: a delete with grace 0.
                node_known = self.store.peek(self.nodes, None, spec.get("nodeName") or "") is not None
                if node_known and int(meta.get("deletionGracePeriodSeconds") or 0) > 0:
                    self.store.delete(
                        self.pods, meta.get("namespace"), meta["name"], {"gracePeriodSeconds": 0}
                    )
                continue
            phase, node_name = status.get("phase"), spec.get("nodeName")
            if phase == "Pending" and node_name:
                node = self.store.peek(self.nodes, None, node_name)
                if node is None:
                    continue
                self._started[meta["uid"]] = time.monotonic()
                self._write(pod, running_status(pod, node))
                phase = "Running"
            if phase != "Running" or RUN_SECONDS not in (meta.get("annotations") or {}):
                continue
            try:
                seconds = float(meta["annotations"][RUN_SECONDS])
                exit_code = int(meta["annotations"].get(EXIT_CODE, "0"))
            except ValueError:
                continue
            due = self._started.setdefault(meta["uid"], time.monotonic()) + seconds
            if time.monotonic() >= due:
                current = self.store.get(self.pods, meta.get("namespace"), meta["name"])
                self._write(current, finished_status(current, exit_code))
                self._started.pop(meta["uid"], None)
            else:
                next_due = due if next_due is None else min(next_due, due)
        return next_due

    def _write(self, pod: JSON, status: JSON) -> None:
        meta = pod["metadata"]

        def apply(obj: JSON) -> JSON:
            obj["status"] = status
            return obj

        self.store.mutate(self.pods, meta.get("namespace"), meta["name"], apply, mode="status")
