"""What a Slurm job means to the bridge: whose placement it is, its state, whether it still holds nodes."""

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from bridge.models import ENDED_JOB_STATES, PLACEMENT_ID_PREFIX, JobEvent, admin_comment_pods


def placement_of(job: BaseModel | Mapping[str, Any]) -> str | None:
    """The placement workflow a bridge job belongs to, from its comment."""
    info = job.model_dump(mode="json") if isinstance(job, BaseModel) else job
    comment = info.get("comment")
    is_ours = isinstance(comment, str) and comment.startswith(PLACEMENT_ID_PREFIX)
    if is_ours and admin_comment_pods(info.get("admin_comment")) is not None:
        return str(comment)
    return None


def job_event(job: BaseModel | Mapping[str, Any]) -> JobEvent:
    """The bridge's view of a Slurm job_info."""
    info = job.model_dump(mode="json") if isinstance(job, BaseModel) else dict(job)
    allocation = ((info.get("job_resources") or {}).get("nodes") or {}).get("allocation") or []
    nodes = [entry["name"] for entry in allocation if entry.get("name")]
    return JobEvent(
        job_id=int(info["job_id"]),
        states=list(info.get("job_state") or []),
        reason=str(info.get("state_reason") or ""),
        nodes=nodes,
        restarts=int(info.get("restart_cnt") or 0),
    )


def is_live(event: JobEvent) -> bool:
    """Does Slurm still hold (or still mean to give) nodes for this job?"""
    return not event.gone and not ENDED_JOB_STATES.intersection(event.states)


def het_offset(job: BaseModel | Mapping[str, Any]) -> int | None:
    """A heterogeneous job component's offset (0: the leader); None for an ordinary job."""
    info = job.model_dump(mode="json") if isinstance(job, BaseModel) else job
    offset = info.get("het_job_offset")
    if isinstance(offset, Mapping):  # Slurm's {set, infinite, number}
        return int(offset["number"]) if offset.get("set") else None
    return int(offset) if isinstance(offset, int) else None


def job_event_of(components: Sequence[BaseModel | Mapping[str, Any]]) -> JobEvent:
    """The bridge's view of a job given as all its components (one, for an ordinary job).

    The components of a heterogeneous job start together and end together, but a read may
    catch them apart: the job counts as ended when any component ended (with that
    component's states, for the reason), pending while any is pending, else as its leader.
    Its nodes are every component's, in component order: pod i takes node i.
    """
    infos = [c.model_dump(mode="json") if isinstance(c, BaseModel) else dict(c) for c in components]
    if not infos:
        raise ValueError("a job has at least one component")
    if len(infos) == 1:
        return job_event(infos[0])
    events = [job_event(info) for info in sorted(infos, key=lambda i: het_offset(i) or 0)]
    leader = events[0]
    ended = next((e for e in events if ENDED_JOB_STATES.intersection(e.states)), None)
    decisive = ended or next((e for e in events if e.pending), None) or leader
    return JobEvent(
        job_id=leader.job_id,
        states=decisive.states,
        reason=decisive.reason,
        nodes=[node for event in events for node in event.nodes],
        restarts=max(event.restarts for event in events),
        components=len(events),
    )
