"""The orphan sweep's I/O: find what outages left behind, then heal it (docs/operations.md, "The sweep").

Orphans are what a placement leaves when it stops without releasing: a Slurm job
of this installation whose pods vanished while no worker ran (or whose placement
was terminated), and a pod with the bridge's finalizer and no open placement
(terminated by an operator, or by Temporal's history limit). `bridge.sweep.plan`
decides, from facts only (unit-tested); `scan` gathers the facts, `heal` acts
(an adoption starts the placement as the pod watcher does: clients/placements.py). Per case:

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

Its size (about 420 lines) is the scan and the three heal actions, each of which reads
again what it depends on; the decisions are bridge/sweep.py's.
"""

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.kube import KubeActivities
from activities.kube_reader import KubeReader
from bridge import grouping, keys
from bridge.models import (
    PLACEMENT_ID_PREFIX,
    PlacementRequest,
    PodRef,
    workflow_id_of,
)
from bridge.pod_events import claim_of, pod_event
from bridge.slurm_api import JobInfo
from bridge.slurm_jobs import het_offset, is_live, job_event_of, placement_of
from bridge.sweep import (
    ActionKind,
    HealInput,
    HealReport,
    JobFacts,
    PodFacts,
    SweepAction,
    SweepPlan,
    SweepRequest,
    claim_installation,
    job_facts,
    placement_installation,
    plan,
    pod_facts,
)
from clients.kube_client import Json, KubeConflict, KubeError, KubeNotFound, api_path
from clients.placements import start_placement
from clients.slurm_client import SlurmClient
from clients.slurm_errors import SlurmNotFound

# Temporal's activity logger: each line carries the workflow and activity ids.
log = activity.logger

WRONG_INSTALLATION = "WrongInstallation"
DESCRIBE_CONCURRENCY = 16
CAS_ATTEMPTS = 5


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
                jobs[job_id] = job_facts(await self.slurm.get_job_components(job_id), request.installation)
            except SlurmNotFound:
                jobs[job_id] = None

        # The one listing: live jobs of this installation that no pod references.
        self.listings += 1
        live = 0
        unreferenced: list[JobFacts] = []
        # A heterogeneous job is listed as its components: one job, by its leader's id.
        by_job: dict[int, list[JobInfo]] = {}
        for info in (await self.slurm.list_jobs()).jobs:
            offset = het_offset(info) or 0
            by_job.setdefault(int(info.job_id or 0) - offset, []).append(info)
        for components in by_job.values():
            placement_id = placement_of(min(components, key=lambda c: het_offset(c) or 0))
            if placement_id is None or not is_live(job_event_of(components)):
                continue
            installation = placement_installation(placement_id)
            if installation != request.installation:
                others += installation is not None
                continue
            live += 1
            job = job_facts(components, request.installation)
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
        try:
            await start_placement(
                self.temporal,
                workflow_id,
                placement,
                task_queue=activity.info().task_queue,
                summary=f"place {group.kind} {group.name} with Slurm (adopted by the sweep)",
                job_id=job.job_id,
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
            return job_facts(await self.slurm.get_job_components(job_id), self.installation)
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
