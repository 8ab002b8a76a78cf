"""Figures derived from the measurements, for the printed report and the JSON alike."""

from collections.abc import Sequence
from typing import Any

from bench.placement.results import Results
from bench.probes import recheck_times
from bench.slurm import SchedulerPass
from workflows.placement import DEFAULT_RECHECK, MAX_RECHECK

DAY = 86_400.0

LATENCY_ROWS = (
    ("pod created -> bound", "created_to_bound"),
    ("pod created -> Slurm job submitted", "created_to_submitted"),
    ("Slurm job submitted -> RUNNING (Slurm)", "submitted_to_running"),
    ("Slurm RUNNING -> pod bound", "running_to_bound"),
    ("  RUNNING -> first read by the bridge", "running_to_seen"),
    ("  first read -> bound", "seen_to_bound"),
    ("pod Succeeded -> Slurm job cancelled", "succeeded_to_cancelled"),
    ("pod Succeeded -> finalizer removed", "succeeded_to_released"),
)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def recheck_day(per_recheck_actions: float = 2.0, per_recheck_events: float = 11.0) -> dict[str, float]:
    """Safety re-checks of a bound pod in its first day and in each later day, and what they cost."""
    first = recheck_times(DEFAULT_RECHECK.total_seconds(), MAX_RECHECK.total_seconds(), DAY)
    later = DAY / MAX_RECHECK.total_seconds()
    return {
        "rechecks_first_day": float(len(first)),
        "rechecks_later_day": later,
        "actions_first_day": len(first) * per_recheck_actions + 1,  # + the timer left running at midnight
        "actions_later_day": later * per_recheck_actions,
        "events_first_day": len(first) * per_recheck_events,
        "events_later_day": later * per_recheck_events,
    }


def pass_summary(passes: Sequence[SchedulerPass], concurrency: int) -> dict[str, Any] | None:
    """How often slurmctld's passes started the run's jobs, and the rate that allows a closed loop.

    A pod waiting to be bound is started by one pass, and its slot's next pod only after it is
    bound: at most one start per slot per pass. `None` for fewer than two passes (no interval).
    """
    if len(passes) < 2:
        return None
    per_second = (len(passes) - 1) / (passes[-1].at - passes[0].at)
    jobs = sum(p.jobs for p in passes)
    return {
        "passes": len(passes),
        "main": sum(p.scheduler == "main" for p in passes),
        "backfill": sum(p.scheduler == "backfill" for p in passes),
        "jobs_per_pass": jobs / len(passes),
        "per_second": per_second,
        "ceiling": concurrency * per_second,
        "fill": jobs / len(passes) / concurrency,
    }


def recheck_cost(r: Results) -> tuple[float, float]:
    """Actions and events of one safety re-check: measured with --recheck, else from the code path."""
    rechecks = mean([c.activities.get("check_job", 0) for c in r.waiting_costs])
    if not (r.options.recheck and rechecks):
        return 2.0, 11.0  # timer started + check_job; fired, 2 x 3 workflow-task events, 3 activity events
    # The signal itself: 1 signal + 1 new timer (2 actions); signaled, 3 workflow-task events,
    # timer cancelled, timer started (6 events). The rest is the re-checks.
    actions = mean([c.billable_actions for c in r.waiting_costs])
    events = mean([c.events for c in r.waiting_costs])
    return (actions - 2) / rechecks, (events - 6) / rechecks
