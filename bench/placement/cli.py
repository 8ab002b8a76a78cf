"""The command line: options and their defaults (bench/README.md, "Options"), and `main`."""

import argparse
import asyncio
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import bench.placement
from bench.placement.driver import Aborted, amain
from bench.placement.environment import say
from bench.placement.report import report
from bench.placement.report_json import to_json
from bench.placement.results import Options
from worker.settings import WorkerSettings

DEFAULT_WATCH_INTERVAL: float = WorkerSettings.model_fields["job_watch_interval"].default
# The first paragraph of the package's docstring (bench/placement/__init__.py).
DESCRIPTION = (bench.placement.__doc__ or "").split("\n\n")[0]


def parse(argv: Sequence[str] | None) -> Options:
    p = argparse.ArgumentParser(prog="python -m bench.placement", description=DESCRIPTION)
    p.add_argument(
        "--scenario",
        choices=("batch", "pending", "site"),
        default="batch",
        help="what to run (default batch)",
    )
    p.add_argument(
        "--pods", type=int, default=None, help="placements to measure (default 100; pending: 1000)"
    )
    p.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="Slurm external nodes = Kubernetes nodes (default 50; site: 1000)",
    )
    p.add_argument("--cpus", type=int, default=None, help="CPUs per node (default 4; site: 5)")
    p.add_argument(
        "--levels",
        default="100,1000,10000",
        help="site: the numbers of live placements measured at, growing (default 100,1000,10000)",
    )
    p.add_argument("--memory-mb", type=int, default=8000, help="memory per node (default 8000)")
    p.add_argument(
        "--concurrency", type=int, default=20, help="pods waiting to be bound at most (default 20)"
    )
    p.add_argument(
        "--watch-interval",
        type=float,
        default=DEFAULT_WATCH_INTERVAL,
        help=f"JOB_WATCH_INTERVAL, s (default: the bridge's, {DEFAULT_WATCH_INTERVAL:g})",
    )
    p.add_argument("--warmup", type=int, default=3, help="uncounted placements first (default 3)")
    p.add_argument(
        "--reference",
        type=int,
        default=None,
        help="reference workflows (default: --pods; site: 1000; 0: none)",
    )
    p.add_argument(
        "--finish-rate", type=float, default=None, help="pods/s turned Succeeded (default: measured)"
    )
    p.add_argument("--hold", type=float, default=10, help="s the placements wait in flight (default 10)")
    p.add_argument(
        "--recheck",
        type=float,
        default=0,
        help="tell placements to re-check every S s while holding (default: no)",
    )
    p.add_argument(
        "--paced",
        type=int,
        default=None,
        help="pods placed open loop after the burst (default: min(pods, 100))",
    )
    p.add_argument("--paced-load", type=float, default=0.4, help="paced rate / burst rate (default 0.4)")
    p.add_argument(
        "--probes",
        type=int,
        default=None,
        help="pending: pods Slurm can start at once (default 3); site: per level (default 100)",
    )
    p.add_argument(
        "--foreign-jobs", type=int, default=0, help="another user's held jobs in Slurm during the run"
    )
    p.add_argument(
        "--followers",
        type=int,
        default=0,
        help="worker processes beside the benchmark's, followers under leader election (replicas - 1)",
    )
    p.add_argument(
        "--kube",
        choices=("fake", "real"),
        default="fake",
        help="the API server: the in-repo fake, or the real kube-apiserver v1.28 + etcd (testbed/kube_real)",
    )
    p.add_argument(
        "--follower", dest="followers", action="store_const", const=1, help="the same as --followers 1"
    )
    p.add_argument(
        "--max-cached-workflows",
        type=int,
        default=None,
        help="the worker's workflow cache (default: the bridge's); to attribute memory",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="the whole run, s (default 300; pending: 900; site: 3600)",
    )
    p.add_argument("--json", dest="json_path", help="also write the figures to this file")
    a = p.parse_args(argv)
    pending, site = a.scenario == "pending", a.scenario == "site"
    nodes = a.nodes if a.nodes is not None else (1000 if site else 50)
    cpus = a.cpus if a.cpus is not None else (5 if site else 4)
    try:
        levels = tuple(int(level) for level in a.levels.split(",")) if site else ()
    except ValueError:
        p.error(f"--levels {a.levels!r}: numbers separated by commas, as 100,1000,10000")
    if site and (not levels or list(levels) != sorted(set(levels)) or levels[0] < 1):
        p.error(f"--levels {a.levels!r}: growing numbers of placements, at least 1")
    pods = levels[-1] if site else a.pods if a.pods is not None else (1000 if pending else 100)
    if pods < 1 or a.concurrency < 1 or nodes < 1:
        p.error("--pods, --nodes and --concurrency must be at least 1")
    if a.scenario == "batch" and pods > nodes * cpus:
        p.error(f"{pods} 1-CPU pods do not fit on {nodes} x {cpus} CPUs: the benchmark holds them all")
    return Options(
        scenario=a.scenario,
        pods=pods,
        nodes=1 if pending else nodes,
        cpus=1 if pending else cpus,
        memory_mb=a.memory_mb,
        concurrency=a.concurrency,
        watch_interval=a.watch_interval,
        warmup=max(a.warmup, 1),
        reference=0 if pending else (a.reference if a.reference is not None else (1000 if site else pods)),
        finish_rate=a.finish_rate,
        hold=a.hold,
        recheck=a.recheck,
        paced=0 if pending or site else (min(pods, 100) if a.paced is None else a.paced),
        paced_load=a.paced_load,
        probes=a.probes if a.probes is not None else (100 if site else 3),
        foreign_jobs=max(a.foreign_jobs, 0),
        levels=levels,
        max_cached_workflows=a.max_cached_workflows,
        timeout=a.timeout if a.timeout is not None else (3600 if site else 900 if pending else 300),
        json_path=a.json_path,
        followers=a.followers,
        kube=a.kube,
    )


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    options = parse(argv)
    try:
        results = asyncio.run(amain(options))
    except Aborted as error:
        say(f"ABORTED: {error}")
        return 1
    print(report(results))
    if options.json_path:
        Path(options.json_path).write_text(json.dumps(to_json(results), indent=2, default=str))
    return 0
