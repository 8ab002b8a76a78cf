"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's algorithm.

Candidates share one Lease. A candidate takes it when it names no holder, names
this candidate, or has not changed for `leaseDurationSeconds` by the
candidate's own clock (the time it last *saw* the record change: clocks of
different machines are never compared). The leader renews it every
`retry_period`; when renewing has failed for `renew_deadline` since the last
success, or a read shows another holder, it stops leading at once. Every write
is a create (409 if it exists) or a PUT carrying the resourceVersion that was
read, so of two candidates racing for one version only one wins.

Why one leader at a time holds: the leader stops within `renew_deadline` of
its last successful renewal, measured from before that request was sent; the
others wait at least `leaseDurationSeconds` (> `renew_deadline`) after they
first saw that renewal, which was after it was written.

A leader may add annotations to the Lease with each write (`annotate`): the
bridge reports its watchers' health there (worker/watcher_health.py) at no
extra request.

On a clean stop (cancellation) the leader's work is cancelled first, then the
Lease is released: no holder and `leaseDurationSeconds: 1` (0 is invalid), as
client-go's ReleaseOnCancel does, so a standby takes over at its next try.
"""

import asyncio
import logging
import math
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from clients.kube_client import Json, KubeClient, KubeConflict, KubeNotFound, api_path

log = logging.getLogger(__name__)

JITTER = 1.2  # client-go's JitterFactor: a candidate retries after retry_period * [1, 2.2)
LEASE_GROUP = "coordination.k8s.io"


@dataclass(frozen=True)
class LeaderTimings:
    """client-go's defaults (kube-controller-manager, kube-scheduler): 15 s / 10 s / 2 s."""

    lease_duration: float = 15.0  # how long a standby waits after the last change it saw
    renew_deadline: float = 10.0  # how long the leader keeps failing to renew before it stops
    retry_period: float = 2.0  # between tries, for the leader and the standbys

    def __post_init__(self) -> None:
        if not self.lease_duration > self.renew_deadline:
            raise ValueError("lease duration must be greater than the renew deadline")
        if not self.renew_deadline > JITTER * self.retry_period > 0:
            raise ValueError(f"renew deadline must be greater than {JITTER} times the retry period (> 0)")

    @property
    def lease_duration_seconds(self) -> int:
        # The Lease holds whole seconds; rounding up keeps it longer than the renew deadline.
        return max(1, math.ceil(self.lease_duration))


def default_identity() -> str:
    """Unique per process, readable per pod: `<hostname>_<random>` (as controller-runtime does)."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:12]}"


def micro_time() -> str:
    """Now as a metav1.MicroTime: RFC 3339 in UTC with microseconds."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Competes for `namespace/name` as `identity`; `run(lead)` runs `lead()` only while leading."""

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        timings: LeaderTimings | None = None,
        *,
        release_on_cancel: bool = True,
        annotate: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timings = timings or LeaderTimings()
        self.release_on_cancel = release_on_cancel
        self.annotate = annotate
        self.lease_ref = f"{namespace}/{name}"  # for messages
        self.terms = 0  # times this elector became leader
        self._leading = False
        self._running = False
        self._lease: Json | None = None  # the last version read or written
        self._observed: Json | None = None  # its spec, and when it was first seen
        self._observed_at = 0.0
        self._renewed_at = 0.0  # start of the last successful write of ours
        self._answered_at = 0.0  # last answer from the API server about the Lease

    # ------------------------------------------------------------------ state
    @property
    def is_leader(self) -> bool:
        """True while `lead()` is meant to run."""
        return self._leading

    @property
    def leader(self) -> str:
        """The holder last seen on the Lease ("" if none, or not read yet)."""
        return str((self._observed or {}).get("holderIdentity") or "")

    def check(self, tolerance: float = 0.0) -> str | None:
        """None when healthy, else why not: for a readiness (or liveness) probe.

        Unhealthy while `run()` is not running, when the API server has not
        answered about the Lease for a lease duration (a standby could not
        take over), or when the leader has not renewed for a lease duration
        (it should have stopped leading: client-go's `Check`).
        """
        now = time.monotonic()
        limit = self.timings.lease_duration + tolerance
        if not self._running:
            return "leader election is not running"
        if now - self._answered_at > limit:
            return f"no answer about Lease {self.lease_ref} for {now - self._answered_at:.0f}s"
        if self._leading and now - self._renewed_at > limit:
            return f"leader has not renewed Lease {self.lease_ref} for {now - self._renewed_at:.0f}s"
        return None

    @property
    def healthy(self) -> bool:
        return self.check() is None

    # -------------------------------------------------------------------- run
    async def run(self, lead: Callable[[], Awaitable[None]]) -> None:
        """Compete until cancelled; lead while leader, cancelling `lead()` when the Lease is lost.

        `lead()` ending by itself (returning or raising) gives the Lease up, and
        the elector competes again.
        """
        self._running = True
        self._answered_at = time.monotonic()
        try:
            while True:
                try:
                    await self._acquire()
                    await self._lead(lead)
                except Exception:  # a bug: leading has stopped (see _lead); keep competing
                    log.exception("leader election for Lease %s failed", self.lease_ref)
                await asyncio.sleep(self.timings.retry_period)
        except asyncio.CancelledError:
            if self.release_on_cancel and self.leader == self.identity:
                await self._release()
            raise
        finally:
            self._running = False

    async def _acquire(self) -> None:
        log.info("trying to acquire Lease %s as %s", self.lease_ref, self.identity)
        while True:
            try:
                if await self._try_acquire_or_renew():
                    return
            except Exception as error:
                log.warning("could not acquire Lease %s: %s", self.lease_ref, error)
            await asyncio.sleep(self.timings.retry_period * (1 + random.random() * JITTER))

    async def _lead(self, lead: Callable[[], Awaitable[None]]) -> None:
        self._leading = True
        self.terms += 1
        log.info("leading: acquired Lease %s as %s", self.lease_ref, self.identity)
        work = asyncio.create_task(_run_work(lead), name=f"lead {self.lease_ref}")
        try:
            while not work.done():
                await asyncio.wait({work}, timeout=self.timings.retry_period)
                if not work.done() and not await self._renew():
                    break  # lost
        finally:
            self._leading = False
            work.cancel()
            await asyncio.wait({work})  # its cleanup ends before the Lease can be released
        if not work.cancelled():
            log.info("leader work ended; giving up Lease %s", self.lease_ref)
            await self._release()

    async def _renew(self) -> bool:
        """Renew until done or past the deadline; False when the Lease is lost."""
        deadline = self._renewed_at + self.timings.renew_deadline
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                async with asyncio.timeout(remaining) as attempt:
                    if await self._try_acquire_or_renew():
                        return True
            except TimeoutError as error:
                if attempt.expired():
                    break
                log.warning("could not renew Lease %s: %s", self.lease_ref, error)
            except Exception as error:
                log.warning("could not renew Lease %s: %s", self.lease_ref, error)
            if self.leader not in ("", self.identity):
                log.warning("lost Lease %s: %s holds it", self.lease_ref, self.leader)
                return False
            await asyncio.sleep(max(0.0, min(self.timings.retry_period, deadline - time.monotonic())))
        log.warning("lost Lease %s: not renewed within %.1fs", self.lease_ref, self.timings.renew_deadline)
        return False

    # ------------------------------------------------------------- one attempt
    async def _try_acquire_or_renew(self) -> bool:
        started = time.monotonic()
        now = micro_time()
        ours = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.timings.lease_duration_seconds,
            "acquireTime": now,
            "renewTime": now,
        }
        if self._leading and self._lease is not None:
            # The leader's fast path: its last write is most likely still the current version.
            try:
                return await self._write(self._lease, ours, renewing=True, started=started)
            except KubeConflict:
                pass  # read it again
        try:
            lease = await self._get()
        except KubeNotFound:
            return await self._create({**ours, "leaseTransitions": 0}, started)
        spec = self._observe(lease)
        holder = spec.get("holderIdentity") or ""
        if holder and holder != self.identity and not self._expired(spec):
            return False
        try:
            return await self._write(lease, ours, renewing=holder == self.identity, started=started)
        except KubeConflict:
            return False  # someone else wrote it first

    async def _write(self, lease: Json, ours: Json, *, renewing: bool, started: float) -> bool:
        old = lease.get("spec") or {}
        transitions = int(old.get("leaseTransitions") or 0)
        spec = {**old, **ours}
        if renewing:
            spec["acquireTime"] = old.get("acquireTime") or ours["acquireTime"]
            spec["leaseTransitions"] = transitions
        else:
            spec["leaseTransitions"] = transitions + 1
        self._remember(await self._put(self._annotated({**lease, "spec": spec})))
        self._renewed_at = started
        return True

    async def _create(self, spec: Json, started: float) -> bool:
        body = {
            "apiVersion": f"{LEASE_GROUP}/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": spec,
        }
        try:
            created = await self.kube.request("POST", self._path(None), body=self._annotated(body))
        except KubeConflict:
            self._answered_at = time.monotonic()
            return False  # AlreadyExists: another candidate created it first
        self._remember(created)
        self._renewed_at = started
        return True

    async def _release(self) -> None:
        """Hand the Lease back if it still names us; retried on conflict, for at most the renew deadline."""
        try:
            async with asyncio.timeout(self.timings.renew_deadline):
                while True:
                    lease = await self._get()
                    spec = self._observe(lease)
                    if spec.get("holderIdentity") != self.identity:
                        return
                    now = micro_time()
                    released = {
                        **spec,
                        "holderIdentity": "",
                        "leaseDurationSeconds": 1,
                        "acquireTime": now,
                        "renewTime": now,
                    }
                    try:
                        self._remember(await self._put({**lease, "spec": released}))
                    except KubeConflict:
                        continue
                    log.info("released Lease %s", self.lease_ref)
                    return
        except Exception as error:
            # Not fatal: the others take over when the lease duration has passed.
            log.warning("could not release Lease %s: %s", self.lease_ref, error)

    def _annotated(self, lease: Json) -> Json:
        """The Lease with the leader's annotations (a failing `annotate` only costs the report)."""
        if self.annotate is None:
            return lease
        try:
            extra = dict(self.annotate())
        except Exception:
            log.exception("annotating Lease %s failed", self.lease_ref)
            return lease
        meta = dict(lease.get("metadata") or {})
        meta["annotations"] = {**(meta.get("annotations") or {}), **extra}
        return {**lease, "metadata": meta}

    # ------------------------------------------------------------------ I/O
    def _path(self, name: str | None) -> str:
        return api_path("leases", namespace=self.namespace, name=name, group=LEASE_GROUP)

    async def _get(self) -> Json:
        try:
            lease = await self.kube.request("GET", self._path(self.name))
        except KubeNotFound:
            self._answered_at = time.monotonic()
            raise
        self._answered_at = time.monotonic()
        return lease

    async def _put(self, lease: Json) -> Json:
        # The body keeps metadata.resourceVersion as read: a stale one is a 409, never an overwrite.
        try:
            return await self.kube.request("PUT", self._path(self.name), body=lease)
        except KubeConflict:
            self._answered_at = time.monotonic()
            raise

    def _observe(self, lease: Json) -> Json:
        """Remember a Lease read; a changed record restarts the expiry clock."""
        spec: Json = lease.get("spec") or {}
        self._lease = lease
        if spec != self._observed:
            self._observed = spec
            self._observed_at = time.monotonic()
        return spec

    def _remember(self, written: Json) -> None:
        """A successful write of ours: the new version for the next CAS, and the record now current."""
        self._answered_at = time.monotonic()
        self._lease = written
        self._observed = written.get("spec") or {}
        self._observed_at = time.monotonic()

    def _expired(self, spec: Json) -> bool:
        duration = int(spec.get("leaseDurationSeconds") or 0)
        return time.monotonic() >= self._observed_at + duration


async def _run_work(lead: Callable[[], Awaitable[None]]) -> None:
    try:
        await lead()
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("leader work failed")
