"""The orphan sweep's decisions: facts in, actions out (activities/sweep.py gathers and acts).

What crosses the sweep workflow (its request, the plan, the heal batches and the result),
and `plan`: which live jobs a new placement run adopts, which are cancelled, which pods'
finalizers are dropped, and which orphans are left alone and why (docs/operations.md,
"The sweep").
"""

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field

from bridge import keys
from bridge.models import Frozen, PodRef, admin_comment_pods, installation_of, workflow_id_of
from bridge.pod_events import Json, claim_of, job_id_label
from bridge.slurm_jobs import het_offset, is_live, job_event_of, placement_of

# -- what crosses the workflow -------------------------------------------------


class SweepRequest(Frozen):
    """What one sweep run looks after: the schedule's action input, shown in the Temporal UI."""

    installation: str
    scheduler_name: str
    # A bound pod being deleted keeps its job this long past its grace period (DELETION_SLACK).
    deletion_slack_seconds: float = 60.0


class PodFacts(Frozen):
    """One bridge pod as the scan saw it."""

    pod: PodRef
    claim: str | None  # placement id of this installation that claimed it; None: no (valid) claim
    finalizer: bool
    bound: bool
    terminal: bool  # Succeeded or Failed
    deleting: bool
    overdue: bool = False  # being deleted for longer than its grace period plus the deletion slack
    job_id: int | None = None  # its job-id label

    @property
    def alive(self) -> bool:
        return not self.terminal and not self.deleting

    @property
    def holds_job(self) -> bool:
        """Still needs its Slurm job: what a placement waits for before releasing it."""
        return not self.terminal and not (self.deleting and (not self.bound or self.overdue))


class JobFacts(Frozen):
    """A Slurm job of this installation's placements."""

    job_id: int
    placement_id: str  # the comment
    pods: list[str]  # the admin_comment's pod keys, in the job's order
    live: bool
    summary: str = ""


ActionKind = Literal["adopt", "cancel", "drop_finalizer"]


class SweepAction(Frozen):
    kind: ActionKind
    placement_id: str
    job_id: int | None = None
    pods: list[PodRef] = Field(default_factory=list)
    reason: str = ""

    def describe(self) -> str:
        pods = ", ".join(p.key for p in self.pods) or "no pod left"
        job = f"Slurm job {self.job_id}" if self.job_id is not None else "no Slurm job"
        verb = {"adopt": "adopt", "cancel": "cancel", "drop_finalizer": "drop the finalizer of"}[self.kind]
        target = job if self.kind == "cancel" else pods
        return f"{verb} {target} ({job}, {pods}; placement {self.placement_id}): {self.reason}"


class SweepPlan(Frozen):
    """What the scan found and what the sweep will do about it."""

    actions: list[SweepAction] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list)  # orphans left alone, and why
    pods: int = 0  # bridge pods of this installation (claimed, labelled or with the finalizer)
    jobs: int = 0  # live Slurm jobs of this installation
    others: int = 0  # pods and live jobs of other installations: never touched
    listings: int = 0  # `GET /jobs/` made by this scan


class HealInput(Frozen):
    request: SweepRequest
    actions: list[SweepAction]


class HealReport(Frozen):
    adopted: list[str] = Field(default_factory=list)
    cancelled: list[str] = Field(default_factory=list)
    finalizers_dropped: list[str] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list)


class SweepResult(BaseModel):
    """A sweep run's result, as the Temporal UI shows it."""

    adopted: int = 0
    cancelled: int = 0
    finalizers_dropped: int = 0
    skipped: int = 0
    pods: int = 0
    jobs: int = 0
    others: int = 0
    listings: int = 0
    done: list[str] = Field(default_factory=list)  # one line per action taken
    left_alone: list[str] = Field(default_factory=list)  # one line per orphan skipped

    def add(self, report: HealReport) -> None:
        self.adopted += len(report.adopted)
        self.cancelled += len(report.cancelled)
        self.finalizers_dropped += len(report.finalizers_dropped)
        self.skipped += len(report.skipped)
        self.done += [*report.adopted, *report.cancelled, *report.finalizers_dropped]
        self.left_alone += report.skipped


# -- the decisions ---------------------------------------------------------------


def plan(
    pods: Iterable[PodFacts], jobs: Mapping[int, JobFacts | None], placements: Mapping[str, bool]
) -> tuple[list[SweepAction], list[str]]:
    """The actions for these facts, and the orphans left alone (with why).

    `jobs`: the jobs read, by id; None for an id Slurm no longer knows or whose
    job is no placement's of this installation (an id not in `jobs` was not
    read: nothing is decided on it). `placements`: workflow id → running; a
    placement not asked about counts as running. Jobs come first (adopt,
    cancel), then finalizers, so a finalizer is dropped after its job's cancel.
    """
    pods = list(pods)
    by_key = {p.pod.key: p for p in pods}
    actions: list[SweepAction] = []
    skipped: list[str] = []
    cancelled: set[int] = set()

    def running(placement_id: str) -> bool:
        return placements.get(workflow_id_of(placement_id), True)

    for job in sorted((j for j in jobs.values() if j is not None), key=lambda j: j.job_id):
        if not job.live or running(job.placement_id):
            continue
        claimed = [p for key in job.pods if (p := by_key.get(key)) and p.claim == job.placement_id]
        holders = [p for p in claimed if p.holds_job]
        if not holders:
            cancelled.add(job.job_id)
            actions.append(
                SweepAction(
                    kind="cancel",
                    placement_id=job.placement_id,
                    job_id=job.job_id,
                    pods=[p.pod for p in claimed],
                    reason="its placement is not running and none of its pods needs it",
                )
            )
        elif len(holders) == len(job.pods) and all(p.alive for p in holders):
            actions.append(
                SweepAction(
                    kind="adopt",
                    placement_id=job.placement_id,
                    job_id=job.job_id,
                    pods=[p.pod for p in holders],
                    reason=f"Slurm job {job.job_id} is live ({job.summary}) and its placement is not running",
                )
            )
        else:
            # A new run re-submits for exactly the job's pods, all placeable (docs/operations.md).
            waiting = ", ".join(f"{p.pod.key}{' (deleting)' if p.deleting else ''}" for p in holders)
            skipped.append(
                f"Slurm job {job.job_id} ({job.placement_id}): placement not running, but only some of "
                f"its pods can be placed ({waiting} of {len(job.pods)}); left for a later sweep"
            )

    for pod in pods:
        if not pod.finalizer:
            continue
        if pod.claim is None:
            if pod.deleting:
                skipped.append(f"pod {pod.pod.key}: no placement annotation (not this bridge's); left alone")
            continue
        if running(pod.claim):
            continue
        if pod.job_id is not None and pod.job_id not in jobs:
            skipped.append(f"pod {pod.pod.key}: Slurm job {pod.job_id} was not read; left alone")
            continue
        held = jobs.get(pod.job_id) if pod.job_id is not None else None
        if held is not None and held.placement_id == pod.claim and held.live and held.job_id not in cancelled:
            continue  # the job is adopted, or was left alone above
        what = f"Slurm job {pod.job_id} is over" if pod.job_id is not None else "it never had a Slurm job"
        if not pod.deleting:
            skipped.append(
                f"pod {pod.pod.key}: placement {pod.claim} not running and {what}, but the pod is not "
                "being deleted; left alone (`slurm-bridge retry` places a pending pod again)"
            )
            continue
        actions.append(
            SweepAction(
                kind="drop_finalizer",
                placement_id=pod.claim,
                job_id=pod.job_id,
                pods=[pod.pod],
                reason=f"being deleted, its placement is not running and {what}",
            )
        )
    return actions, skipped


def overdue(pod: Json, slack_seconds: float, now: datetime) -> bool:
    """Deleted longer ago than its grace period plus the slack (deletionTimestamp = request + grace)."""
    stamp = (pod.get("metadata") or {}).get("deletionTimestamp")
    if not stamp:
        return False
    deadline = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    return now >= deadline + timedelta(seconds=slack_seconds)


def pod_facts(pod: Json, installation: str, slack_seconds: float, now: datetime) -> PodFacts | None:
    """The facts of a pod the bridge is involved with; None for any other (or another installation's)."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    claim = claim_of(pod)
    if claim is not None and installation_of(claim) != installation:
        return None
    finalizer = keys.FINALIZER in (meta.get("finalizers") or [])
    job_id = job_id_label(pod)
    if claim is None and not finalizer and job_id is None:
        return None
    return PodFacts(
        pod=PodRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"]),
        claim=claim,
        finalizer=finalizer,
        bound=bool(spec.get("nodeName")),
        terminal=status.get("phase") in ("Succeeded", "Failed"),
        deleting=bool(meta.get("deletionTimestamp")),
        overdue=overdue(pod, slack_seconds, now),
        job_id=job_id,
    )


def job_facts(
    job: BaseModel | Mapping[str, Any] | Sequence[BaseModel | Mapping[str, Any]], installation: str
) -> JobFacts | None:
    """The job, if it is a placement's of this installation; None for any other.

    A heterogeneous job is given as all its components, leader first: its pods are every
    component's (each component's admin_comment lists its own), in component order.
    """
    given = list(job) if isinstance(job, Sequence) else [job]
    infos = [c.model_dump(mode="json") if isinstance(c, BaseModel) else dict(c) for c in given]
    infos.sort(key=lambda info: het_offset(info) or 0)
    placement_id = placement_of(infos[0])
    if placement_id is None or placement_installation(placement_id) != installation:
        return None
    event = job_event_of(infos)
    return JobFacts(
        job_id=event.job_id,
        placement_id=placement_id,
        pods=[key for info in infos for key in admin_comment_pods(info.get("admin_comment")) or []],
        live=is_live(event),
        summary=event.summary,
    )


def placement_installation(placement_id: str) -> str | None:
    try:
        return installation_of(placement_id)
    except ValueError:
        return None


def claim_installation(pod: Json) -> str | None:
    """The installation a pod's claim names, if it is a well-formed claim."""
    claim = claim_of(pod)
    return placement_installation(claim) if claim is not None else None
