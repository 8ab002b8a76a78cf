"""The bridge's live Slurm jobs: what the job watcher asks Slurm about, and nothing else.

Fed from Kubernetes, not from Slurm: the pod watcher sees each pod's
`scheduler.slinky.slurm.net/slurm-jobid` label and `slurm-bridge/placement`
annotation and calls `track`; when no pod references a job any more it calls
`forget`. The job watcher calls `finished` once it told the placement that the
job is over, so an ended job is not asked about again while its pods are being
cleaned up (a later `track` of it from a pod update is ignored).

Bounded by the pods the pod watcher sees: a job id is held only while some pod
references it, and a live one only until its end was told.
"""

from collections.abc import Iterable

from bridge.models import installation_of


def _installation(placement_id: str) -> str | None:
    try:
        return installation_of(placement_id)
    except ValueError:
        return None  # not a placement id: no installation follows it


class LiveJobs:
    """Job id → placement id (the job's comment) of the jobs the job watcher must follow."""

    def __init__(self) -> None:
        self._live: dict[int, str] = {}
        # The same, by the installation the placement ids name: the job watcher takes its
        # installation's at each change of the jobs, without a walk over every job.
        self._by_installation: dict[str, dict[int, str]] = {}
        # Over, and the placement was told; kept until no pod references the job.
        self._finished: dict[int, str] = {}
        # Moves whenever the jobs to follow change: a reader that saw this version may keep
        # what it derived from them (the job watcher, on every pass, at 10,000 jobs).
        self.version = 0

    def track(self, job_id: int, placement_id: str) -> None:
        """A pod references `job_id`, placed by `placement_id`. Idempotent: call on every pod event.

        A job already `finished` stays finished, unless the pod names another
        placement for it (a job id Slurm handed out again after its state was wiped).
        """
        if self._finished.get(job_id) == placement_id or self._live.get(job_id) == placement_id:
            return  # nothing changes (every pod event calls this)
        self._finished.pop(job_id, None)
        self._drop(job_id)
        self._live[job_id] = placement_id
        installation = _installation(placement_id)
        if installation is not None:
            self._by_installation.setdefault(installation, {})[job_id] = placement_id
        self.version += 1

    def finished(self, job_id: int) -> None:
        """The job is over and its placement was told: stop following it."""
        placement_id = self._drop(job_id)
        if placement_id is not None:
            self._finished[job_id] = placement_id
            self.version += 1

    def forget(self, job_id: int) -> None:
        """No pod references the job any more."""
        if self._drop(job_id) is not None:
            self.version += 1
        self._finished.pop(job_id, None)

    def retain(self, job_ids: Iterable[int]) -> None:
        """Forget every job not in `job_ids`: after a full re-list of the pods."""
        keep = set(job_ids)
        for job_id in [*self._live, *self._finished]:
            if job_id not in keep:
                self.forget(job_id)

    def items(self) -> list[tuple[int, str]]:
        """(job id, placement id) of every job still to follow; a snapshot."""
        return list(self._live.items())

    def of_installation(self, installation: str) -> dict[int, str]:
        """(job id → placement id) of the jobs to follow whose placements are `installation`'s;
        a snapshot."""
        return dict(self._by_installation.get(installation, {}))

    def _drop(self, job_id: int) -> str | None:
        placement_id = self._live.pop(job_id, None)
        if placement_id is not None:
            installation = _installation(placement_id)
            if installation is not None:
                bucket = self._by_installation[installation]
                del bucket[job_id]
                if not bucket:
                    del self._by_installation[installation]
        return placement_id

    def placement_of(self, job_id: int) -> str | None:
        return self._live.get(job_id)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._live

    def __len__(self) -> int:
        return len(self._live)

    def __repr__(self) -> str:
        return f"LiveJobs({len(self._live)} live, {len(self._finished)} finished)"
