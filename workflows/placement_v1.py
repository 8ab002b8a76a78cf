"""The first placement workflow (type `PlacementWorkflow`), frozen for replay.

Placements started before the lean rewrite (workflow type `Placement`,
workflows/placement.py) keep running on this code until they end: it issues
exactly the commands their histories recorded (golden history
tests/histories/placement-v1-bound-done.json). Do not change what it does; a fix
that must reach these placements goes behind a `workflow.patched` marker.
"""

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.kube import BOUND_ELSEWHERE, INVALID_POD, NODE_NOT_FOUND, POD_GONE, KubeActivities
    from activities.slurm import SLURM_REJECTED, SlurmActivities, is_live
    from bridge import keys
    from bridge import search_attributes as sa
    from bridge.models import JobEvent, Phase, PhaseChange, PlacementRequest, PlacementState, PodEvent, PodRef
    from workflows.members import GroupMembers, PlacementFailed

KUBE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    non_retryable_error_types=[INVALID_POD, NODE_NOT_FOUND, BOUND_ELSEWHERE, POD_GONE],
)
SLURM_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=60),
    non_retryable_error_types=[SLURM_REJECTED],
)
ACTIVITY_TIMEOUT = timedelta(seconds=60)
# A safety net only: if every signal about a job were lost, the workflow still
# looks at Slurm itself this often (one timer and one activity per interval).
DEFAULT_RECHECK = timedelta(minutes=10)
# A bound pod being deleted keeps its job until the kubelet reports it stopped;
# if no kubelet ever does (node gone), give up waiting after grace + this.
DELETION_SLACK = timedelta(seconds=60)


@workflow.defn(name="PlacementWorkflow")
class PlacementWorkflowV1(GroupMembers):
    @workflow.init
    def __init__(self, request: PlacementRequest) -> None:
        # State lives here, not in run(): signals delivered with the start
        # (signal-with-start) are applied before run() begins.
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

    # -- messages ------------------------------------------------------------

    @workflow.signal
    def pod_changed(self, event: PodEvent) -> None:
        event = self._merge(event)
        if not self.submitted and not event.terminal and not event.deleting:
            self.members.setdefault(event.pod.uid, event.pod)
            self.state.pods = [p.key for p in self.members.values()]
        self._changes += 1

    @workflow.signal
    def job_changed(self, event: JobEvent) -> None:
        self.jobs[event.job_id] = event
        self._changes += 1

    @workflow.signal
    def set_recheck_interval(self, seconds: float) -> None:
        """Operators (and tests) may shorten the safety re-check."""
        self.recheck = timedelta(seconds=max(seconds, 1.0))
        self._changes += 1

    @workflow.query
    def current_state(self) -> PlacementState:
        return self.state

    # -- the placement -------------------------------------------------------

    @workflow.run
    async def run(self, request: PlacementRequest) -> PlacementState:
        try:
            await self._place()
        except PlacementFailed as failure:
            await self._fail(str(failure), failure.reason)
        except ActivityError as error:
            cause = error.cause
            if isinstance(cause, ApplicationError) and cause.non_retryable:
                await self._fail(cause.message, cause.type or "PlacementFailed")
            raise
        except asyncio.CancelledError:
            # An operator cancelled the placement: release Slurm and the pod, then stop.
            # Activities may still run after the cancellation was delivered.
            await self._release("placement cancelled by an operator")
            raise
        return self.state

    async def _place(self) -> None:
        if len(self.members) < self.request.min_pods:
            self._phase("Translating", f"waiting for {self.request.min_pods} pods of {self.request.group}")
            # Also stop waiting when every pod that joined is gone again.
            await workflow.wait_condition(
                lambda: len(self._live_members()) >= self.request.min_pods or not self._live_members()
            )
        self.members = {p.uid: p for p in self._live_members()}
        if not self.members:
            self._phase("Done", "every pod of the group was deleted before the group was complete")
            return
        pods = self._pods()
        present = await self._kube(KubeActivities.add_finalizer, pods, summary="add finalizer")
        if len(present) < len(pods) or self._pods_finished():
            await self._kube(KubeActivities.remove_finalizer, pods, summary="remove finalizer")
            self._phase("Done", "pods gone or finished before placement")
            return

        request = self.request.model_copy(update={"pods": pods})
        self.translated_annotations = self._current_annotations()
        job = await self._kube(KubeActivities.translate, request, summary="translate pods to a Slurm job")
        # From here on the group is fixed, in the job's order (the order pods pair with nodes).
        self.submitted = True
        by_key = {p.key: p for p in pods}
        self.members = {by_key[key].uid: by_key[key] for key in job.pod_keys if key in by_key}
        pods = self._pods()
        self.state.pods = [p.key for p in pods]
        since = int(workflow.info().start_time.timestamp())
        submitted = await workflow.execute_activity_method(
            SlurmActivities.submit_job,
            args=[job, workflow.info().workflow_id, since],
            start_to_close_timeout=ACTIVITY_TIMEOUT,
            retry_policy=SLURM_RETRY,
            summary=f"submit external job to partition {job.partition}",
        )
        self.state.job_id = job_id = submitted.job_id
        self._phase(
            "Submitted", f"Slurm job {job_id} in partition {job.partition}", sa.SLURM_JOB_ID.value_set(job_id)
        )
        await self._kube(KubeActivities.label_job_id, pods, job_id, summary=f"label pods with job {job_id}")
        await self._event("SlurmJobSubmitted", f"Slurm job {job_id} submitted to partition {job.partition}")

        running = await self._wait_for_allocation(job_id)
        if running is None:
            await self._cleanup_after_pods(job_id)
            return
        self._phase("Running", f"Slurm job {job_id} running on {', '.join(running.nodes)}")
        self.state.nodes = running.nodes
        if len(running.nodes) < len(pods):
            raise PlacementFailed(
                f"Slurm job {job_id} was allocated {len(running.nodes)} nodes for {len(pods)} pods",
                "AllocationTooSmall",
            )
        nodes = await self._kube(
            KubeActivities.resolve_nodes, running.nodes[: len(pods)], summary="map Slurm nodes"
        )
        await self._kube(KubeActivities.bind_pods, pods, nodes, summary=f"bind to {', '.join(nodes)}")
        self._phase("Bound", f"bound to {', '.join(nodes)}", sa.SLURM_NODES.value_set(nodes))
        self._record_bind_latency()
        await self._event(
            "Bound", f"Slurm job {job_id} allocated {', '.join(running.nodes)}; bound to {', '.join(nodes)}"
        )

        ended = await self._wait_for_end(job_id)
        if ended is None:
            await self._cleanup_after_pods(job_id)
        else:
            await self._cleanup_after_job(ended)

    # -- waiting -------------------------------------------------------------

    async def _wait_for_allocation(self, job_id: int) -> JobEvent | None:
        """The confirmed RUNNING job, or None when the pods finished first."""
        self._phase("Pending", f"waiting for Slurm to start job {job_id}")
        reported = ""
        while True:
            # Sampled before acting: changes that arrive while activities run are not lost.
            seen = self._changes
            if self._pods_finished():
                return None
            hint = self.jobs.get(job_id)
            if hint is not None and (hint.running or not is_live(hint)):
                current = await self._read_job(job_id)
                if current.running:
                    return current
                if not is_live(current):
                    raise PlacementFailed(
                        f"Slurm job {job_id} ended before it started ({current.summary}); "
                        "the pod was not placed",
                        "SlurmJobEnded",
                    )
                hint = current
            if self._annotations_changed():
                await self._update_pending_job(job_id)
            if hint is not None and hint.pending and hint.reason and hint.reason != reported:
                reported = hint.reason
                self.state.pending_reason = hint.reason
                self.state.job_state = hint.summary
                await self._kube(
                    KubeActivities.set_unschedulable,
                    self._pods(),
                    hint.reason,
                    f"Slurm job {job_id} is pending: {hint.reason}",
                    summary=f"pending: {hint.reason}",
                )
                await self._event("SlurmJobPending", f"Slurm job {job_id} is pending: {hint.reason}")
            workflow.set_current_details(f"Slurm job {job_id}: {hint.summary if hint else 'submitted'}")
            await self._wait_for_change(job_id, seen)

    async def _wait_for_end(self, job_id: int) -> JobEvent | None:
        """The confirmed ended job, or None when the pods finished first."""
        while True:
            # Sampled before acting: changes that arrive while activities run are not lost.
            seen = self._changes
            if self._pods_finished():
                return None
            hint = self.jobs.get(job_id)
            if hint is not None and not hint.running:
                current = await self._read_job(job_id)
                if not current.running:
                    return current
            if self._annotations_changed():
                self.translated_annotations = self._current_annotations()
                await self._event(
                    "SlurmJobAlreadyAllocated",
                    f"Slurm job {job_id} is already running: changed {keys.SLURMJOB_PREFIX}* annotations "
                    "only apply to a job that is still pending",
                    warning=True,
                )
            workflow.set_current_details(f"Slurm job {job_id} running; pods bound")
            await self._wait_for_change(job_id, seen, self._deletion_deadline())

    async def _update_pending_job(self, job_id: int) -> None:
        """The user changed the job's annotations while Slurm still waits: update the job."""
        self.translated_annotations = self._current_annotations()
        request = self.request.model_copy(update={"pods": self._pods()})
        try:
            job = await self._kube(KubeActivities.translate, request, summary="translate changed annotations")
            await self._slurm(SlurmActivities.update_job, job_id, job, summary=f"update job {job_id}")
        except ActivityError as error:
            cause = error.cause
            if not (isinstance(cause, ApplicationError) and cause.non_retryable):
                raise
            await self._event(
                "SlurmJobUpdateFailed", f"Slurm job {job_id} kept as it was: {cause.message}", True
            )
            return
        await self._event("SlurmJobUpdated", f"Slurm job {job_id} updated from the changed annotations")

    async def _wait_for_change(self, job_id: int, seen: int, deadline: timedelta | None = None) -> None:
        timeout = min(self.recheck, deadline) if deadline is not None else self.recheck
        try:
            await workflow.wait_condition(
                lambda: self._changes != seen, timeout=timeout, timeout_summary="safety re-check"
            )
        except TimeoutError:
            self.jobs[job_id] = await self._read_job(job_id)
            self._changes += 1

    def _deletion_deadline(self) -> timedelta | None:
        graces = [e.deletion_grace_seconds for e in self.pods.values() if e.deleting and not e.terminal]
        if not graces:
            return None
        return timedelta(seconds=max(graces)) + DELETION_SLACK

    # -- ending --------------------------------------------------------------

    async def _cleanup_after_pods(self, job_id: int) -> None:
        self._phase("Cleaning", f"pods finished; cancelling Slurm job {job_id}")
        await self._slurm(SlurmActivities.cancel_job, job_id, summary=f"cancel job {job_id}")
        await self._kube(KubeActivities.remove_finalizer, self._pods(), summary="remove finalizer")
        self._phase("Done", f"pods finished; Slurm job {job_id} cancelled")

    async def _cleanup_after_job(self, job: JobEvent) -> None:
        self._phase("Cleaning", f"Slurm job {job.job_id} ended ({job.summary}); deleting pods")
        self.state.job_state = job.summary
        await self._kube(
            KubeActivities.delete_pods,
            self._pods(),
            "SlurmJobEnded",
            f"Slurm job {job.job_id} is no longer running ({job.summary}); deleting the pod",
            summary="delete pods",
        )
        await self._kube(KubeActivities.remove_finalizer, self._pods(), summary="remove finalizer")
        self._phase("Done", f"Slurm job {job.job_id} ended ({job.summary}); pods deleted")

    async def _release(self, why: str) -> None:
        if self.state.job_id is not None:
            await self._slurm(SlurmActivities.cancel_job, self.state.job_id, summary="cancel job")
        await self._kube(KubeActivities.remove_finalizer, self._pods(), summary="remove finalizer")
        self._phase("Failed", why)

    async def _fail(self, message: str, reason: str) -> None:
        """Tell the user on the pod, release everything, and fail the workflow for good."""
        self.state.failure = message
        await self._kube(
            KubeActivities.set_unschedulable, self._pods(), reason, message, summary="report failure"
        )
        await self._event(reason, message, warning=True)
        await self._release(message)
        raise ApplicationError(message, type=reason, non_retryable=True)

    # -- helpers -------------------------------------------------------------

    def _phase(self, phase: Phase, detail: str, *also: SearchAttributeUpdate[Any]) -> None:
        self.state.phase = phase
        self.state.history.append(PhaseChange(phase=phase, at=workflow.now().isoformat(), detail=detail))
        # One upsert command per phase change (each command is a billable action).
        workflow.upsert_search_attributes([sa.PLACEMENT_PHASE.value_set(phase), *also])
        workflow.set_current_details(f"{phase}: {detail}")
        if phase in ("Done", "Failed"):
            workflow.metric_meter().create_counter(
                "slurm_bridge_placements", "finished placements by outcome"
            ).add(1, {"outcome": phase, "kind": self.request.kind})

    async def _read_job(self, job_id: int) -> JobEvent:
        event: JobEvent = await self._slurm(SlurmActivities.get_job, job_id, summary=f"read job {job_id}")
        self.jobs[job_id] = event
        self.state.job_state = event.summary
        return event

    async def _event(self, reason: str, message: str, warning: bool = False) -> None:
        await self._kube(KubeActivities.record_event, self._pods(), reason, message, warning, summary=reason)

    async def _kube(self, method: Callable[..., Awaitable[Any]], *args: Any, summary: str) -> Any:
        return await workflow.execute_activity_method(
            method,
            args=list(args),
            start_to_close_timeout=ACTIVITY_TIMEOUT,
            retry_policy=KUBE_RETRY,
            summary=summary,
        )

    async def _slurm(self, method: Callable[..., Awaitable[Any]], *args: Any, summary: str) -> Any:
        return await workflow.execute_activity_method(
            method,
            args=list(args),
            start_to_close_timeout=ACTIVITY_TIMEOUT,
            retry_policy=SLURM_RETRY,
            summary=summary,
        )
