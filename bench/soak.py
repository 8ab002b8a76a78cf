"""Soak: many placements, each with a SIGKILL of the real worker process at a random step.

    .venv/bin/python -m bench.soak --placements 1000 --json soak.json

Each placement (a pod, or a PodGroup of two) gets one kill point at random (before submit,
after submit, after the label, after the binding, during clean-up; testbed/kill_points.py):
the fake API server parks the step's request, the soak sees the side effect, kills the worker,
drops the request and starts a new worker. It runs on the real Slurm test bed (a partition of
its own, two nodes) and a Temporal dev server of its own, one placement at a time, and prints
the counts: placements, kills, lost (a pod never bound and not told why, a finalizer left, a job
still live) and duplicated (more than one Slurm job ever for a placement, counted by the job's
comment through scontrol, ended jobs included). Lost and duplicated must be 0 (docs/reliability.md).
Kubernetes API faults run all along: a share of the worker's reads (`--read-faults`, 10 % by
default) is answered 500 or 429, and every watch stream is cut every `--drop-watches` seconds.
The writes the kill points park are left alone, so each kill still lands where it is aimed.
A placement given up cleanly with the reason on its pods (Slurm refused the job: on the shared test
bed, another run's slurmctld restart makes it forget the soak's partition for a moment) is counted
as failed, with its reasons, not as lost.
"""

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from bench.placement import TEMPORAL_CLI, connect_slurm
from bridge import keys
from bridge import search_attributes as sa
from testbed.kill_points import KillBed, KillPoint, Kind, Outcome, place_with_kill, worker_env
from testbed.kube_fake import FakeKubeServer
from testbed.slurm_bed import SlurmTestBed


def say(message: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def summarize(
    outcomes: Sequence[Outcome],
    seconds: float,
    seed: int,
    slurmctld_restarts: int = 0,
    faults: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The counts of a run; lost and duplicated must be 0."""
    return {
        "api_faults": dict(faults or {}),
        "placements": len(outcomes),
        "pods": sum(2 if o.kind is Kind.GROUP else 1 for o in outcomes),
        "groups": sum(o.kind is Kind.GROUP for o in outcomes),
        "kills": sum(o.killed for o in outcomes),
        "kills_by_point": dict(sorted(Counter(o.point.value for o in outcomes if o.killed).items())),
        "lost": sum(o.lost for o in outcomes),
        "failed_told": sum(o.failed_told for o in outcomes),
        "failed_reasons": dict(
            sorted(Counter(r for o in outcomes if o.failed_told for r in set(o.told.values())).items())
        ),
        "duplicated": sum(o.duplicated for o in outcomes),
        "slurm_jobs": sum(len(o.jobs) for o in outcomes),
        # Restarts by others sharing the test bed: they make slurmctld forget the soak's partition
        # and kill its jobs for a moment, which is what "failed" placements usually are.
        "slurmctld_restarts": slurmctld_restarts,
        "seconds": round(seconds, 1),
        "seconds_per_placement": round(seconds / len(outcomes), 2) if outcomes else None,
        "seed": seed,
        "problems": [v for o in outcomes if o.lost or o.duplicated for v in o.violations()][:20],
    }


def text(summary: dict[str, Any]) -> str:
    points = ", ".join(f"{point} {count}" for point, count in summary["kills_by_point"].items())
    return "\n".join(
        [
            f"placements  {summary['placements']} ({summary['groups']} groups of 2, {summary['pods']} pods)",
            f"kills       {summary['kills']} ({points})",
            f"lost        {summary['lost']}",
            f"failed      {summary['failed_told']} (not placed, the reason told on the pod: "
            f"{summary['failed_reasons'] or 'none'})",
            f"duplicated  {summary['duplicated']}",
            f"API faults  {summary.get('api_faults') or 'none'}",
            f"slurm jobs  {summary['slurm_jobs']}",
            f"slurmctld   restarted {summary['slurmctld_restarts']} times during the run (by others)",
            f"time        {summary['seconds']} s ({summary['seconds_per_placement']} s per placement)",
            *[f"problem     {p}" for p in summary["problems"]],
        ]
    )


async def cut_watches(kube: FakeKubeServer, every: float, counts: Counter[str]) -> None:
    """Cut every open watch stream now and then, as an API server restart does."""
    while True:
        await asyncio.sleep(every)
        kube.drop_watches()
        counts["watch drops"] += 1


async def soak(
    placements: int,
    seed: int,
    group_share: float,
    deadline: float,
    *,
    read_faults: float = 0.1,
    drop_watches: float = 5.0,
) -> dict[str, Any]:
    rng = random.Random(seed)
    faults: Counter[str] = Counter()
    slurm = await asyncio.to_thread(connect_slurm)
    partition = await asyncio.to_thread(slurm.make_partition, 2, 2)
    kube = FakeKubeServer().start()
    cutter: asyncio.Task[None] | None = None
    outcomes: list[Outcome] = []
    started = time.monotonic()
    log_start = slurmctld_log_size(slurm)
    try:
        for name in partition.node_names:
            kube.create_node(name, cpu="2", memory="8000Mi", labels={keys.LABEL_EXTERNAL_NODE: "true"})
        if read_faults > 0:
            # Reads only, watches spared (they are cut below): the kill points park writes.
            kube.fail_randomly("GET", r"^/api", (500, 429), read_faults, seed=seed, watches=False)
        cutter = asyncio.create_task(cut_watches(kube, drop_watches, faults)) if drop_watches > 0 else None
        async with await WorkflowEnvironment.start_local(
            dev_server_existing_path=str(TEMPORAL_CLI),
            data_converter=pydantic_data_converter,
            search_attributes=sa.ALL,
            dev_server_log_level="error",
        ) as env:
            with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
                env_vars = worker_env(
                    temporal_address=env.client.service_client.config.target_host,
                    task_queue=f"soak-{partition.name}",
                    slurm=slurm,
                    kubeconfig=kube.kubeconfig(Path(tmp) / "kubeconfig"),
                    partition=partition.name,
                )
                bed = KillBed(kube, slurm, partition.name, env_vars, Path(tmp))
                try:
                    for index in range(placements):
                        if time.monotonic() > deadline:
                            say(f"out of time after {index} placements")
                            break
                        kind = Kind.GROUP if rng.random() < group_share else Kind.POD
                        point = rng.choice(list(KillPoint))
                        outcome = await place_with_kill(bed, kind, point, f"s{index}")
                        outcomes.append(outcome)
                        for problem in outcome.violations():
                            say(("(failed, told) " if outcome.failed_told else "") + problem)
                        if (index + 1) % 10 == 0:
                            lost = sum(o.lost for o in outcomes)
                            duplicated = sum(o.duplicated for o in outcomes)
                            say(f"{index + 1} placements, lost {lost}, duplicated {duplicated}")
                finally:
                    await bed.stop_worker()
    finally:
        if cutter is not None:
            cutter.cancel()
        for status, count in kube.stop_random_failures().items():
            faults[f"reads answered {status}"] += count
        kube.stop()
        await asyncio.to_thread(partition.cleanup)
    return summarize(
        outcomes, time.monotonic() - started, seed, slurmctld_starts(slurm, log_start), dict(faults)
    )


def slurmctld_log_size(slurm: SlurmTestBed) -> int:
    try:
        return slurm.slurmctld_log.stat().st_size
    except OSError:
        return 0


def slurmctld_starts(slurm: SlurmTestBed, since: int) -> int:
    """How often slurmctld started since that offset of its log."""
    try:
        with slurm.slurmctld_log.open("rb") as log:
            log.seek(since)
            return log.read().count(b"slurmctld version")
    except OSError:
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--placements", type=int, default=1000, help="placements, each with one kill (1000)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: time)")
    p.add_argument("--group-share", type=float, default=0.5, help="share of PodGroups of two (0.5)")
    p.add_argument("--timeout", type=float, default=7200, help="stop placing after this many s (7200)")
    p.add_argument(
        "--read-faults", type=float, default=0.1, help="share of reads answered 500/429 (0.1; 0: none)"
    )
    p.add_argument(
        "--drop-watches", type=float, default=5.0, help="cut every watch stream this often, s (5; 0: never)"
    )
    p.add_argument("--json", dest="json_path", help="also write the counts to this file")
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time())
    deadline = time.monotonic() + args.timeout
    summary = asyncio.run(
        soak(
            args.placements,
            seed,
            args.group_share,
            deadline,
            read_faults=args.read_faults,
            drop_watches=args.drop_watches,
        )
    )
    print(text(summary))
    print(json.dumps(summary))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if summary["lost"] == summary["duplicated"] == 0 and summary["placements"] else 1


if __name__ == "__main__":
    sys.exit(main())
