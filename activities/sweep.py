"""The orphan sweep's I/O: find what outages left behind, then heal it (docs/operations.md, "The sweep").

Orphans are what a placement leaves when it stops without releasing: a Slurm job
of this installation whose pods vanished while no worker ran (or whose placement
was terminated), and a pod with the bridge's finalizer and no open placement
(terminated by an operator, or by Temporal's history limit). `plan` decides, from
facts only (unit-tested); `scan` gathers the facts, `heal` acts. Per case:

- **adopt**: a live job whose placement is not running and whose pods all still
  exist, claimed by its placement id and neither finished nor being deleted: a
  new run of the same workflow id and generation is started with `recovery=True`,
  and takes the job over (for a bound pod, binding accepts the existing binding);
- **cancel**: a live job whose placement is not running and that none of its
  pods still needs (gone, or no longer claimed by it, finished, or being deleted
  while unbound or for longer than its grace period plus DELETION_SLACK);
- **drop the finalizer**: of a pod being deleted whose placement is not running
  and whose job is gone, ended (or cancelled just before, by this sweep) or was
  never submitted.

Never touched: jobs the bridge did not make (no placement id as comment, with a
bridge admin_comment), jobs and pods of another installation (`installation_of`),
pods without the placement annotation (the bridge claims every pod it places with
it: such a pod is not this bridge's), pods of other schedulers (not listed) and
anything whose placement runs. Each action
reads again what it depends on right before acting, so a sweep that raced a
worker does nothing.

Cost of one sweep, whatever the number of orphans:

- Kubernetes: 1 list of the pods with `spec.schedulerName` = the bridge's;
- Temporal: 1 visibility query of the running placements (a page per 1,000), and
  1 `DescribeWorkflowExecution` per placement that has a pod with the finalizer or
  a live job and that the query did not show running (normally none: the query
  lags behind by a second or so);
- Slurm: **1 `GET /jobs/` listing** (counted in `listings`; ~8 KB per job in the
  whole Slurm, all users: the one listing the bridge makes outside a recovering
  submit), to find the live jobs of this installation that no pod references;
  `GET /jobs/state/` for the jobs labelled on pods whose placement is not running
  (normally none) and `GET /job/{id}` for those of them Slurm still knows.

Each action costs a describe, a `GET /job/{id}`, a pod read per pod, its write
(start, cancel or patch) and an Event per pod.
"""

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.kube import KubeActivities
from activities.kube_client import Json, KubeConflict, KubeError, KubeNotFound, api_path
from activities.kube_reader import KubeReader
from activities.slurm import is_live, job_event, placement_of
from activities.slurm_client import SlurmClient, SlurmNotFound
from bridge import grouping, keys
from bridge import search_attributes as sa
from bridge.models import (
    PLACEMENT_ID_PREFIX,
    Frozen,
    PlacementRequest,
    PodRef,
    admin_comment_pods,
    installation_of,
    workflow_id_of,
)
from bridge.pod_events import job_id_label, pod_event
from worker.pod_watcher import claim_of
from workflows.placement import PlacementWorkflow

# Temporal's activity logger: each line carries the workflow and activity ids.
log = activity.logger

WRONG_INSTALLATION = "WrongInstallation"
DESCRIBE_CONCURRENCY = 16
CAS_ATTEMPTS = 5


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


def job_facts(job: BaseModel | Mapping[str, Any], installation: str) -> JobFacts | None:
    """The job, if it is a placement's of this installation; None for any other."""
    info = job.model_dump(mode="json") if isinstance(job, BaseModel) else dict(job)
    placement_id = placement_of(info)
    if placement_id is None or _installation(placement_id) != installation:
        return None
    event = job_event(info)
    return JobFacts(
        job_id=event.job_id,
        placement_id=placement_id,
        pods=admin_comment_pods(info.get("admin_comment")) or [],
        live=is_live(event),
        summary=event.summary,
    )


def _installation(placement_id: str) -> str | None:
    try:
        return installation_of(placement_id)
    except ValueError:
        return None


# -- the activities ------------------------------------------------------------------


class SweepActivities:
    def __init__(
        self, kube: KubeActivities, slurm: SlurmClient, temporal: Client, *, installation: str
    ) -> None:
        self.kube = kube
        self.slurm = slurm
        self.temporal = temporal
        self.installation = installation
        # Counters for the benchmark and metrics: `GET /jobs/` listings, describes.
        self.listings = 0
        self.describes = 0

    def _check(self, request: SweepRequest) -> None:
        # A sweep only ever acts for the installation of the worker that runs it.
        if request.installation != self.installation:
            raise ApplicationError(
                f"a sweep of installation {request.installation!r} ran on a worker of "
                f"{self.installation!r}; each installation sweeps on its own task queue",
                type=WRONG_INSTALLATION,
                non_retryable=True,
            )

    # -- scan ---------------------------------------------------------------------

    @activity.defn(name="sweep_scan")
    async def scan(self, request: SweepRequest) -> SweepPlan:
        """Read the bridge's pods, the placements they and the jobs name, and this installation's jobs."""
        self._check(request)
        now = datetime.now(UTC)
        listed = await self.kube.kube.request(
            "GET", api_path("pods"), query={"fieldSelector": f"spec.schedulerName={request.scheduler_name}"}
        )
        pods: list[PodFacts] = []
        others = 0
        for pod in listed.get("items", []):
            facts = pod_facts(pod, request.installation, request.deletion_slack_seconds, now)
            if facts is not None:
                pods.append(facts)
            elif claim_installation(pod) not in (None, request.installation):
                others += 1

        placements = Placements(self, await self._visible_running(request.installation))
        await placements.ask(workflow_id_of(p.claim) for p in pods if p.claim and p.finalizer)

        # Jobs the pods of closed placements name: their state, then those Slurm still knows.
        wanted = {
            p.job_id
            for p in pods
            if p.claim and p.job_id is not None and not placements.known.get(workflow_id_of(p.claim), True)
        }
        jobs: dict[int, JobFacts | None] = {job_id: None for job_id in wanted}
        known = await self.slurm.job_states(wanted) if wanted else {}
        for job_id in known:
            try:
                jobs[job_id] = job_facts(await self.slurm.get_job(job_id), request.installation)
            except SlurmNotFound:
                jobs[job_id] = None

        # The one listing: live jobs of this installation that no pod references.
        self.listings += 1
        live = 0
        unreferenced: list[JobFacts] = []
        for info in (await self.slurm.list_jobs()).jobs:
            placement_id = placement_of(info)
            if placement_id is None or not is_live(job_event(info)):
                continue
            installation = _installation(placement_id)
            if installation != request.installation:
                others += installation is not None
                continue
            live += 1
            job = job_facts(info, request.installation)
            if job is not None and job.job_id not in jobs:
                unreferenced.append(job)
        await placements.ask(workflow_id_of(j.placement_id) for j in unreferenced)
        jobs.update({j.job_id: j for j in unreferenced})

        actions, skipped = plan(pods, jobs, placements.known)
        return SweepPlan(
            actions=actions, skipped=skipped, pods=len(pods), jobs=live, others=others, listings=1
        )

    async def _visible_running(self, installation: str) -> set[str]:
        """Workflow ids of this installation's running placements, as visibility shows them (may lag)."""
        prefix = f"{PLACEMENT_ID_PREFIX}{installation}/"
        query = f"{keys.PLACEMENT_TYPE_CLAUSE} AND ExecutionStatus = 'Running'"
        return {
            execution.id
            async for execution in self.temporal.list_workflows(query)
            if execution.id.startswith(prefix)
        }

    async def running(self, workflow_id: str) -> bool:
        """Whether the placement's latest run is running: Temporal's word, not visibility's."""
        self.describes += 1
        try:
            description = await self.temporal.get_workflow_handle(workflow_id).describe()
        except RPCError as error:
            if error.status == RPCStatusCode.NOT_FOUND:
                return False  # never existed, or closed longer ago than the namespace's retention
            raise
        return description.status == WorkflowExecutionStatus.RUNNING

    # -- heal -----------------------------------------------------------------------

    @activity.defn(name="sweep_heal")
    async def heal(self, given: HealInput) -> HealReport:
        """Carry out the actions, each after reading again what it depends on."""
        self._check(given.request)
        report = HealReport()
        steps: dict[ActionKind, Callable[[SweepRequest, SweepAction], Awaitable[str]]] = {
            "adopt": self._adopt,
            "cancel": self._cancel,
            "drop_finalizer": self._drop_finalizer,
        }
        done = {
            "adopt": report.adopted,
            "cancel": report.cancelled,
            "drop_finalizer": report.finalizers_dropped,
        }
        for action in given.actions:
            outcome = await steps[action.kind](given.request, action)
            if outcome:
                report.skipped.append(f"{action.describe()} — not done: {outcome}")
            else:
                done[action.kind].append(action.describe())
        return report

    async def _adopt(self, request: SweepRequest, action: SweepAction) -> str:
        """Start a new run of the placement that takes its job over; '' when done, else why not."""
        workflow_id = workflow_id_of(action.placement_id)
        if await self.running(workflow_id):
            return "its placement runs again"
        job = await self._job(action.job_id)
        if job is None or job.placement_id != action.placement_id or not job.live:
            return f"Slurm job {action.job_id} is no longer live"
        pods: list[Json] = []
        now = datetime.now(UTC)
        for ref in action.pods:
            pod = await self.kube.read_pod(ref)
            facts = pod_facts(pod, request.installation, request.deletion_slack_seconds, now) if pod else None
            if pod is None or facts is None or facts.claim != action.placement_id or not facts.alive:
                return f"pod {ref.key} is gone, finished, being deleted or claimed by another placement"
            pods.append(pod)
        group = await self._group(pods[0])
        generation = action.placement_id.rpartition("@")[2]
        refs = [pod_event(p).pod for p in pods]
        placement = PlacementRequest(
            group=group.name,
            namespace=refs[0].namespace,
            pods=refs,
            kind=group.kind,
            min_pods=len(refs),
            installation=request.installation,
            generation=generation,
            recovery=True,  # the job exists: the new run adopts it instead of submitting
            deletion_slack_seconds=request.deletion_slack_seconds,
            events=[pod_event(p) for p in pods],
        )
        first = refs[0]
        try:
            await self.temporal.start_workflow(
                PlacementWorkflow.run,
                placement,
                id=workflow_id,
                task_queue=activity.info().task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                search_attributes=TypedSearchAttributes(
                    [
                        SearchAttributePair(sa.POD_NAMESPACE, first.namespace),
                        SearchAttributePair(sa.POD_NAME, first.name),
                        SearchAttributePair(sa.POD_UID, first.uid),
                        SearchAttributePair(sa.PLACEMENT_GROUP, group.name),
                        SearchAttributePair(sa.PLACEMENT_PHASE, "Pending"),
                        SearchAttributePair(sa.SLURM_JOB_ID, job.job_id),
                    ]
                ),
                static_summary=f"place {group.kind} {group.name} with Slurm (adopted by the sweep)",
            )
        except WorkflowAlreadyStartedError:
            return "its placement was started meanwhile"
        message = (
            f"the sweep found Slurm job {job.job_id} live ({job.summary}) and placement "
            f"{action.placement_id} not running; a new run of the placement takes the job over"
        )
        self._log("adopted", action, message)
        await self._tell(refs, "SweepAdopted", message, warning=False)
        return ""

    async def _cancel(self, request: SweepRequest, action: SweepAction) -> str:
        assert action.job_id is not None
        if await self.running(workflow_id_of(action.placement_id)):
            return "its placement runs again"
        job = await self._job(action.job_id)
        if job is None or job.placement_id != action.placement_id:
            return f"Slurm job {action.job_id} is gone"
        if not job.live:
            return f"Slurm job {action.job_id} already ended ({job.summary})"
        told: list[PodRef] = []
        now = datetime.now(UTC)
        for key in job.pods:
            namespace, _, name = key.partition("/")
            pod = await self._pod_named(namespace, name)
            facts = pod_facts(pod, request.installation, request.deletion_slack_seconds, now) if pod else None
            if facts is None or facts.claim != action.placement_id:
                continue
            if facts.holds_job:
                return f"pod {key} needs the job again"
            told.append(facts.pod)
        try:
            await self.slurm.cancel_job(action.job_id)
        except SlurmNotFound:
            return f"Slurm job {action.job_id} is gone"
        message = (
            f"the sweep cancelled Slurm job {action.job_id} ({job.summary}): placement "
            f"{action.placement_id} is not running and none of the job's pods needs it"
        )
        self._log("cancelled", action, message)
        await self._tell(told, "SweepCancelledJob", message, warning=True)
        return ""

    async def _drop_finalizer(self, request: SweepRequest, action: SweepAction) -> str:
        [ref] = action.pods
        if await self.running(workflow_id_of(action.placement_id)):
            return "its placement runs again"
        if action.job_id is not None:
            job = await self._job(action.job_id)
            if job is not None and job.placement_id == action.placement_id and job.live:
                return f"Slurm job {action.job_id} is live ({job.summary})"
        what = (
            f"Slurm job {action.job_id} is over" if action.job_id is not None else "it never had a Slurm job"
        )
        message = (
            f"the sweep removed the finalizer {keys.FINALIZER}: placement {action.placement_id} "
            f"is not running and {what}"
        )
        for attempt in range(CAS_ATTEMPTS):
            pod = await self.kube.read_pod(ref)
            if pod is None:
                return "the pod is gone"
            meta = pod["metadata"]
            finalizers = list(meta.get("finalizers") or [])
            if keys.FINALIZER not in finalizers or not meta.get("deletionTimestamp"):
                return "the pod has no finalizer of the bridge, or is not being deleted"
            if claim_of(pod) != action.placement_id:
                return "the pod was claimed by another placement"
            if attempt == 0:
                # Before the write: once the finalizer is gone, so may be the pod.
                await self._tell([ref], "SweepRemovedFinalizer", message, warning=False)
            patch = {
                "metadata": {
                    "finalizers": [f for f in finalizers if f != keys.FINALIZER],
                    "resourceVersion": meta["resourceVersion"],
                }
            }
            try:
                await self.kube._patch_pod(ref, patch)
            except KubeNotFound:
                return "the pod is gone"
            except KubeConflict:
                continue  # edited meanwhile: read again
            self._log("dropped the finalizer of", action, message)
            return ""
        raise KubeConflict(409, "Conflict", f"pod {ref.key} kept changing while its finalizer was removed")

    # -- helpers ------------------------------------------------------------------

    async def _job(self, job_id: int | None) -> JobFacts | None:
        if job_id is None:
            return None
        try:
            return job_facts(await self.slurm.get_job(job_id), self.installation)
        except SlurmNotFound:
            return None

    async def _pod_named(self, namespace: str, name: str) -> Json | None:
        try:
            return await self.kube.kube.request("GET", api_path("pods", namespace=namespace, name=name))
        except KubeNotFound:
            return None

    async def _group(self, pod: Json) -> grouping.Group:
        """The pod's group, for the names the Temporal UI shows; the pod alone when it cannot be read."""
        try:
            return await grouping.resolve(KubeReader(self.kube.kube), pod)
        except (grouping.GroupError, PermissionError, KubeError) as error:
            meta = pod["metadata"]
            log.info("sweep: group of pod %s/%s not resolved (%s)", meta["namespace"], meta["name"], error)
            key = f"{meta['namespace']}/{meta['name']}"
            return grouping.Group(
                key=f"{key}/{meta['uid']}", kind="Pod", namespace=meta["namespace"], name=key, min_pods=1
            )

    async def _tell(self, pods: list[PodRef], reason: str, message: str, *, warning: bool) -> None:
        """An Event on each pod; best effort (the action is done, and the log says so too)."""
        for ref in pods:
            try:
                await self.kube._event(ref, reason, message, warning)
            except KubeError as error:
                log.warning("sweep: event %s on pod %s not recorded: %s", reason, ref.key, error)

    def _log(self, verb: str, action: SweepAction, message: str) -> None:
        pods = [p.key for p in action.pods]
        log.info(
            "sweep %s %s: %s",
            verb,
            f"Slurm job {action.job_id}"
            if action.kind == "cancel"
            else ", ".join(pods) or action.placement_id,
            message,
            extra={"job_id": action.job_id, "pods": pods},
        )


class Placements:
    """Whether placements run: visibility first (one query), a describe for those it does not show."""

    def __init__(self, sweep: SweepActivities, visible: set[str]) -> None:
        self.sweep = sweep
        self.visible = visible
        self.known: dict[str, bool] = {}

    async def ask(self, workflow_ids: Iterable[str]) -> None:
        unknown = {wid for wid in workflow_ids if wid not in self.known}
        self.known.update({wid: True for wid in unknown & self.visible})
        slots = asyncio.Semaphore(DESCRIBE_CONCURRENCY)

        async def describe(wid: str) -> None:
            async with slots:
                self.known[wid] = await self.sweep.running(wid)

        await asyncio.gather(*(describe(wid) for wid in sorted(unknown - self.visible)))


def claim_installation(pod: Json) -> str | None:
    """The installation a pod's claim names, if it is a well-formed claim."""
    claim = claim_of(pod)
    return _installation(claim) if claim is not None else None
