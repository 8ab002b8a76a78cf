"""Slurm side effects of a placement, around one SlurmClient, for its activities (activities/placement.py)."""

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from bridge import keys
from bridge.components import component_summary
from bridge.failures import SLURM_BUSY, SLURM_REJECTED
from bridge.models import JobDescription, SubmitResult, admin_comment_pods
from bridge.slurm_api import JobDescMsg
from bridge.slurm_jobs import het_offset, is_live, job_event, placement_of
from clients.job_listing import SharedListing
from clients.slurm_client import SlurmClient
from clients.slurm_errors import SlurmBusy, SlurmNotFound, SlurmRejected

# Temporal's activity logger: each line carries the workflow and activity ids.
log = activity.logger


def _adopted(job: JobDescription, job_id: int) -> SubmitResult:
    log.info(
        "adopting Slurm job %s for %s",
        job_id,
        job.pod_keys,
        extra={"job_id": job_id, "pods": job.pod_keys},
    )
    return SubmitResult(job_id=job_id, created=False)


class SlurmActivities:
    def __init__(self, slurm: SlurmClient) -> None:
        self.slurm = slurm
        # find_job calls made by submit_once on a recovery path: each lists Slurm's jobs.
        self.recovery_listings = 0
        # The recoveries' listings: one at a time, shared by the recoveries waiting for it.
        self.listing = SharedListing(slurm.list_jobs)

    async def submit_once(
        self, job: JobDescription, placement_id: str, *, since: int, recovery: bool
    ) -> SubmitResult:
        """Submit the placement's external job once; look for an earlier one only when recovering.

        The placement's `prepare_and_submit` activity calls it. `recovery`
        says whether a job of this placement may exist already: True for an
        activity attempt after the first, after a workflow reset, an operator
        retry, an adoption. Then, and only then, the live job carrying this
        comment (placement id) and these pods is looked for first, by listing
        the jobs changed since `since` (counted in `recovery_listings`: on a busy
        Slurm that listing is megabytes).

        Skipping the lookup when `recovery` is False is safe: the placement id,
        which becomes the job's comment, is new for every generation
        (`...@<generation>`), and generations are never reused. So only an
        earlier attempt of this same activity execution could have submitted a
        job with this comment; any such attempt makes this one attempt > 1, and
        resets, retries and adoptions pass recovery=True. A first attempt
        therefore finds nothing, and its lookup would only cost a listing.
        """
        job = job.with_comment(placement_id)
        if recovery:
            self.recovery_listings += 1
            existing = await self.find_job(job, since)
            if existing is not None:
                return _adopted(job, existing)
        return await self._submit(job)

    async def _submit(self, job: JobDescription) -> SubmitResult:
        try:
            if job.components:
                job_id = await self.slurm.submit_het_job(
                    [JobDescMsg.model_validate(component.to_slurm()) for component in job.components]
                )
            else:
                job_id = await self.slurm.submit_job(JobDescMsg.model_validate(job.to_slurm()))
        except SlurmBusy as error:
            # Handed to the workflow, which submits again after a pause: Temporal's own retries
            # would treat the next attempt as a recovery and list Slurm's jobs first, although
            # this answer says no job was made, on a Slurm that is already at its limit.
            raise ApplicationError(
                f"Slurm takes no new job now: {error.message}",
                type=SLURM_BUSY,
                non_retryable=True,
                category=ApplicationErrorCategory.BENIGN,
            ) from error
        except SlurmRejected as error:
            if job.components:
                shape = component_summary([len(c.pod_keys) for c in job.components])
                raise ApplicationError(
                    f"Slurm rejected the heterogeneous job ({shape}): {error}. "
                    f"If this Slurm refuses heterogeneous jobs, annotate the workload "
                    f"{keys.ANNOTATION_SIZING}: largest-pod, or set HETEROGENEOUS_JOBS=false "
                    "(chart: slurm.heterogeneousJobs) to size every node by the group's largest pod",
                    type=SLURM_REJECTED,
                    non_retryable=True,
                ) from error
            raise ApplicationError(
                f"Slurm rejected the job: {error}", type=SLURM_REJECTED, non_retryable=True
            ) from error
        log.info(
            "submitted Slurm job %s for %s",
            job_id,
            job.pod_keys,
            extra={"job_id": job_id, "pods": job.pod_keys},
        )
        return SubmitResult(job_id=job_id, created=True)

    async def find_job(self, job: JobDescription, since: int) -> int | None:
        # A minute of slack covers clock skew between the worker and slurmctld.
        jobs = await self.listing.jobs_since(max(since - 60, 0))
        # A heterogeneous job is found by its leader (component 0), which lists its own pods.
        leader = job.components[0] if job.components else job
        for candidate in jobs:
            info = candidate.model_dump(mode="json")
            if (
                info.get("comment") == job.comment
                and admin_comment_pods(info.get("admin_comment")) == leader.pod_keys
                and het_offset(info) in (None, 0)
                and is_live(job_event(info))
            ):
                return int(info["job_id"])
        return None

    async def live_jobs_of(self, placement_id: str, since: int) -> list[int]:
        """Live jobs whose comment is this placement id (a recovery path: one listing, counted)."""
        self.recovery_listings += 1
        jobs = await self.listing.jobs_since(max(since - 60, 0))
        found = []
        for candidate in jobs:
            info = candidate.model_dump(mode="json")
            if placement_of(info) == placement_id and is_live(job_event(info)):
                found.append(int(info["job_id"]))
        return found

    async def update_job(self, job_id: int, job: JobDescription) -> None:
        """Apply a new description to a pending job (the bare job_desc_msg, as slurmrestd wants)."""
        body = job.to_slurm()
        # An update changes only the fields it names, and an empty list counts as unnamed:
        # with no exclusion left, [""] is what clears Slurm's list. Otherwise the job keeps
        # excluding nodes that fit again, or that were deleted since.
        body.setdefault("excluded_nodes", [""])
        try:
            await self.slurm.update_job(job_id, JobDescMsg.model_validate(body))
        except SlurmRejected as error:
            raise ApplicationError(
                f"Slurm refused the update: {error}", type=SLURM_REJECTED, non_retryable=True
            ) from error

    async def cancel_job(self, job_id: int) -> None:
        """Cancel the job; a job that is already gone or over is fine.

        Sent without reading the job first: slurmrestd answers a job that already
        ended with error 2021 and an unknown one with 2017, and the client takes both
        as done, so a read would only cost slurmctld a job dump on every release.
        """
        try:
            await self.slurm.cancel_job(job_id)
        except SlurmNotFound:
            return
