"""Who leads, and how its watchers fare: written on the Lease, read by the CLI.

The leader adds one annotation (`slurm-bridge/watchers`, JSON) to the Lease
with every renewal it writes anyway, so the report costs no extra request and
is never older than the retry period while a leader lives. `slurm-bridge
status` and `list` read the Lease: its holder is the leader replica, its
renewTime says whether that leader is alive, and the annotation says whether
the pod, job and node watchers are keeping up.
"""

import time
from collections.abc import Mapping
from datetime import UTC, datetime

from pydantic import BaseModel, ValidationError

from bridge import keys
from clients.kube_client import Json, KubeClient, KubeError, KubeNotFound, api_path

LEASE_GROUP = "coordination.k8s.io"


class WatcherHealth(BaseModel):
    """One watcher: has it listed, when did it last succeed, how many failures since (and in all)."""

    synced: bool
    last_success: str | None = None  # RFC 3339, UTC
    failing: int = 0
    errors: int = 0

    @property
    def ok(self) -> bool:
        return self.synced and self.failing == 0

    def describe(self, now: float | None = None) -> str:
        age = _age(self.last_success, now)
        last = f"last success {age:.0f}s ago" if age is not None else "never succeeded"
        if not self.synced:
            state = "not synced yet"
        elif self.failing:
            state = f"FAILING ({self.failing} in a row)"
        else:
            state = "ok"
        return f"{state}, {last}, {self.errors} errors"


class HealthReport(BaseModel):
    """The annotation's value."""

    identity: str
    reported_at: str
    watchers: dict[str, WatcherHealth]


class Leadership(BaseModel):
    """What the Lease says: the leader replica and its watchers (None where unknown)."""

    lease: str  # namespace/name
    holder: str | None = None
    renew_time: str | None = None
    lease_duration_seconds: int | None = None
    transitions: int | None = None
    report: HealthReport | None = None
    error: str | None = None  # why the Lease could not be read

    def alive(self, now: float | None = None) -> bool:
        """A holder whose last renewal is within the lease duration (by this machine's clock)."""
        age = _age(self.renew_time, now)
        return bool(self.holder) and age is not None and age <= (self.lease_duration_seconds or 0)

    def describe(self, now: float | None = None) -> list[str]:
        """Lines for a terminal: the leader, then one per watcher."""
        if self.error is not None:
            return [f"leader: unknown ({self.error})"]
        if not self.holder:
            return [f"leader: none (Lease {self.lease} is free: no watchers run)"]
        age = _age(self.renew_time, now)
        renewed = f"renewed {age:.0f}s ago" if age is not None else "never renewed"
        state = "" if self.alive(now) else ", EXPIRED: no replica is watching"
        lines = [f"leader: {self.holder} (Lease {self.lease}, {renewed}{state})"]
        if self.report is None or self.report.identity != self.holder:
            lines.append("  watchers: not reported by this leader yet")
            return lines
        for name, health in sorted(self.report.watchers.items()):
            lines.append(f"  {name} watcher: {health.describe(now)}")
        return lines


def rfc3339(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def annotation(identity: str, watchers: Mapping[str, WatcherHealth]) -> dict[str, str]:
    """The annotation the leader writes on its Lease."""
    report = HealthReport(identity=identity, reported_at=rfc3339(time.time()) or "", watchers=dict(watchers))
    return {keys.ANNOTATION_WATCHER_HEALTH: report.model_dump_json()}


def leadership_of(lease: Json, ref: str) -> Leadership:
    spec = lease.get("spec") or {}
    raw = ((lease.get("metadata") or {}).get("annotations") or {}).get(keys.ANNOTATION_WATCHER_HEALTH)
    report = None
    if isinstance(raw, str):
        try:
            report = HealthReport.model_validate_json(raw)
        except ValidationError:
            report = None  # written by another version, or by hand: the leader line still holds
    return Leadership(
        lease=ref,
        holder=spec.get("holderIdentity") or "",
        renew_time=spec.get("renewTime"),
        lease_duration_seconds=spec.get("leaseDurationSeconds"),
        transitions=spec.get("leaseTransitions"),
        report=report,
    )


async def read_leadership(kube: KubeClient, namespace: str, name: str) -> Leadership:
    """The Lease as the leader left it; a Leadership with `error` when it cannot be read."""
    ref = f"{namespace}/{name}"
    try:
        lease = await kube.request(
            "GET", api_path("leases", namespace=namespace, name=name, group=LEASE_GROUP)
        )
    except KubeNotFound:
        return Leadership(lease=ref, error=f"no Lease {ref}: is LEADER_ELECTION on?")
    except (KubeError, OSError) as error:
        return Leadership(lease=ref, error=f"cannot read Lease {ref}: {error}")
    return leadership_of(lease, ref)


def _age(stamp: str | None, now: float | None) -> float | None:
    if not stamp:
        return None
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    return max(0.0, (time.time() if now is None else now) - when)
