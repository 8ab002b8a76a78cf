"""Reserved against requested: what a representative mix of groups holds in Slurm under each sizing.

    python -m bench.sizing [--json FILE]

For each workload of the mix, the job the bridge would submit (the translation the worker uses,
bridge/components.py and bridge/translate.py) under `largest-pod` sizing (one job, every node
sized by the largest pod: the bridge before heterogeneous jobs, and HETEROGENEOUS_JOBS=false)
and under `per-pod` sizing (a heterogeneous job, one component per pod shape): the CPUs, memory
and GPUs Slurm is asked to reserve, against what the pods request. That Slurm reserves exactly
what it is asked, component by component, is checked on real Slurm by
tests/e2e/test_workload_shapes.py and tests/e2e/test_het_groups.py; this prints the figures for
a mix no test bed could hold (eight-GPU nodes by the dozen).
"""

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from bridge.components import Sizing, split_by_shape
from bridge.models import JobDescription
from bridge.quantity import mebibytes, whole_cpus
from bridge.resources import group_resources
from bridge.translate import Defaults, GroupShape, build_parts_job

GPU = "nvidia.com/gpu"


def pod(name: str, cpu: str, memory: str, gpus: int = 0) -> dict[str, Any]:
    requests = {"cpu": cpu, "memory": memory, **({GPU: str(gpus)} if gpus else {})}
    limits = {GPU: str(gpus)} if gpus else {}
    container = {"name": "main", "image": "x", "resources": {"requests": requests, "limits": limits}}
    return {
        "metadata": {"namespace": "bench", "name": name, "uid": name},
        "spec": {"containers": [container]},
    }


def replicas(prefix: str, count: int, cpu: str, memory: str, gpus: int = 0) -> list[dict[str, Any]]:
    return [pod(f"{prefix}-{i}", cpu, memory, gpus) for i in range(count)]


# The mix: shapes people bring (issue #25's examples), one group each.
MIX: dict[str, list[dict[str, Any]]] = {
    "LeaderWorkerSet: 2-CPU leader, 8 workers of 8 GPUs": [
        pod("leader", "2", "8Gi"),
        *replicas("worker", 8, "32", "256Gi", 8),
    ],
    "JobSet: 1-CPU driver, 4 workers of 16 CPUs": [
        pod("driver", "1", "2Gi"),
        *replicas("worker", 4, "16", "64Gi"),
    ],
    "TrainJob: launcher, 4 trainer nodes of 8 GPUs": [
        pod("launcher", "2", "4Gi"),
        *replicas("node", 4, "48", "512Gi", 8),
    ],
    "MPI: launcher, 16 ranks of 4 CPUs": [pod("launcher", "1", "1Gi"), *replicas("rank", 16, "4", "8Gi")],
    "PodGroup: 2 GPU pods, 2 CPU-only pods": replicas("gpu", 2, "8", "32Gi", 4)
    + replicas("cpu", 2, "4", "8Gi"),
    "uniform: 8 pods of 8 GPUs": replicas("node", 8, "32", "256Gi", 8),
}


@dataclass(frozen=True)
class Amounts:
    cpus: int
    memory_mib: int
    gpus: int


@dataclass(frozen=True)
class Row:
    workload: str
    pods: int
    requested: Amounts
    largest_pod: Amounts
    per_pod: Amounts
    components: int


def requested(pods: Sequence[dict[str, Any]]) -> Amounts:
    asks = [group_resources([p]) for p in pods]
    return Amounts(
        cpus=sum(whole_cpus(a.get("cpu", Fraction(0))) for a in asks),
        memory_mib=sum(mebibytes(a.get("memory", Fraction(0))) for a in asks),
        gpus=sum(int(a.get(GPU, Fraction(0))) for a in asks),
    )


def _gpus(tres: str | None) -> int:
    return int(tres.rpartition("=")[2]) if tres and tres.startswith("gres/gpu") else 0


def reserved(job: JobDescription) -> Amounts:
    """What Slurm is asked to hold: per component, its node count times its per-node asks."""
    parts = job.components or [job]
    return Amounts(
        cpus=sum(int(c.nodes) * (c.cpus_per_task or 0) for c in parts),
        memory_mib=sum(int(c.nodes) * (c.memory_per_node.number if c.memory_per_node else 0) for c in parts),
        gpus=sum(int(c.nodes) * _gpus(c.tres_per_node) for c in parts),
    )


def job_for(pods: list[dict[str, Any]], sizing: Sizing) -> JobDescription:
    defaults = Defaults(sizing=sizing)
    parts = split_by_shape(pods, None, sizing=sizing, devices=defaults.device_classes)
    return build_parts_job(
        [(part, None) for part in parts], annotations=None, shape=GroupShape(name="bench"), defaults=defaults
    )


def rows() -> list[Row]:
    result = []
    for workload, pods in MIX.items():
        het = job_for(pods, "per-pod")
        result.append(
            Row(
                workload,
                len(pods),
                requested(pods),
                reserved(job_for(pods, "largest-pod")),
                reserved(het),
                len(het.components) or 1,
            )
        )
    return result


def _ratio(held: int, asked: int) -> str:
    return f"{held / asked:.2f}x" if asked else "-"


def report(table: list[Row]) -> str:
    lines = [
        "reserved / requested, per resource: largest-pod sizing (one job) -> per-pod (heterogeneous job)",
        f"{'workload':<52} {'pods':>4} {'comp':>4}  {'CPUs':>15}  {'memory':>15}  {'GPUs':>15}",
    ]
    totals = {"asked": [0, 0, 0], "largest": [0, 0, 0], "per_pod": [0, 0, 0]}
    for row in table:
        cells = []
        for field in ("cpus", "memory_mib", "gpus"):
            asked = getattr(row.requested, field)
            before = _ratio(getattr(row.largest_pod, field), asked)
            cells.append(f"{before:>6} -> {_ratio(getattr(row.per_pod, field), asked):>6}")
        lines.append(f"{row.workload:<52} {row.pods:>4} {row.components:>4}  " + "  ".join(cells))
        for key, amounts in (
            ("asked", row.requested),
            ("largest", row.largest_pod),
            ("per_pod", row.per_pod),
        ):
            for i, field in enumerate(("cpus", "memory_mib", "gpus")):
                totals[key][i] += getattr(amounts, field)
    asked_all, largest_all, per_pod_all = totals["asked"], totals["largest"], totals["per_pod"]
    whole = "  ".join(
        f"{_ratio(largest_all[i], asked_all[i]):>6} -> {_ratio(per_pod_all[i], asked_all[i]):>6}"
        for i in range(3)
    )
    lines.append(f"{'the whole mix':<52} {sum(r.pods for r in table):>4} {'':>4}  {whole}")
    idle = [largest_all[i] - asked_all[i] for i in range(3)]
    lines.append(
        f"held for nothing under largest-pod sizing: {idle[0]} CPUs, {idle[1] // 1024} GiB, {idle[2]} GPUs "
        f"of {asked_all[0]} CPUs, {asked_all[1] // 1024} GiB, {asked_all[2]} GPUs requested"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", help="also write every figure as JSON to this file")
    args = parser.parse_args(argv)
    table = rows()
    print(report(table))
    if args.json:
        with open(args.json, "w") as out:
            json.dump([asdict(row) for row in table], out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
