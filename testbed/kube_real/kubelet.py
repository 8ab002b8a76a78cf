"""A stand-in kubelet for the real API server: no kubelet runs in the test bed.

It does for the test's namespace what the fake's simulated kubelet does
(testbed/kube_fake/kubelet.py), through the real API server:

* a pod bound to an existing Node, still Pending and not being deleted, goes
  Running (the fake kubelet's status: conditions, container statuses, IPs);
* with annotation `kube-fake.slurm-bridge.dev/run-seconds: "N"` it ends N
  seconds later, Succeeded (or Failed with a non-zero `…/exit-code`);
* a bound pod being deleted gracefully is confirmed at once (a delete with
  grace 0, as a kubelet does once its containers stopped).

It reacts to the cluster's watch events (RealCluster's change counter) and
wakes early only for the next run-seconds deadline.
"""

import contextlib
import threading
import time

from testbed.kube_fake.kubelet import EXIT_CODE, RUN_SECONDS, finished_status, running_status
from testbed.kube_real.cluster import ApiFailure, Json, RealCluster


class RealKubelet:
    def __init__(self, cluster: RealCluster) -> None:
        self.cluster = cluster
        self._started: dict[str, float] = {}  # pod uid -> monotonic start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kube-real kubelet", daemon=True)

    def start(self) -> "RealKubelet":
        # Watching pods and nodes before the first pass: no change slips past it.
        self.cluster.objects("nodes")
        self.cluster.objects("pods", self.cluster.namespace)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.cluster.changes.bump()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            seen = self.cluster.changes.count
            try:
                due = self._reconcile()
            except (ApiFailure, OSError):
                due = time.monotonic() + 0.2  # a write raced another: look again shortly
            wait = 5.0 if due is None else max(due - time.monotonic(), 0.0)
            self.cluster.changes.wait_past(seen, wait)

    def _reconcile(self) -> float | None:
        cluster, namespace = self.cluster, self.cluster.namespace
        nodes = {node["metadata"]["name"]: node for node in cluster.objects("nodes")}
        next_due: float | None = None
        for pod in cluster.objects("pods", namespace):
            meta, spec = pod["metadata"], pod.get("spec") or {}
            phase, node_name = (pod.get("status") or {}).get("phase"), spec.get("nodeName")
            if meta.get("deletionTimestamp"):
                if node_name in nodes and int(meta.get("deletionGracePeriodSeconds") or 0) > 0:
                    with contextlib.suppress(ApiFailure):  # gone meanwhile
                        cluster.delete_object("pods", meta["name"], namespace, grace_period_seconds=0)
                continue
            if phase == "Pending" and node_name in nodes:
                self._started[meta["uid"]] = time.monotonic()
                self._write(pod, running_status(pod, nodes[node_name]))
                phase = "Running"
            annotations = meta.get("annotations") or {}
            if phase != "Running" or RUN_SECONDS not in annotations:
                continue
            try:
                seconds, exit_code = float(annotations[RUN_SECONDS]), int(annotations.get(EXIT_CODE, "0"))
            except ValueError:
                continue
            due = self._started.setdefault(meta["uid"], time.monotonic()) + seconds
            if time.monotonic() >= due:
                current = cluster.get_object("pods", meta["name"], namespace)
                if current is not None:
                    self._write(current, finished_status(current, exit_code))
                self._started.pop(meta["uid"], None)
            else:
                next_due = due if next_due is None else min(next_due, due)
        return next_due

    def _write(self, pod: Json, status: Json) -> None:
        def apply(current: Json) -> None:
            current["status"] = status

        self.cluster.update_object("pods", pod["metadata"]["name"], apply, self.cluster.namespace)
