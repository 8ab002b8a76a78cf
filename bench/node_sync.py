"""Node sync at a site's size: its runs over 1,000 Kubernetes nodes and their Slurm external nodes.

    python -m bench.node_sync [--nodes 1000] [--steady 5] [--json FILE]

What one run of NodeSyncWorkflow does (workflows/node_sync.py), without Temporal: node sync's
own read (activities/nodes.py), plan and one run's share of it (bridge/node_sync.py), and apply
in batches of the workflow's size, against the real Slurm bed and the fake Kubernetes API (testbed/kube_fake,
in this process: the real API server's test bed is not set up for a thousand nodes). Phases:

1. **register**: `--nodes` Kubernetes nodes labelled for registration, none in Slurm yet (as
   many runs as the limit of actions per run takes);
2. **steady**: `--steady` runs with nothing to do (what every scheduled run costs);
3. **cordon**: a tenth of the nodes cordoned, drained in Slurm by the next run;
4. **remove**: every node deleted from Kubernetes, drained and deleted in Slurm.

For each run: seconds to read, plan and apply; actions applied and left for the next run; Slurm
and Kubernetes requests; the size of both sides read in full, and of the plan, the planning
activity's result, which Temporal stores in the run's history (its payload limit is 2 MB).
Figures are printed, never asserted. Every Slurm node it made is deleted at the end.
"""

import argparse
import asyncio
import json
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from activities.nodes import NodeActivities
from bench.placement.environment import connect_slurm, say
from bench.probes import CountingTransport
from bridge import keys
from bridge.node_actions import MAX_ACTIONS_PER_RUN, NodeActions, NodeSyncPlan
from bridge.node_sync import most_urgent, plan
from clients.kube_client import KubeClient
from clients.slurm_client import SlurmClient
from testbed.kube_fake.server import FakeKubeServer
from testbed.slurm_bed import DEFAULT_PARTITION, SlurmTestBed
from workflows.node_sync import BATCH_SIZE, batches

SCHEDULER = keys.DEFAULT_SCHEDULER_NAME


@dataclass
class Run:
    phase: str
    read_seconds: float
    plan_seconds: float
    apply_seconds: float
    actions: int
    failed: int
    slurm_requests: int
    kube_requests: int
    deferred: int  # actions left for the next run (beyond MAX_ACTIONS_PER_RUN)
    snapshot_bytes: int  # both sides in full as JSON: stays inside the planning activity
    plan_bytes: int  # the planning activity's result as JSON: what Temporal keeps per run


class NodeSyncBench:
    def __init__(self, bed: SlurmTestBed, kube_server: FakeKubeServer) -> None:
        self.bed = bed
        self.kube_server = kube_server
        self.counter = CountingTransport()
        self.slurm = SlurmClient(
            bed.rest_url, user_name=bed.user_name, token_file=bed.jwt_file, transport=self.counter
        )
        self.kube = KubeClient(kube_server.aio_configuration())
        self.nodes = NodeActivities(self.kube, self.slurm, scheduler_name=SCHEDULER)

    async def close(self) -> None:
        await self.slurm.close()
        await self.kube.close()

    async def run(self, phase: str) -> Run:
        slurm_before = sum(self.counter.stats.count.values())
        kube_before = len(self.kube_server.requests)
        started = time.perf_counter()
        snapshot = await self.nodes.read_snapshot()
        read = time.perf_counter()
        actions, deferred = most_urgent(
            plan(snapshot, scheduler_name=SCHEDULER, default_partition=DEFAULT_PARTITION), MAX_ACTIONS_PER_RUN
        )
        result = NodeSyncPlan(
            kube_nodes=len(snapshot.kube_nodes),
            slurm_nodes=len(snapshot.slurm_nodes),
            actions=actions,
            deferred=deferred,
        )
        planned = time.perf_counter()
        failed = 0
        for batch in batches(actions, BATCH_SIZE):
            report = await self.nodes.apply_node_actions(NodeActions(actions=batch))
            failed += len(report.failed)
        applied = time.perf_counter()
        return Run(
            phase=phase,
            read_seconds=round(read - started, 3),
            plan_seconds=round(planned - read, 3),
            apply_seconds=round(applied - planned, 3),
            actions=len(actions),
            failed=failed,
            slurm_requests=sum(self.counter.stats.count.values()) - slurm_before,
            kube_requests=len(self.kube_server.requests) - kube_before,
            deferred=deferred,
            snapshot_bytes=len(snapshot.model_dump_json()),
            plan_bytes=len(result.model_dump_json()),
        )


async def amain(options: argparse.Namespace) -> list[Run]:
    bed = await asyncio.to_thread(connect_slurm)
    prefix = f"bns-{secrets.token_hex(3)}"
    names = [f"{prefix}-{index:04d}" for index in range(1, options.nodes + 1)]
    kube_server = FakeKubeServer(history_size=10 * options.nodes).start()
    bench = NodeSyncBench(bed, kube_server)
    runs: list[Run] = []
    try:
        say(f"{options.nodes:,} Kubernetes nodes labelled for registration")
        for name in names:
            kube_server.create_node(
                name, cpu="64", memory="257000Mi", labels={keys.LABEL_EXTERNAL_NODE: "true"}
            )
        runs.append(await bench.run("register"))
        while runs[-1].deferred:  # at most MAX_ACTIONS_PER_RUN a run
            runs.append(await bench.run("register (the rest)"))
        for _ in range(options.steady):
            runs.append(await bench.run("steady"))
        say("a tenth of the nodes cordoned")
        for name in names[::10]:
            kube_server.update_object("nodes", name, lambda node: node["spec"].update(unschedulable=True))
        runs.append(await bench.run("cordon"))
        runs.append(await bench.run("steady"))
        say("every node deleted from Kubernetes")
        for name in names:
            kube_server.delete_object("nodes", name)
        for _ in range(3):  # drained first, then deleted once idle
            runs.append(await bench.run("remove"))
            if runs[-1].actions == 0:
                break
        return runs
    finally:
        await bench.close()
        kube_server.stop()
        left = [name for name in names if bed.node(name) is not None]
        if left:
            say(f"deleting {len(left)} Slurm nodes node sync left")
            await asyncio.to_thread(bed.delete_nodes, left)


def print_runs(runs: Sequence[Run], nodes: int) -> None:
    print(f"\nNode sync, {nodes:,} nodes (fake Kubernetes API, real Slurm)\n")
    columns = [
        "run",
        "read s",
        "plan s",
        "apply s",
        "actions",
        "failed",
        "Slurm req.",
        "Kube req.",
        "left",
        "both sides",
        "plan result",
    ]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for run in runs:
        cells = [
            run.phase,
            run.read_seconds,
            run.plan_seconds,
            run.apply_seconds,
            run.actions,
            run.failed,
            run.slurm_requests,
            run.kube_requests,
            run.deferred,
            f"{run.snapshot_bytes / 1024:,.0f} KiB",
            f"{run.plan_bytes / 1024:,.0f} KiB",
        ]
        print("| " + " | ".join(str(cell) for cell in cells) + " |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.node_sync", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--steady", type=int, default=5, help="runs with nothing to do")
    parser.add_argument("--json", help="also write the figures here")
    options = parser.parse_args(argv)
    runs = asyncio.run(amain(options))
    print_runs(runs, options.nodes)
    if options.json:
        with open(options.json, "w") as out:
            json.dump({"nodes": options.nodes, "runs": [asdict(run) for run in runs]}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
