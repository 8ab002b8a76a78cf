"""Parts of the printed report that both scenarios use: latency, Slurm REST, Kubernetes and CPU
tables, the job watcher's cost per second, the per-placement budget."""

import os
from collections import Counter
from collections.abc import Callable, Sequence

from bench.placement.figures import LATENCY_ROWS, mean
from bench.placement.results import Results
from bench.probes import STEP_ROWS, RequestStats, percentile
from testbed.history_cost import HistoryCost

# The per-placement budget (docs/performance.md): one pod, start to finish, no pending reason.
BUDGET_ACTIONS = 8
BUDGET_EVENTS = 40

CPU_ROWS = (
    ("this process (the bridge)", "process"),
    ("  asyncio thread (bridge)", "main_thread"),
    ("  Temporal SDK core threads", "sdk_core"),
    ("  other threads (bench driver)", "other_threads"),
    ("Temporal dev server", "server"),
    ("Kubernetes API (own processes)", "kube"),
    ("slurmctld (shared with others)", "slurmctld"),
    ("slurmrestd (shared with others)", "slurmrestd"),
    ("follower replicas (own processes)", "follower"),
)


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.0f}"


def kib(value: int | None) -> str:
    return "?" if value is None else f"{value / 1024:.0f} MiB"


def latency_table(r: Results, add: Callable[[str], None], phase: str, title: str) -> None:
    add(f"{title:<44} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7} {'n':>5}")
    lat = r.latencies.get(phase, {})
    for label, key in LATENCY_ROWS:
        values = lat.get(key, [])
        cells = [percentile(values, 50), percentile(values, 90), percentile(values, 99)]
        cells.append(max(values) if values else None)
        add(f"  {label:<42} " + " ".join(f"{fmt_ms(v):>7}" for v in cells) + f" {len(values):>5}")
    found, jobs = r.running_from_log.get(phase, (0, 0))
    add(
        f"  (RUNNING: slurmctld's log, ms, for {found} of {jobs} jobs; first read RUNNING by the job "
        f"watcher's probe for {r.via_watcher.get(phase, 0)}, by an activity for the others)"
    )
    reasons = r.reasons.get(phase, Counter())
    add(
        "  (pending reasons the bridge read, jobs: "
        + ", ".join(f"{k} {v}" for k, v in reasons.most_common())
        + ")"
    )
    steps = r.steps.get(phase, [])
    if steps:
        add("  steps, from the histories (server's clock):")
        for label, key in STEP_ROWS:
            values = [step[key] for step in steps if key in step]
            cells = [percentile(values, 50), percentile(values, 90), percentile(values, 99)]
            cells.append(max(values) if values else None)
            add(f"    {label:<40} " + " ".join(f"{fmt_ms(v):>7}" for v in cells) + f" {len(values):>5}")


def budget_line(label: str, costs: Sequence[HistoryCost], add: Callable[[str], None]) -> None:
    """The per-placement budget, over the placements whose job never showed a pending reason."""
    plain = [c for c in costs if not c.activities.get("report_pending")]
    if not plain:
        return
    add(
        f"  {label}: all {len(costs)} placements: actions {mean([c.billable_actions for c in costs]):.2f}, "
        f"events {mean([c.events for c in costs]):.1f}"
    )
    actions = [float(c.billable_actions) for c in plain]
    events = [float(c.events) for c in plain]
    verdict = "within" if max(actions) <= BUDGET_ACTIONS and max(events) <= BUDGET_EVENTS else "OVER"
    add(
        f"  budget ({label}, {len(plain)} of {len(costs)} placements without a pending reason): actions "
        f"{mean(actions):.2f} (max {max(actions):.0f}), events {mean(events):.1f} (max {max(events):.0f}); "
        f"<= {BUDGET_ACTIONS} / <= {BUDGET_EVENTS}: {verdict}"
    )


def slurm_rows(stats: RequestStats, who: str, n: int, add: Callable[[str], None]) -> None:
    for operation, count in sorted(stats.count.items(), key=lambda kv: -kv[1]):
        received = stats.bytes_in[operation] / count / 1024
        took = stats.seconds[operation] / count * 1000
        add(
            f"  {who:<11} {operation:<18} {count / n:6.2f}  {received:8.2f} KiB  {took:6.1f} ms"
            "  (per request)"
        )


def watcher_second(r: Results, add: Callable[[str], None]) -> None:
    """What the job watcher costs Slurm per second while placements wait (the hold window)."""
    hold = r.hold.end - r.hold.start
    if hold <= 0:
        return
    requests = sum(r.slurm_hold.count.values())
    received = sum(r.slurm_hold.bytes_in.values()) / 1024
    restd, idle_restd = r.hold.cpu.get("slurmrestd"), r.paused.cpu.get("slurmrestd")
    ctld, idle_ctld = r.hold.cpu.get("slurmctld"), r.paused.cpu.get("slurmctld")
    idle = (r.paused.end - r.paused.start) or 1.0
    ops = ", ".join(f"{op} {count / hold:.1f}/s" for op, count in r.slurm_hold.count.most_common())
    add(
        f"  job watcher while {r.in_flight or len(r.burst.pods)} placements wait: "
        f"{r.watcher_passes_hold / hold:.2f} passes/s, {requests / hold:.2f} requests/s ({ops}), "
        f"{received / hold:.1f} KiB/s"
    )
    if restd is not None and idle_restd is not None and ctld is not None and idle_ctld is not None:
        add(
            f"    slurmrestd CPU {restd / hold * 1000:.1f} ms/s "
            f"(watcher paused: {idle_restd / idle * 1000:.1f}), "
            f"slurmctld {ctld / hold * 1000:.1f} ms/s (watcher paused: {idle_ctld / idle * 1000:.1f}); "
            "shared daemons, others' load included"
        )


def kube_rows(r: Results, n: int, add: Callable[[str], None]) -> None:
    add("Kubernetes API, the bridge's requests per placement (watches left out), mean time per request")
    rows = [(op, count) for op, count in r.kube_requests.most_common() if not op.endswith("(watch)")]
    for operation, count in rows:
        mean_ms = r.kube_seconds.get(operation, 0.0) / count * 1000
        add(f"  {operation:<56} {count / n:6.2f}  {mean_ms:7.1f} ms")
    add(f"  {'total':<56} {sum(count for _, count in rows) / n:6.2f}")
    add("")


def cpu_rows(r: Results, n: int, add: Callable[[str], None]) -> None:
    add(f"{'CPU, ms per placement':<38} {'burst':>8} {'+hold+finish':>13} {'paced':>8} {'reference':>10}")
    n_ref = len(r.reference.latencies) if r.reference else 0
    n_paced = len(r.paced.pods)
    for label, key in CPU_ROWS:
        cells = [
            (r.burst.cpu.get(key), n),
            (r.whole.cpu.get(key), n),
            (r.paced.cpu.get(key), n_paced),
            (r.reference_cpu.get(key), n_ref),
        ]
        text = [fmt_ms(v / count if v is not None and count else None) for v, count in cells]
        add(f"  {label:<36} {text[0]:>8} {text[1]:>13} {text[2]:>8} {text[3]:>10}")
    wall = r.burst.cpu.get("wall") or 0.0
    busy = sum(
        r.burst.cpu.get(k) or 0.0
        for k in ("process", "server", "kube", "slurmctld", "slurmrestd", "follower")
    )
    machine = r.burst.cpu.get("machine") or 0.0
    add(
        f"  burst: {wall:.1f} s wall; these processes kept {busy / wall if wall else 0:.2f} of "
        f"{os.cpu_count()} cores busy, the whole machine {machine / wall if wall else 0:.2f}"
    )
    add("")
