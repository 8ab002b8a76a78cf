"""PlacementWorkflow: one durable placement per pod group, start to finish.

Reads top to bottom like the flow it implements:

    prepare_and_submit ─► [wait: RUNNING] ─► bind ─► [wait: pods done | job ended] ─► release

Three activities, two signals (the job runs, the pods finish), one search
attribute upsert (bound) and one safety re-check timer: docs/performance.md
spells out the budget. Waiting costs nothing: the pod watcher and the central
job watcher signal changes, and the workflow sleeps on `wait_condition`.
Signals are hints, never verdicts: `bind` reads the job afresh before binding,
and an ended job is read again before its pods are removed.

`bind` runs as a local activity: it starts in the workflow task the job's signal
wakes, with no round trip through the server, and the workflow goes on in that
task (one workflow task and five history events less per placement than an
ordinary activity).

A placement lives as long as its pods (months, for an inference server): its
re-check backs off, and it continues-as-new with its state before its history
grows large, keeping its workflow id and placement id.

One workflow type, named like this class, with no patches: a change to the
commands it issues follows docs/architecture.md, "Workflow versioning".

Its size (about 870 lines) is the flow's: one class a reader follows from submission to
release, with the member bookkeeping in workflows/members.py; splitting the waits from the
steps they guard would scatter the order that replay depends on.
"""

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, TypeGuard, TypeVar, cast

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

with workflow.unsafe.imports_passed_through():
    from activities.placement import PlacementActivities
    from bridge import keys
    from bridge import search_attributes as sa
    from bridge.failures import SLURM_BUSY, SLURM_UNAVAILABLE
    from bridge.models import (
        BindInput,
        BindResult,
        CheckJobInput,
        JobEvent,
        Phase,
        PhaseChange,
        PlacementCarry,
        PlacementRequest,
        PlacementState,
        PodEvent,
        PodRef,
        PrepareInput,
        ReleaseInput,
        ReportPendingInput,
        SlurmUnavailableInput,
        TellPodsInput,
        UpdatePendingJobInput,
        end_reason,
    )
    from bridge.slurm_jobs import is_live
    from workflows.members import GroupMembers, PlacementFailed

WORKFLOW_TYPE = keys.PLACEMENT_WORKFLOW_TYPE
In = TypeVar("In")  # a step's one input (a frozen model of bridge/models.py)
Out = TypeVar("Out")
DEFAULT_RECHECK = timedelta(minutes=10)
RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30))
ATTEMPT_TIMEOUT = timedelta(seconds=60)
# The submission's attempt may list every job Slurm holds (a recovery): 40 s at 30,000 jobs on
# the benchmark machine, longer on a busy slurmrestd; cut off at 60 s, it was asked again and
# again and never got its answer. Its heartbeats still tell a dead worker within seconds.
SUBMISSION_ATTEMPT_TIMEOUT = timedelta(minutes=5)
# A step tried as a local activity gets one attempt, shorter than the workflow task timeout
# (10 s) so that the task never needs heartbeating; then it is an ordinary activity.
LOCAL_ATTEMPT_TIMEOUT = timedelta(seconds=8)
ONE_TRY = RetryPolicy(maximum_attempts=1)
# How long one step may keep failing before the user is told (PlacementRequest.step_bound_seconds,
# 5 minutes by default); then it is tried again after a pause.
STUCK_PAUSE = timedelta(minutes=1)
EVICTION_RETRY = timedelta(seconds=10)
LEAVING_POLL = timedelta(seconds=1)
# The safety re-check backs off while nothing changes: a bound pod costs a few actions a day.
MAX_RECHECK = timedelta(hours=6)
# Phases in which a job_changed signal is the latest word on the job for `status`; in
# Cleaning, Done and Failed the step that ends the placement says how the job ended.
FOLLOWING_PHASES = frozenset({"Submitted", "Pending", "Running", "Bound"})
# Slurm away (a step failed as SlurmUnavailable): the placement waits for the Slurm-health
# gate's `slurm_available` signal. The leader's waker signals again a few seconds after a
# recovery and looks for waiting placements every 30 s, so this timer is a last resort for a
# waker that is gone; each firing while Slurm is still away costs two actions, so it is long.
WAITING_FOR_SLURM = "WaitingForSlurm"  # its PlacementPhase while it waits
SLURM_WAIT_FIRST = timedelta(minutes=5)
SLURM_WAIT_MAX = timedelta(minutes=30)
# Slurm takes no new job (a submission refused as SlurmBusy: its job queue is full): submit again
# after a pause that backs off (room comes as jobs end and MinJobAge, 5 minutes by default, passes).
SLURM_BUSY_FIRST = timedelta(seconds=15)
SLURM_BUSY_MAX = timedelta(minutes=5)


# Run outside the SDK's sandbox in production: a sandboxed run re-executes this module for
# every placement, which cost ~50 KiB of memory per cached placement and CPU on every start
# (docs/performance.md). The sandbox only guards against non-deterministic calls; the test
# suite runs this workflow inside it (Bridge.sandbox_every_workflow), and replay against the
# golden histories guards determinism as before.
@workflow.defn(name=WORKFLOW_TYPE, sandboxed=False)
class PlacementWorkflow(GroupMembers):
    """The placement of one pod group, from its first pod to its release."""

    @workflow.init
    def __init__(self, request: PlacementRequest) -> None:
        # State lives here, not in run(): signals delivered with the start are applied before run().
        self.request = request
        self.state = PlacementState(group=request.group, pods=[p.key for p in request.pods])
        # The group's pods: those of the request, plus members that join by signal until submission.
        self.members: dict[str, PodRef] = {pod.uid: pod for pod in request.pods}
        self.submitted = False
        self.translated_annotations: dict[str, str] = {}  # uid → annotations the job was built from
        self.pods: dict[str, PodEvent] = {}
        self.jobs: dict[int, JobEvent] = {}
        self.recheck = DEFAULT_RECHECK
        self._changes = 0
        self.newcomers: dict[str, PodRef] = {}  # pods that joined after submission: the next generation
        self._told_newcomers: set[str] = set()
        self.slurm_nodes: list[str] = []
        self._recheck_interval = DEFAULT_RECHECK
        self._recheck_task: asyncio.Task[None] | None = None
        self._recheck_due = False
        self._deadline_task: asyncio.Task[None] | None = None
        self._deleting_since: datetime | None = None
        self._leaving_since: datetime | None = None  # first seen pods of an ended job on our nodes
        self._leaving_bound = timedelta(0)
        self._nodes_changed = False  # the job's excluded nodes may no longer fit the node rules
        self._slurm_away = False  # a step waits for Slurm (the gate's signal)
        self._slurm_back = False
        self._slurm_wait = SLURM_WAIT_FIRST
        self._phase_before_slurm_away: str | None = None
        self._slurm_busy_wait: timedelta | None = None  # while Slurm takes no new job: the next pause
        for event in request.events:
            self._apply_pod(event)
        if request.carry is not None:
            self._restore(request.carry)

    # -- messages ------------------------------------------------------------

    @workflow.signal
    def pod_changed(self, event: PodEvent) -> None:
        self._apply_pod(event)
        self._changes += 1

    @workflow.signal
    def job_changed(self, event: JobEvent) -> None:
        self.jobs[event.job_id] = event
        if event.job_id == self.state.job_id and self.state.phase in FOLLOWING_PHASES:
            # What `status` shows: the step that submitted no longer reads the job, so the
            # watcher's word is the first one. Query state only: no command depends on it.
            self.state.job_state = event.summary
        self._changes += 1

    @workflow.signal
    def nodes_changed(self) -> None:
        """The bridge's nodes changed: an unschedulable placement looks again, a pending one updates."""
        self._nodes_changed = True
        self._changes += 1

    @workflow.signal
    def slurm_available(self) -> None:
        """The Slurm-health gate saw Slurm answer again: a step waiting for it runs again now."""
        self._slurm_back = True

    @workflow.signal
    def set_recheck_interval(self, seconds: float) -> None:
        """Operators (and tests) may shorten the safety re-check."""
        self.recheck = self._recheck_interval = timedelta(seconds=max(seconds, 1.0))
        if self._recheck_task is not None:
            self._recheck_task.cancel()  # the next wait starts a timer with the new interval
            self._recheck_task = None
        self._changes += 1

    @workflow.query
    def current_state(self) -> PlacementState:
        return self.state

    def _apply_pod(self, event: PodEvent) -> None:
        if event.pod.namespace != self.request.namespace:
            return  # a placement only ever takes pods of its own namespace
        event = self._merge(event)
        alive = not event.terminal and not event.deleting
        if not self.submitted and alive:
            self.members.setdefault(event.pod.uid, event.pod)
            self.state.pods = [p.key for p in self.members.values()]
        elif self.submitted and event.pod.uid not in self.members:
            if alive:
                self.newcomers[event.pod.uid] = event.pod
            else:
                self.newcomers.pop(event.pod.uid, None)

    # -- the placement -------------------------------------------------------

    @workflow.run
    async def run(self, request: PlacementRequest) -> PlacementState:
        try:
            # A run continued before its job was submitted (no node fitted for long) prepares again.
            if (request.carry is None or not self.submitted) and not await self._prepare():
                return self.state
            await self._follow()
        except PlacementFailed as failure:
            await self._fail(str(failure), failure.reason)
        except ActivityError as error:
            cause = error.cause
            if isinstance(cause, ApplicationError) and cause.non_retryable:
                await self._fail(cause.message, cause.type or "PlacementFailed")
            raise
        except asyncio.CancelledError:
            # An operator cancelled the placement: release Slurm and the pods, then stop.
            live = self._job_live()
            await self._give_back(
                "PlacementCancelled", "placement cancelled by an operator", cancel_job=True, warning=True
            )
            self._note_job_end("placement cancelled", cancelled_here=live)
            self._set_phase("Failed", "placement cancelled by an operator")
            raise
        await self._next_generation()
        return self.state

    def placement_id(self) -> str:
        generation = self.request.generation or self.request.pods[0].uid
        return f"{workflow.info().workflow_id}@{generation}"

    async def _prepare(self) -> bool:
        """Collect the group, submit its job; False when there is nothing to place."""
        if len(self.members) < self.request.min_pods:
            self._set_phase(
                "Translating", f"waiting for {self.request.min_pods} pods of {self.request.group}"
            )
            # Also stop waiting when every pod that joined is gone again.
            await workflow.wait_condition(
                lambda: len(self._live_members()) >= self.request.min_pods or not self._live_members()
            )
        live = {p.uid: p for p in self._live_members()}
        if live:
            self.members = live
        # else: no pod left to place, but an earlier run (a reset, a retry) may have claimed them
        # and submitted. The step still runs: it finds them finished or gone, cancels the jobs of
        # the placement when told it recovers, and drops the finalizers. Decided without the run
        # id: an offline replay of a reset run sees the first run's id (tests/histories).
        info = workflow.info()
        # Not the first run of this placement (a reset, or a new generation): a job may exist already.
        recovery = self.request.recovery or info.run_id != info.first_execution_run_id
        # A run continued while no node fitted has told the pods already, and says so.
        reported = self.state.history[-1].detail if self.state.phase == "Unschedulable" else ""
        while True:
            seen = self._changes
            prepared = await self._step(
                PlacementActivities.prepare_and_submit,
                PrepareInput(
                    request=self._members_request(),
                    placement_id=self.placement_id(),
                    since=int(info.start_time.timestamp()),
                    recovery=recovery,
                    reported=reported,
                ),
                summary=f"claim pods, translate, submit to Slurm ({len(self.members)} pods)",
                attempt_timeout=SUBMISSION_ATTEMPT_TIMEOUT,
            )
            if prepared.submitted or not prepared.unschedulable:
                break
            # No node passes the pods' node rules: they keep their claim and wait for nodes to change.
            if prepared.unschedulable != reported:
                if not reported:
                    workflow.upsert_search_attributes([sa.PLACEMENT_PHASE.value_set("Unschedulable")])
                reported = prepared.unschedulable
                self._set_phase("Unschedulable", reported)
            await self._continue_as_new_if_long()
            await self._wait(seen)
            self._recheck_due = False
            if self._live_members() != self._pods():
                self._set_phase("Done", "a pod of the group went away while no node could take it")
                await self._give_back("PlacementAbandoned", "a pod of the group was deleted before placement")
                return False
        if not prepared.submitted:
            self._set_phase("Done", f"nothing to place: {prepared.detail}")
            return False
        self.submitted = True
        self.members = {p.uid: p for p in prepared.pods}
        self.state.pods = [p.key for p in prepared.pods]
        self.state.job_id = prepared.job_id
        if prepared.components > 1:  # query state only: no command depends on it
            self.state.job_components = [prepared.job_id + i for i in range(prepared.components)]
        self.translated_annotations = dict(prepared.annotations)
        if prepared.job is not None:
            self._note_job(prepared.job)
        verb = "submitted" if prepared.created else "adopted"
        self._set_phase("Submitted", f"Slurm job {prepared.job_id} {verb} in partition {prepared.partition}")
        return True

    async def _follow(self) -> None:
        """From a submitted job to the end: bind when it runs, release when either side ends."""
        job_id = self._job_id()
        if self.state.phase != "Bound" and await self._wait_and_bind(job_id) is None:
            await self._pods_done(job_id)
            return
        ended = await self._wait_for_end(job_id)
        if ended is None:
            await self._pods_done(job_id)
        else:
            await self._job_done(ended)

    # -- waiting for the allocation --------------------------------------------

    async def _wait_and_bind(self, job_id: int) -> BindResult | None:
        """The binding, or None when the pods finished first."""
        if self.state.phase not in ("Pending",):
            self._set_phase("Pending", f"waiting for Slurm to start job {job_id}")
        while True:
            seen = self._changes  # sampled before acting: changes during activities are not lost
            if self._pods_finished():
                return None
            job = await self._current_job(job_id, confirm_end=False)
            if job is not None and job.running:
                result: BindResult = await self._step(
                    PlacementActivities.bind,
                    BindInput(
                        pods=self._pods(),
                        job_id=job_id,
                        force=self._waited_for_leaving_pods(),
                        placement_id=self.placement_id(),
                    ),
                    summary=f"bind to the nodes of Slurm job {job_id}",
                    local=True,
                )
                self._note_job(result.job)
                if result.nodes:
                    self._bound(result)
                    return result
                if result.waiting_for:
                    await self._wait_for_leaving_pods(job_id, result)
                    continue
                if result.job.running:
                    raise PlacementFailed(
                        f"Slurm job {job_id} was allocated {len(result.job.nodes)} nodes "
                        f"for {len(self._pods())} pods",
                        "AllocationTooSmall",
                    )
                job = result.job
            if job is not None and not is_live(job):
                raise PlacementFailed(
                    f"Slurm job {job_id} ended before it started ({job.summary}); the pod was not placed",
                    "SlurmJobEnded",
                )
            await self._follow_annotations(job_id, pending=True)
            await self._tell_newcomers(job_id)
            if job is not None and job.pending and job.reason not in ("", "None", self.state.pending_reason):
                self.state.pending_reason = job.reason
                await self._step(
                    PlacementActivities.report_pending,
                    ReportPendingInput(pods=self._pods(), job_id=job_id, reason=job.reason),
                    summary=f"pending: {job.reason}",
                )
                # Waiting with a reason is worth finding: job id and phase become searchable.
                workflow.upsert_search_attributes(
                    [sa.PLACEMENT_PHASE.value_set("Pending"), sa.SLURM_JOB_ID.value_set(job_id)]
                )
            workflow.set_current_details(f"Slurm job {job_id}: {job.summary if job else 'submitted'}")
            await self._continue_as_new_if_long()
            await self._wait(seen)

    async def _wait_for_leaving_pods(self, job_id: int, result: BindResult) -> None:
        """Pods of an ended bridge job still stop on our nodes: no overlap, for a bounded time."""
        if self._leaving_since is None:
            self._leaving_since = workflow.now()
            self._leaving_bound = timedelta(
                seconds=result.grace_seconds + self.request.deletion_slack_seconds
            )
            await self._step(
                PlacementActivities.report_pending,
                ReportPendingInput(
                    pods=self._pods(),
                    job_id=job_id,
                    reason="WaitingForNode",
                    message=f"Slurm job {job_id} runs; waiting for {', '.join(result.waiting_for)} of an "
                    "ended job to stop on the same node "
                    f"(at most {self._leaving_bound.total_seconds():.0f} s)",
                ),
                summary=f"wait for {len(result.waiting_for)} pods to leave",
            )
        await workflow.sleep(LEAVING_POLL, summary="pods of an ended job still stopping")

    def _waited_for_leaving_pods(self) -> bool:
        since = self._leaving_since
        return since is not None and workflow.now() - since >= self._leaving_bound

    def _bound(self, result: BindResult) -> None:
        self.slurm_nodes = result.slurm_nodes
        self.state.nodes = result.slurm_nodes
        self.state.kube_nodes = result.nodes
        self.state.claims = result.claims
        self.state.pending_reason = ""
        self._set_phase("Bound", f"Slurm job {result.job.job_id} on {', '.join(result.slurm_nodes)}")
        # The one upsert of a placement: what an operator searches for once pods run.
        workflow.upsert_search_attributes(
            [
                sa.PLACEMENT_PHASE.value_set("Bound"),
                sa.SLURM_JOB_ID.value_set(result.job.job_id),
                sa.SLURM_NODES.value_set(result.slurm_nodes),
            ]
        )
        self._record_bind_latency()
        self._recheck_interval = self.recheck  # a new phase: start the back-off again

    # -- waiting for the end ---------------------------------------------------

    async def _wait_for_end(self, job_id: int) -> JobEvent | None:
        """The confirmed ended job, or None when the pods finished (or were given up on) first."""
        while True:
            seen = self._changes
            if self._pods_finished():
                return None
            job = await self._current_job(job_id, confirm_end=True)
            if job is not None and not job.running:
                return job
            if self._stuck_terminating():
                await self._step(
                    PlacementActivities.tell_pods,
                    TellPodsInput(
                        pods=self._pods(),
                        reason="SlurmJobReleased",
                        message="the pod did not stop within its grace period plus "
                        f"{self.request.deletion_slack_seconds:.0f} s "
                        f"(its node may be gone); Slurm job {job_id} is released, although a process may "
                        "still run on the node",
                        warning=True,
                    ),
                    summary="give up on a pod stuck terminating",
                )
                return None
            await self._follow_annotations(job_id, pending=False)
            await self._tell_newcomers(job_id)
            workflow.set_current_details(f"Slurm job {job_id} running; pods bound")
            await self._continue_as_new_if_long()
            await self._wait(seen, self._deletion_deadline())

    async def _current_job(self, job_id: int, *, confirm_end: bool) -> JobEvent | None:
        """The latest word on the job: a due re-check asks Slurm, and so does a hint that it ended."""
        job = self.jobs.get(job_id)
        ended_hint = job is not None and (not job.running if confirm_end else not is_live(job))
        if self._recheck_due or ended_hint:
            was = job
            job = await self._step(
                PlacementActivities.check_job,
                CheckJobInput(job_id=job_id),
                summary=f"read Slurm job {job_id}",
            )
            self._note_job(job)
            if self._recheck_due:
                self._recheck_due = False
                if was == job:  # nothing new: look less often
                    self._recheck_interval = min(self._recheck_interval * 2, MAX_RECHECK)
        return job

    def _stuck_terminating(self) -> bool:
        deadline = self._deletion_deadline()
        return deadline is not None and deadline <= timedelta(0)

    def _deletion_deadline(self) -> timedelta | None:
        """Time left before a bound pod being deleted is given up on; None when none is."""
        graces = [
            e.deletion_grace_seconds
            for uid, e in self.pods.items()
            if uid in self.members and e.deleting and not e.terminal
        ]
        if not graces:
            self._deleting_since = None
            return None
        if self._deleting_since is None:
            self._deleting_since = workflow.now()
        allowed = timedelta(seconds=max(graces) + self.request.deletion_slack_seconds)
        return allowed - (workflow.now() - self._deleting_since)

    # -- annotations and newcomers ---------------------------------------------

    async def _follow_annotations(self, job_id: int, *, pending: bool) -> None:
        nodes_changed, self._nodes_changed = self._nodes_changed, False
        if not (self._annotations_changed() or (pending and nodes_changed)):
            return
        if pending:
            annotations = await self._step(
                PlacementActivities.update_pending_job,
                UpdatePendingJobInput(request=self._members_request(), job_id=job_id),
                summary=f"update pending job {job_id}",
            )
            self.translated_annotations.update(annotations)
            # What the pods say now counts as handled, even where the read raced a newer change.
            self.translated_annotations.update(self._current_annotations())
            return
        self.translated_annotations = self._current_annotations()
        await self._step(
            PlacementActivities.tell_pods,
            TellPodsInput(
                pods=self._pods(),
                reason="SlurmJobAlreadyAllocated",
                message=f"Slurm job {job_id} is already running: changed {keys.SLURMJOB_PREFIX}* "
                "annotations only apply to a job that is still pending",
                warning=True,
            ),
            summary="annotations changed after allocation",
        )

    async def _tell_newcomers(self, job_id: int) -> None:
        untold = [ref for uid, ref in self.newcomers.items() if uid not in self._told_newcomers]
        if not untold:
            return
        self._told_newcomers.update(ref.uid for ref in untold)
        await self._step(
            PlacementActivities.tell_pods,
            TellPodsInput(
                pods=untold,
                reason="WaitingForNextGeneration",
                message=f"the group's Slurm job {job_id} was submitted before this pod joined; it will be "
                "placed with the group's next job when this one ends",
                warning=False,
            ),
            summary=f"tell {len(untold)} late pods",
        )

    async def _next_generation(self) -> None:
        """Pods that joined too late are the next generation: same workflow id, a new placement id."""
        late = [
            ref
            for uid, ref in self.newcomers.items()
            if not ((e := self.pods.get(uid)) and (e.terminal or e.deleting))
        ]
        if not late:
            return
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(
            self.request.model_copy(
                update={
                    "pods": late,
                    "generation": late[0].uid,
                    "events": [self.pods[ref.uid] for ref in late if ref.uid in self.pods],
                    "carry": None,
                    "recovery": True,
                }
            )
        )

    # -- long lives ----------------------------------------------------------------

    async def _continue_as_new_if_long(self) -> None:
        info = workflow.info()
        too_long = info.get_current_history_length() > self.request.history_events_limit
        if not (too_long or info.is_continue_as_new_suggested()):
            return
        await workflow.wait_condition(workflow.all_handlers_finished)
        carry = PlacementCarry(
            state=self.state,
            members=self._pods(),
            pods=list(self.pods.values()),
            submitted=self.submitted,
            # None while no node fitted: nothing was submitted yet.
            job=self.jobs.get(self.state.job_id) if self.state.job_id is not None else None,
            translated_annotations=self.translated_annotations,
            recheck_seconds=self._recheck_interval.total_seconds(),
            slurm_nodes=self.slurm_nodes,
            newcomers=list(self.newcomers.values()),
        )
        # Same workflow id, same generation: the job's comment still names this placement.
        workflow.continue_as_new(
            self.request.model_copy(
                update={"carry": carry, "events": [], "generation": self.placement_id().rsplit("@", 1)[1]}
            )
        )

    def _restore(self, carry: PlacementCarry) -> None:
        self.state = carry.state
        self.members = {p.uid: p for p in carry.members}
        self.submitted = carry.submitted
        self.pods = {e.pod.uid: e for e in carry.pods}
        if carry.job is not None:
            self.jobs[carry.job.job_id] = carry.job
        self.translated_annotations = dict(carry.translated_annotations)
        self._recheck_interval = timedelta(seconds=carry.recheck_seconds)
        self.slurm_nodes = list(carry.slurm_nodes)
        self.newcomers = {p.uid: p for p in carry.newcomers}
        self._told_newcomers = set(self.newcomers)

    # -- waiting -------------------------------------------------------------------

    async def _wait(self, seen: int, deadline: timedelta | None = None) -> None:
        """Sleep until a message arrives, the re-check is due or the deadline passes: no timer per wake-up."""
        if self._recheck_task is None or self._recheck_task.done():
            self._recheck_task = asyncio.create_task(self._recheck_after(self._recheck_interval))
        if deadline is not None and (self._deadline_task is None or self._deadline_task.done()):
            self._deadline_task = asyncio.create_task(self._wake_after(deadline, "deletion deadline"))
        await workflow.wait_condition(lambda: self._changes != seen)

    async def _recheck_after(self, interval: timedelta) -> None:
        await workflow.sleep(interval, summary="safety re-check")
        self._recheck_due = True
        self._changes += 1

    async def _wake_after(self, delay: timedelta, summary: str) -> None:
        await workflow.sleep(max(delay, timedelta(seconds=1)), summary=summary)
        self._changes += 1

    # -- ending ----------------------------------------------------------------------

    async def _pods_done(self, job_id: int) -> None:
        self._set_phase("Cleaning", f"pods finished; cancelling Slurm job {job_id}")
        await self._give_back(
            "SlurmJobCancelled", f"the pods finished; Slurm job {job_id} cancelled", cancel_job=True
        )
        self.state.job_state = "CANCELLED (pods finished)"
        self._set_phase("Done", f"pods finished; Slurm job {job_id} cancelled")

    async def _job_done(self, job: JobEvent) -> None:
        """The job ended under running pods: evict them, saying why (PreemptedBySlurm, SlurmTimeLimit, …)."""
        reason, words = end_reason(job)
        message = f"Slurm job {job.job_id} {words} ({job.summary}); evicting the pod"
        self.state.job_state = job.summary
        self.state.end_reason = reason
        self._set_phase("Cleaning", message)
        # A PodDisruptionBudget may block the eviction: honoured for a while, then the pods are deleted.
        patience = timedelta(seconds=self.request.eviction_patience_seconds)
        started = workflow.now()
        # One component of a heterogeneous job may end alone (cancelled by its own id, its node
        # failed): the others would hold their nodes for pods that are gone, so the job goes too.
        rest = job.components > 1
        blocked: list[str] = await self._give_back(
            reason, message, remove_pods=True, warning=True, cancel_job=rest
        )
        while blocked:
            await workflow.sleep(EVICTION_RETRY, summary=f"a disruption budget blocks {', '.join(blocked)}")
            force = workflow.now() - started >= patience
            blocked = await self._give_back(
                reason, message, remove_pods=True, warning=True, force_delete=force, cancel_job=rest
            )
        self._set_phase("Done", f"Slurm job {job.job_id} {words} ({job.summary}); pods evicted")

    async def _fail(self, message: str, reason: str) -> None:
        """Tell the user on the pod, release everything, and fail the workflow for good."""
        self.state.failure = message
        self._set_phase("Failed", message)
        workflow.upsert_search_attributes([sa.PLACEMENT_PHASE.value_set("Failed")])
        live = self._job_live()
        # A job known gone is not cancelled: its id may name another job now (a wiped Slurm).
        await self._give_back(reason, message, cancel_job=not self._job_gone(), warning=True, condition=True)
        self._note_job_end("placement failed", cancelled_here=live)
        raise ApplicationError(message, type=reason, non_retryable=True)

    def _job_gone(self) -> bool:
        """Whether Slurm no longer knows the placement's job (or its id names another job)."""
        job = self.jobs.get(self.state.job_id) if self.state.job_id is not None else None
        return job is not None and job.gone

    def _job_live(self) -> bool:
        """Whether the placement holds a job that, as far as it knows, has not ended."""
        job_id = self.state.job_id
        job = self.jobs.get(job_id) if job_id is not None else None
        return job_id is not None and (job is None or is_live(job))

    def _note_job_end(self, why: str, *, cancelled_here: bool) -> None:
        """After the last release: `status` shows how the job ended, not the last state read before.

        `cancelled_here`: the job was live when the release began, so the release cancelled it
        (the job watcher's signal of that may arrive first, and must not make it look ended by
        itself). A job that had ended before shows the state it ended in. Query state only, after
        the last step: no command changes (a failed or cancelled run returns no result and never
        continues as new), so earlier histories replay as before.
        """
        job_id = self.state.job_id
        job = self.jobs.get(job_id) if job_id is not None else None
        if cancelled_here:
            self.state.job_state = f"CANCELLED ({why})"
        elif job is not None:
            self.state.job_state = job.summary

    async def _give_back(
        self,
        reason: str,
        message: str,
        *,
        cancel_job: bool = False,
        remove_pods: bool = False,
        warning: bool = False,
        condition: bool = False,
        force_delete: bool = False,
    ) -> list[str]:
        release = ReleaseInput(
            pods=self._pods(),
            reason=reason,
            message=message,
            job_id=self.state.job_id,
            cancel_job=cancel_job,
            remove_pods=remove_pods,
            warning=warning,
            condition=condition,
            force_delete=force_delete,
            claims=self.state.claims,  # what bind wrote ([]: no claim to look for)
        )
        # Never end while holding a job or a finalizer: this step is tried until it succeeds.
        blocked: list[str] = await self._step(
            PlacementActivities.release, release, summary=f"release: {reason}", must_finish=True
        )
        return blocked

    # -- helpers ---------------------------------------------------------------------

    def _members_request(self) -> PlacementRequest:
        """The request as an activity needs it: today's members, without the start's baggage."""
        return self.request.model_copy(update={"pods": self._pods(), "events": [], "carry": None})

    def _job_id(self) -> int:
        if self.state.job_id is None:
            raise PlacementFailed("the placement has no Slurm job", "NoJob")
        return self.state.job_id

    def _note_job(self, job: JobEvent) -> None:
        """Take an activity's read of the job, unless a signal told of a later stage meanwhile.

        An activity reads the job before it returns; a job_changed signal sent after that read
        may be handled first (a worker died and the task waited, or simply signals come first
        in an activation). The older read must not undo it: the job watcher will not say again
        what it said once, so the placement would wait for the safety re-check (10 minutes).
        """
        held = self.jobs.get(job.job_id)
        if held is not None and held.progress > job.progress:
            return
        self.jobs[job.job_id] = job
        self.state.job_state = job.summary

    def _set_phase(self, phase: Phase, detail: str) -> None:
        """Record the phase in the state query and the UI's details; search attributes change elsewhere."""
        self.state.phase = phase
        self.state.history.append(PhaseChange(phase=phase, at=workflow.now().isoformat(), detail=detail))
        workflow.set_current_details(f"{phase}: {detail}")
        if phase in ("Done", "Failed"):
            workflow.metric_meter().create_counter(
                "slurm_bridge_placements", "finished placements by outcome"
            ).add(1, {"outcome": phase, "kind": self.request.kind})

    async def _step(
        self,
        method: Callable[[Any, In], Awaitable[Out]],
        given: In,
        *,
        summary: str,
        must_finish: bool = False,
        local: bool = False,
        attempt_timeout: timedelta = ATTEMPT_TIMEOUT,
    ) -> Out:
        """One activity, bounded: a step stuck past its bound is reported on the pods and tried again."""
        bound = timedelta(seconds=self.request.step_bound_seconds)
        pause = min(STUCK_PAUSE, bound)
        while True:
            self._slurm_back = False  # a recovery signalled from now on wakes the next wait, if any
            if local:
                local = False
                # One try in this workflow task, on this worker (a worker killed meanwhile loses
                # the task, which another takes over after the workflow task timeout). Any failure,
                # final ones too, goes on as an ordinary activity, where retries, heartbeats, the
                # stuck-step report, the Slurm gate and final errors are handled as for every step
                # (the SDK raises a local activity's failure unwrapped; each step is idempotent).
                try:
                    result = await workflow.execute_local_activity_method(
                        method,
                        given,
                        start_to_close_timeout=LOCAL_ATTEMPT_TIMEOUT,
                        retry_policy=ONE_TRY,
                        summary=summary,
                    )
                except (ActivityError, ApplicationError, TemporalTimeoutError) as error:
                    workflow.logger.info(
                        "step '%s' failed locally, trying it as an activity: %s", summary, error
                    )
                    continue
                if self._slurm_away:
                    self._slurm_is_back()
                return result
            try:
                result = await workflow.execute_activity_method(
                    method,
                    given,
                    start_to_close_timeout=min(attempt_timeout, bound),
                    # A worker killed mid-step is noticed in seconds, not after the whole attempt.
                    heartbeat_timeout=timedelta(seconds=self.request.step_heartbeat_seconds),
                    schedule_to_close_timeout=bound,
                    retry_policy=RETRY,
                    summary=summary,
                )
                if self._slurm_away:
                    self._slurm_is_back()
                if self._slurm_busy_wait is not None:
                    self._slurm_busy_wait = None
                    self.state.slurm_unavailable = ""
                return result
            except ActivityError as error:
                cause = error.cause
                if _failed_as(cause, SLURM_BUSY):
                    # Slurm's answer says it made no job: the same input again, no recovery search.
                    await self._wait_for_room(summary, cause.message)
                    continue
                if _failed_as(cause, SLURM_UNAVAILABLE):
                    await self._wait_for_slurm(summary, cause.message)
                    # The next try is a new activity (its attempt 1): a submission whose answer was
                    # lost may have reached Slurm, so it looks for this placement's job first.
                    given = _as_recovery(given)
                    continue
                final = isinstance(cause, ApplicationError) and cause.non_retryable
                if final and not must_finish:
                    raise
                # Retryable all along and out of time (a timeout, or the last attempt's error when
                # the next retry would pass the bound): tell the user, then try the step again.
                await self._report_stuck(summary, error)
                await workflow.sleep(pause, summary=f"retry: {summary}")
                pause = min(pause * 2, timedelta(minutes=10))
                # The next try is a new activity too: a submission of the stuck one may have
                # reached Slurm, so it looks for this placement's job first (exactly once).
                given = _as_recovery(given)

    async def _wait_for_slurm(self, summary: str, reason: str) -> None:
        """Slurm is away (the worker's gate confirmed it): say so once, then wait for the gate.

        The first time: the phase attribute becomes WaitingForSlurm (what the gate's
        waker looks for) and the pods are told why they wait, once for the whole
        outage. Then the step waits for `slurm_available`, or for a safety timer
        that backs off from SLURM_WAIT_FIRST to SLURM_WAIT_MAX.
        """
        if not self._slurm_away:
            self._slurm_away = True
            self._slurm_wait = SLURM_WAIT_FIRST
            self.state.slurm_unavailable = reason
            current = workflow.info().typed_search_attributes.get(sa.PLACEMENT_PHASE)
            self._phase_before_slurm_away = current
            workflow.upsert_search_attributes([sa.PLACEMENT_PHASE.value_set(WAITING_FOR_SLURM)])
            message = f"waiting for Slurm: {reason}; placement resumes by itself once Slurm answers"
            workflow.logger.warning("placement %s: %s", workflow.info().workflow_id, message)
            with contextlib.suppress(ActivityError):  # best effort, as a stuck report
                await workflow.execute_activity_method(
                    PlacementActivities.report_slurm_unavailable,
                    SlurmUnavailableInput(
                        pods=self._pods(), message=message, condition=not self.state.kube_nodes
                    ),
                    start_to_close_timeout=timedelta(seconds=30),
                    schedule_to_close_timeout=timedelta(seconds=60),
                    summary="tell the pods Slurm is unavailable",
                )
        workflow.set_current_details(f"waiting for Slurm ({summary}): {reason}")
        try:
            await workflow.wait_condition(
                lambda: self._slurm_back,
                timeout=self._slurm_wait,
                timeout_summary="safety re-check: is Slurm back?",
            )
        except TimeoutError:
            self._slurm_wait = min(self._slurm_wait * 2, SLURM_WAIT_MAX)

    async def _wait_for_room(self, summary: str, reason: str) -> None:
        """Slurm answers but takes no new job (its job queue is full): say so once, pause, go on.

        No outage: the Slurm-health gate stays open and other placements' steps go on. The
        pause backs off from SLURM_BUSY_FIRST to SLURM_BUSY_MAX, plus up to a fifth at random,
        so that the placements a full queue turned away at once do not come back at once. Pods
        deleted or finished meanwhile end the pause: the step, tried again, lets them go (it
        finds nothing to place and takes the finalizer off) instead of holding them minutes.
        """
        if self._slurm_busy_wait is None:
            self._slurm_busy_wait = SLURM_BUSY_FIRST
            self.state.slurm_unavailable = reason
            message = (
                f"{reason}; the placement submits again by itself, backing off from "
                f"{SLURM_BUSY_FIRST} to {SLURM_BUSY_MAX} (Slurm's MaxJobCount counts ended jobs "
                "until MinJobAge has passed)"
            )
            workflow.logger.warning("placement %s: %s", workflow.info().workflow_id, message)
            with contextlib.suppress(ActivityError):  # best effort, as a stuck report
                await workflow.execute_activity_method(
                    PlacementActivities.report_slurm_unavailable,
                    SlurmUnavailableInput(
                        pods=self._pods(),
                        message=message,
                        condition=not self.state.kube_nodes,
                        reason=SLURM_BUSY,
                    ),
                    start_to_close_timeout=timedelta(seconds=30),
                    schedule_to_close_timeout=timedelta(seconds=60),
                    summary="tell the pods Slurm takes no new job",
                )
        pause = self._slurm_busy_wait * (1 + workflow.random().random() / 5)
        workflow.set_current_details(f"Slurm takes no new job ({summary}): {reason}")
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(
                self._pods_finished, timeout=pause, timeout_summary=f"submit again: {summary}"
            )
        self._slurm_busy_wait = min(self._slurm_busy_wait * 2, SLURM_BUSY_MAX)

    def _slurm_is_back(self) -> None:
        """A step succeeded after Slurm was away: the phase attribute goes back to what it was."""
        self._slurm_away = False
        self.state.slurm_unavailable = ""
        self.state.pending_reason = ""  # Slurm's next pending reason replaces SlurmUnavailable
        previous = self._phase_before_slurm_away
        workflow.upsert_search_attributes(
            [sa.PLACEMENT_PHASE.value_set(previous) if previous else sa.PLACEMENT_PHASE.value_unset()]
        )

    async def _report_stuck(self, summary: str, error: ActivityError) -> None:
        """Best effort: the dependency that failed may be the one this report needs."""
        detail = str(error.cause or error)
        bound = timedelta(seconds=self.request.step_bound_seconds)
        message = f"step '{summary}' has not succeeded for {bound}: {detail}; retrying"
        workflow.logger.warning("placement %s: %s", workflow.info().workflow_id, message)
        with contextlib.suppress(ActivityError):
            await workflow.execute_activity_method(
                PlacementActivities.tell_pods,
                TellPodsInput(pods=self._pods(), reason="PlacementStuck", message=message, warning=True),
                start_to_close_timeout=timedelta(seconds=30),
                schedule_to_close_timeout=timedelta(seconds=60),
                summary="report a stuck step",
            )


def _failed_as(cause: BaseException | None, failure: str) -> TypeGuard[ApplicationError]:
    """An activity's failure of this type (bridge/failures.py): SLURM_UNAVAILABLE says Slurm is
    away (activities/errors.py, waits_for_slurm), SLURM_BUSY that it takes no new job now."""
    return isinstance(cause, ApplicationError) and cause.type == failure


def _as_recovery(given: In) -> In:
    """A submission's input, told that a job of this placement may exist already (others as given)."""
    if isinstance(given, PrepareInput):
        return cast(In, given.model_copy(update={"recovery": True}))
    return given
