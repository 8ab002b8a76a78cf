"""What a Slurm job means to the bridge: whose placement it is, its state, whether it still holds nodes."""

from collections.abc import Mapping
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
