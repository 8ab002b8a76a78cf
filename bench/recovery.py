"""Recoveries at once on a Slurm holding many jobs: what their listings cost slurmrestd.

    python -m bench.recovery [--foreign 10000] [--recoveries 20] [--json FILE]

A recovery (a submission that may have reached Slurm before it was cut off) finds its
placement's job by listing every job slurmctld holds: slurmrestd filters by nothing else.
Recoveries come together (Slurm back after an outage: every placement that was submitting
recovers), so this submits `--recoveries` placements' jobs (their answers "lost") beside
`--foreign` held jobs of another user, then runs every recovery at once through the bridge's
own `SlurmActivities.submit_once(recovery=True)`, against a slurmrestd of the benchmark's own
(started fresh, as slurmrestd keeps its peak memory, and stopped after).

Ended jobs stay in slurmctld for MinJobAge (300 s on the bed), so a run right after another
lists the earlier run's jobs too: it first waits (up to 400 s) until slurmctld holds fewer than
`--settle-below` jobs. It prints: the jobs slurmctld held, the listings sent (`GET /jobs/`) and
their outcomes, how many recoveries found their job, the time until the last one was done, and
slurmrestd's memory: resident before and at its peak (VmHWM). Figures are printed, never
asserted. Every job it submitted is cancelled at the end.
"""

import argparse
import asyncio
import contextlib
import json
import logging
import secrets
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from activities.slurm import SlurmActivities
from bench.placement.environment import connect_slurm, count_slurm_jobs
from bench.probes import memory_kb
from clients.slurm_client import SlurmClient
from clients.slurm_errors import SlurmError
from testbed.placement_jobs import one_pod_job, placement_id
from testbed.slurm_bed import SlurmTestBed

log = logging.getLogger("bench.recovery")


@dataclass
class RecoveryFigures:
    foreign_jobs: int
    jobs_held: int | None  # every job slurmctld held as the recoveries began
    recoveries: int
    listings: dict[str, int]  # GET /jobs/ by outcome
    found: int  # recoveries that adopted their own job
    failed: int  # recoveries that raised
    seconds: float  # until the last recovery was done
    slurmrestd_rss_before_mib: float
    slurmrestd_peak_mib: float


async def measure(bed: SlurmTestBed, partition: str, recoveries: int, foreign_jobs: int) -> RecoveryFigures:
    restd = bed.extra_slurmrestd()
    outcomes: Counter[str] = Counter()

    def observe(operation: str, outcome: str, seconds: float) -> None:
        if operation == "GET /jobs/":
            outcomes[outcome] += 1

    submitted: dict[str, int] = {}
    try:
        pid = restd.pid()
        async with SlurmClient(
            restd.url, user_name=bed.user_name, token_file=bed.jwt_file, observer=observe
        ) as client:
            activities = SlurmActivities(client)
            token = secrets.token_hex(4)
            pods = [f"ns-{token}/pod-{i}" for i in range(recoveries)]
            jobs = {placement_id("bench-recovery", pod, token): one_pod_job(partition, pod) for pod in pods}
            for placement, job in jobs.items():
                first = await activities.submit_once(job, placement, since=0, recovery=False)
                submitted[placement] = first.job_id
            held = count_slurm_jobs(bed)
            before = (memory_kb(pid) or 0) / 1024
            started = time.perf_counter()
            results = await asyncio.gather(
                *(
                    activities.submit_once(job, placement, since=0, recovery=True)
                    for placement, job in jobs.items()
                ),
                return_exceptions=True,
            )
            seconds = time.perf_counter() - started
            peak = (memory_kb(pid, "VmHWM") or 0) / 1024
            found = sum(
                1
                for placement, outcome in zip(jobs, results, strict=True)
                if not isinstance(outcome, BaseException) and outcome.job_id == submitted[placement]
            )
            failed = sum(1 for outcome in results if isinstance(outcome, BaseException))
            for outcome in results:
                if isinstance(outcome, BaseException):
                    log.warning("a recovery failed: %s", outcome)
                elif outcome.created:
                    submitted[f"duplicate-{outcome.job_id}"] = outcome.job_id
            for job_id in submitted.values():
                with contextlib.suppress(SlurmError):
                    await client.cancel_job(job_id)
    finally:
        restd.stop()
    return RecoveryFigures(
        foreign_jobs=foreign_jobs,
        jobs_held=held,
        recoveries=recoveries,
        listings=dict(outcomes),
        found=found,
        failed=failed,
        seconds=round(seconds, 1),
        slurmrestd_rss_before_mib=round(before, 1),
        slurmrestd_peak_mib=round(peak, 1),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--foreign", type=int, default=10_000, help="held jobs of another user in Slurm")
    parser.add_argument("--recoveries", type=int, default=20, help="recoveries run at once")
    parser.add_argument(
        "--settle-below", type=int, default=1000, help="start once slurmctld holds fewer jobs"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")

    bed = connect_slurm()
    deadline = time.monotonic() + 400
    while (held := count_slurm_jobs(bed) or 0) >= args.settle_below and time.monotonic() < deadline:
        log.warning("slurmctld holds %d jobs (ended ones stay for MinJobAge); waiting", held)
        time.sleep(10)
    partition = bed.make_partition(nodes=1, cpus=1, memory_mb=1000)
    foreign_name = f"bench-recovery-{secrets.token_hex(3)}"
    try:
        bed.submit_foreign_jobs(args.foreign, partition.name, name=foreign_name)
        figures = asyncio.run(measure(bed, partition.name, args.recoveries, args.foreign))
    finally:
        bed.cancel_foreign_jobs(name=foreign_name)
        partition.cleanup()

    rows = [
        ("foreign jobs held", figures.foreign_jobs),
        ("jobs slurmctld held (any user, any state)", figures.jobs_held),
        ("recoveries at once", figures.recoveries),
        ("GET /jobs/ sent, by outcome", ", ".join(f"{k} {v}" for k, v in figures.listings.items())),
        ("recoveries that found their job", figures.found),
        ("recoveries that failed", figures.failed),
        ("seconds until the last was done", figures.seconds),
        ("slurmrestd RSS before (MiB)", figures.slurmrestd_rss_before_mib),
        ("slurmrestd peak RSS, VmHWM (MiB)", figures.slurmrestd_peak_mib),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(figures), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
