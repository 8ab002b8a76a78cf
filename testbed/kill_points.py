"""SIGKILL the real `slurm-bridge worker` process at one step of a placement, restart it, check the ends.

Used by the CI test (tests/e2e/test_kill_points.py: every kill point once, for a pod and a
group) and the on-demand soak (bench/soak.py: many placements, random kill points).

Every kill lands on an observed side effect, never after a sleep: the Kubernetes side parks
the worker's next request of the step (`FakeKubeServer.hold_next`, or in front of the real API
server testbed/kube_real/proxy.py's `HoldingProxy`), the test sees the side effect (in Kubernetes,
or in Slurm through scontrol: never through the product's client),
kills the worker while the request is parked, then drops the request. So the kill falls exactly
between two side effects of the placement:

| kill point       | parked request                       | observed before the kill            |
|------------------|--------------------------------------|-------------------------------------|
| before-submit    | the claim's answer (change applied)   | the pods carry the finalizer         |
| after-submit     | the job-id label (not applied)        | Slurm has the placement's job        |
| after-label      | the job-id label's answer (applied)   | the pod carries the job-id label     |
| after-bind       | the binding's answer (applied)        | the pod has its nodeName             |
| during-cleanup   | the finalizer removal (not applied)   | Slurm ended the job (pods finished)  |

Its size (about 430 lines) is the kill points' table and the worker process driver that
places a pod through each of them.
"""

import asyncio
import contextlib
import enum
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

from bridge import grouping, keys
from testbed.kube_backend import KubeBackend
from testbed.kube_fake import Hold
from testbed.slurm_bed import BedJob, SlurmTestBed
from testbed.waiting import until
from testbed.worker_env import bed_settings, settings_env

Pod = dict[str, Any]
SIDE_EFFECT_TIMEOUT = 60.0  # a step that does not happen at all within this is a failure
RECOVERY_TIMEOUT = 40.0  # under the 60 s attempt timeout: a takeover must not wait for it
SLURM_POLL = 0.1  # Slurm tells nobody when a job appears or ends: ask scontrol this often


class HoldingKube(KubeBackend, Protocol):
    """A Kubernetes that can park a request: the fake, or the real one behind a HoldingProxy."""

    def hold_next(self, method: str, path_regex: str, *, body: str | None = None, applied: bool) -> Hold: ...

    def disarm(self, hold: Hold) -> None: ...


class KillPoint(enum.Enum):
    BEFORE_SUBMIT = "before-submit"
    AFTER_SUBMIT = "after-submit"
    AFTER_LABEL = "after-label"
    AFTER_BIND = "after-bind"
    DURING_CLEANUP = "during-cleanup"


class Kind(enum.Enum):
    POD = "pod"
    GROUP = "group"  # a PodGroup of two pods: one Slurm job, two nodes


@dataclass
class KillBed:
    """What a run needs: the fake API server, Slurm, the test's partition and the worker's environment."""

    kube: HoldingKube
    slurm: SlurmTestBed
    partition: str
    env: dict[str, str]
    log_dir: Path
    worker: "WorkerProcess | None" = None
    starts: int = 0

    @property
    def namespace(self) -> str:
        return self.partition

    @property
    def installation(self) -> str:
        return self.env["INSTALLATION_ID"]

    @property
    def scheduler(self) -> str:
        return scheduler_name(self.partition)

    async def ensure_worker(self) -> "WorkerProcess":
        if self.worker is None or self.worker.process.returncode is not None:
            self.starts += 1
            self.worker = await WorkerProcess.start(self.env, self.log_dir / f"worker-{self.starts}.log")
        return self.worker

    async def stop_worker(self) -> None:
        if self.worker is not None:
            await self.worker.stop()
            self.worker = None

    def jobs_of(self, workflow_id: str) -> list[BedJob]:
        """Every job Slurm has or had (ended ones stay MinJobAge = 300 s) for this placement."""
        return [
            j for j in self.slurm.jobs_in_partition(self.partition) if j.comment.startswith(workflow_id + "@")
        ]


@dataclass
class WorkerProcess:
    process: asyncio.subprocess.Process
    log: TextIO

    @classmethod
    async def start(cls, env: dict[str, str], log_path: Path) -> "WorkerProcess":
        log = log_path.open("w")
        process = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).with_name("slurm-bridge")),
            "worker",
            env=env,
            stdout=log,
            stderr=log,
        )
        return cls(process, log)

    async def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()
        self.log.close()

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(self.process.wait(), 20)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        self.log.close()


@dataclass
class Outcome:
    """What became of one placement with one kill."""

    name: str
    kind: Kind
    point: KillPoint
    workflow_id: str = ""
    pods: list[str] = field(default_factory=list)
    killed: bool = False
    jobs_before_kill: int | None = None  # before-submit: the kill came before any job
    nodes: dict[str, str] = field(default_factory=dict)  # pod → node it was bound to
    jobs: list[BedJob] = field(default_factory=list)  # every job Slurm had for the placement
    finalizers_left: list[str] = field(default_factory=list)
    told: dict[str, str] = field(default_factory=dict)  # unbound pod → the PodScheduled=False reason on it
    error: str = ""
    seconds: float = 0.0

    @property
    def duplicated(self) -> bool:
        return len(self.jobs) > 1

    @property
    def failed_told(self) -> bool:
        """Not placed, but given up cleanly with the reason on every pod (say Slurm refused the
        job because another test's slurmctld restart made it forget the partition): not lost."""
        unbound = [p for p in self.pods if p not in self.nodes]
        return bool(
            unbound
            and all(self.told.get(p) for p in unbound)
            and not self.finalizers_left
            and len(self.jobs) <= 1
            and all(job.ended for job in self.jobs)
        )

    @property
    def lost(self) -> bool:
        """Not bound (and not told why), no job, a finalizer left, a job still live, or an error."""
        if self.failed_told:
            return False
        return bool(
            self.error
            or not self.jobs
            or len(self.nodes) < pod_count(self.kind)
            or self.finalizers_left
            or any(not job.ended for job in self.jobs)
        )

    def violations(self) -> list[str]:
        found = []
        if self.error:
            found.append(self.error)
        if len(self.jobs) != 1:
            found.append(f"{len(self.jobs)} Slurm jobs ever existed for the placement: {self.jobs}")
        if len(self.nodes) < pod_count(self.kind):
            found.append(f"pods bound: {self.nodes}")
        elif len(set(self.nodes.values())) != len(self.nodes):
            found.append(f"two pods on one node: {self.nodes}")
        if self.finalizers_left:
            found.append(f"pods kept the finalizer: {self.finalizers_left}")
        if live := [job for job in self.jobs if not job.ended]:
            found.append(f"jobs still live after the pods finished: {live}")
        if self.point is KillPoint.BEFORE_SUBMIT and self.jobs_before_kill:
            found.append(f"before-submit kill came after a submission ({self.jobs_before_kill} jobs)")
        return [f"{self.name} ({self.kind.value}, {self.point.value}): {v}" for v in found]


def pod_count(kind: Kind) -> int:
    return 2 if kind is Kind.GROUP else 1


def scheduler_name(partition: str) -> str:
    """A scheduler name of the test's own: node sync acts only on Slurm nodes its scheduler name
    registered, so the worker never removes other tests' nodes on the shared Slurm (nor they ours)."""
    return f"kill-{partition}"


def pod_manifest(namespace: str, name: str, scheduler: str, labels: dict[str, str] | None = None) -> Pod:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name, "labels": labels or {}},
        "spec": {
            "schedulerName": scheduler,
            "containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}],
        },
    }


def create_placement(bed: KillBed, kind: Kind, name: str) -> tuple[str, list[str]]:
    """Create the pods (and PodGroup) of one placement; its workflow id and pod names."""
    prefix = f"placement/{bed.installation}/{bed.namespace}"
    if kind is Kind.POD:
        pod = bed.kube.create_object("pods", pod_manifest(bed.namespace, name, bed.scheduler))
        return f"{prefix}/{name}/{pod['metadata']['uid']}", [name]
    group = bed.kube.create_object(
        "podgroups.scheduling.x-k8s.io",
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": name, "namespace": bed.namespace},
            "spec": {"minMember": 2},
        },
    )
    names = [f"{name}-{index}" for index in range(2)]
    for pod_name in names:
        bed.kube.create_object(
            "pods", pod_manifest(bed.namespace, pod_name, bed.scheduler, {grouping.LABEL_POD_GROUP: name})
        )
    return f"{prefix}/podgroup/{name}/{group['metadata']['uid']}", names


def arm(kube: HoldingKube, namespace: str, point: KillPoint) -> Hold:
    """Park the request of the step the kill point follows (see the table above)."""
    pods = rf"/namespaces/{namespace}/pods/[^/]+"
    if point is KillPoint.BEFORE_SUBMIT:
        return kube.hold_next("PATCH", pods + "$", body=keys.ANNOTATION_PLACEMENT, applied=True)
    if point is KillPoint.AFTER_SUBMIT:
        return kube.hold_next("PATCH", pods + "$", body=keys.LABEL_SLURM_JOB_ID, applied=False)
    if point is KillPoint.AFTER_LABEL:
        return kube.hold_next("PATCH", pods + "$", body=keys.LABEL_SLURM_JOB_ID, applied=True)
    if point is KillPoint.AFTER_BIND:
        return kube.hold_next("POST", pods + "/binding$", applied=True)
    # The finalizer's removal (a strategic merge patch that takes our entry out of the list).
    return kube.hold_next("PATCH", pods + "$", body="$deleteFromPrimitiveList/finalizers", applied=False)


async def until_kube(kube: HoldingKube, check: Callable[[], object], what: str, timeout: float) -> None:
    try:
        await kube.wait_for_async(check, timeout)
    except TimeoutError:
        raise TimeoutError(f"never: {what}") from None


def pod(kube: HoldingKube, namespace: str, name: str) -> Pod:
    return kube.get_object("pods", name, namespace) or {}


def has_finalizer(p: Pod) -> bool:
    return keys.FINALIZER in (p.get("metadata", {}).get("finalizers") or [])


async def place_with_kill(bed: KillBed, kind: Kind, point: KillPoint, name: str) -> Outcome:
    """One placement, one SIGKILL of the worker at `point`, a restart; what became of it."""
    outcome = Outcome(name, kind, point)
    started = time.monotonic()
    holds: list[Hold] = []
    try:
        await _place_with_kill(bed, outcome, holds)
    except (TimeoutError, AssertionError) as error:
        outcome.error = str(error) or type(error).__name__
        worker = bed.worker
        if worker is not None and worker.process.returncode not in (None, -signal.SIGKILL):
            # Not our kill: a worker that could not start (a bad setting, a taken port) or crashed.
            outcome.error += f" (the worker exited with {worker.process.returncode}: {worker.log.name})"
    finally:
        for hold in holds:  # one that never caught its request must not catch the next placement's
            bed.kube.disarm(hold)
    outcome.seconds = time.monotonic() - started
    with contextlib.suppress(Exception):
        outcome.jobs = await asyncio.to_thread(bed.jobs_of, outcome.workflow_id)
    kube, ns = bed.kube, bed.namespace
    outcome.finalizers_left = [n for n in outcome.pods if has_finalizer(pod(kube, ns, n))]
    outcome.told = {n: reason for n in outcome.pods if (reason := not_scheduled_reason(pod(kube, ns, n)))}
    return outcome


def not_scheduled_reason(p: Pod) -> str:
    conditions = (p.get("status") or {}).get("conditions") or []
    return next(
        (
            str(c.get("reason") or "")
            for c in conditions
            if c.get("type") == keys.CONDITION_POD_SCHEDULED and c.get("status") == "False"
        ),
        "",
    )


async def _place_with_kill(bed: KillBed, outcome: Outcome, holds: list[Hold]) -> None:
    kube, ns = bed.kube, bed.namespace
    await bed.ensure_worker()
    hold = None if outcome.point is KillPoint.DURING_CLEANUP else arm(kube, ns, outcome.point)
    holds += [hold] if hold is not None else []
    outcome.workflow_id, names = create_placement(bed, outcome.kind, outcome.name)
    outcome.pods = names
    wid = outcome.workflow_id

    async def kill_when(side_effect: Awaitable[object], parked: Hold) -> None:
        await side_effect
        await until_kube(kube, lambda: parked.arrived, "the step's request was parked", SIDE_EFFECT_TIMEOUT)
        assert bed.worker is not None
        await bed.worker.kill()
        outcome.killed = True
        parked.drop()

    if hold is not None:
        point = outcome.point
        effect: Awaitable[object]
        if point is KillPoint.BEFORE_SUBMIT:
            effect = until_kube(
                kube,
                lambda: any(has_finalizer(pod(kube, ns, n)) for n in names),
                "claimed",
                SIDE_EFFECT_TIMEOUT,
            )
        elif point is KillPoint.AFTER_SUBMIT:
            # Slurm tells nobody: ask scontrol (off the event loop).
            effect = until(
                lambda: asyncio.to_thread(bed.jobs_of, wid),
                "Slurm to show the placement's job",
                SIDE_EFFECT_TIMEOUT,
                SLURM_POLL,
            )
        elif point is KillPoint.AFTER_LABEL:
            effect = until_kube(
                kube,
                lambda: any(labelled(pod(kube, ns, n)) for n in names),
                "a pod labelled with the job id",
                SIDE_EFFECT_TIMEOUT,
            )
        else:
            effect = until_kube(
                kube, lambda: any(bound(pod(kube, ns, n)) for n in names), "a pod bound", SIDE_EFFECT_TIMEOUT
            )
        await kill_when(effect, hold)
        if point is KillPoint.BEFORE_SUBMIT:
            outcome.jobs_before_kill = len(await asyncio.to_thread(bed.jobs_of, wid))
        await bed.ensure_worker()

    await until_kube(
        kube,
        lambda: all(bound(pod(kube, ns, n)) for n in names),
        f"all pods of {wid} bound",
        RECOVERY_TIMEOUT if hold is not None else SIDE_EFFECT_TIMEOUT,
    )
    outcome.nodes = {n: bound(pod(kube, ns, n)) for n in names}

    cleanup_hold = (
        arm(kube, ns, KillPoint.DURING_CLEANUP) if outcome.point is KillPoint.DURING_CLEANUP else None
    )
    holds += [cleanup_hold] if cleanup_hold is not None else []
    for n in names:
        kube.set_pod_phase(ns, n, "Succeeded")
    if cleanup_hold is not None:

        def job_ended() -> bool:
            return bool((jobs := bed.jobs_of(wid)) and all(j.ended for j in jobs))

        ended = until(
            lambda: asyncio.to_thread(job_ended),  # Slurm tells nobody: ask scontrol
            "Slurm to show the job ended",
            SIDE_EFFECT_TIMEOUT,
            SLURM_POLL,
        )
        await kill_when(ended, cleanup_hold)
        await bed.ensure_worker()
    await until_kube(
        kube,
        lambda: not any(has_finalizer(pod(kube, ns, n)) for n in names),
        "finalizers removed",
        RECOVERY_TIMEOUT,
    )


def labelled(p: Pod) -> bool:
    return bool((p.get("metadata", {}).get("labels") or {}).get(keys.LABEL_SLURM_JOB_ID))


def bound(p: Pod) -> str:
    return str((p.get("spec") or {}).get("nodeName") or "")


def worker_env(
    *, temporal_address: str, task_queue: str, slurm: SlurmTestBed, kubeconfig: Path, partition: str
) -> dict[str, str]:
    """A worker process that takes over a dead predecessor's steps and tasks within seconds.

    An installation of its own: the worker runs the orphan sweep, which cancels jobs of its
    installation whose pods it cannot find, and other runs share this Slurm (a soak lasts
    long enough for sweeps to fire while other tests place pods).
    """
    return settings_env(
        bed_settings(slurm, kubeconfig, task_queue, partition=partition),
        temporal_address,
        INSTALLATION_ID=f"kill-{partition}",
        SCHEDULER_NAME=scheduler_name(partition),
        STEP_HEARTBEAT_TIMEOUT="2",
        TEMPORAL_STICKY_TIMEOUT="1",
        LOG_FORMAT="json",
        METRICS_PORT="0",  # no port to collide with another worker on the machine
    )
