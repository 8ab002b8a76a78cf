"""SweepWorkflow: one short run of the orphan sweep: scan → heal in batches.

Started by the Temporal Schedule `sweep/<installation>` (every SWEEP_INTERVAL
seconds, default 10 minutes; docs/operations.md, "The sweep"). Like node sync: no
loops, no signals, no continue-as-new, so each run's history is a handful of
events and the next run starts from scratch.

The Temporal UI shows, per run, what the sweep found and decided (the scan's
result: actions and the orphans it leaves alone, with why), what it did (each
heal activity's summary and result) and the counts (the workflow's result). The
scan reads everything before any action; a failed read fails the run with
nothing done. Each action reads again what it depends on, so a run that raced a
worker, or an operator, does nothing harmful.
"""

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.sweep import SweepActivities
    from bridge.sweep import HealInput, SweepAction, SweepRequest, SweepResult

SWEEP_ID_PREFIX = "sweep"
# Few attempts: the next scheduled run scans again anyway, and a run that keeps
# failing should show as failed in the UI rather than hang.
SWEEP_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=3,
)
# The scan lists every Slurm job once (megabytes on a busy Slurm; the client waits up to 4
# minutes for it) and every bridge pod.
SCAN_TIMEOUT = timedelta(minutes=6)
HEAL_TIMEOUT = timedelta(minutes=2)
# Actions per heal activity: keeps each attempt short and each payload small.
BATCH_SIZE = 20


def sweep_workflow_id(installation: str) -> str:
    """`sweep/<installation>`: the schedule's runs append their scheduled time."""
    return f"{SWEEP_ID_PREFIX}/{installation}"


@workflow.defn
class SweepWorkflow:
    @workflow.run
    async def run(self, request: SweepRequest) -> SweepResult:
        plan = await workflow.execute_activity_method(
            SweepActivities.scan,
            request,
            start_to_close_timeout=SCAN_TIMEOUT,
            retry_policy=SWEEP_RETRY,
            summary="find orphans: bridge pods, running placements, this installation's Slurm jobs",
        )
        result = SweepResult(
            skipped=len(plan.skipped),
            pods=plan.pods,
            jobs=plan.jobs,
            others=plan.others,
            listings=plan.listings,
            left_alone=list(plan.skipped),
        )
        for start in range(0, len(plan.actions), BATCH_SIZE):
            batch = plan.actions[start : start + BATCH_SIZE]
            report = await workflow.execute_activity_method(
                SweepActivities.heal,
                HealInput(request=request, actions=batch),
                start_to_close_timeout=HEAL_TIMEOUT,
                retry_policy=SWEEP_RETRY,
                summary=summary(batch),
            )
            result.add(report)
        return result


def summary(actions: list[SweepAction]) -> str:
    """`adopt 1, cancel 2 jobs, drop 1 finalizer`: what a heal activity is about to do."""
    adopt = sum(1 for a in actions if a.kind == "adopt")
    cancel = sum(1 for a in actions if a.kind == "cancel")
    drop = sum(1 for a in actions if a.kind == "drop_finalizer")
    parts = [
        f"adopt {adopt} placement{'s' * (adopt != 1)}" if adopt else "",
        f"cancel {cancel} job{'s' * (cancel != 1)}" if cancel else "",
        f"drop {drop} finalizer{'s' * (drop != 1)}" if drop else "",
    ]
    return ", ".join(part for part in parts if part)
