"""The printed report: the run's set-up, then the batch or the pending scenario's figures
(bench/README.md, "What the figures mean")."""

from collections import Counter
from collections.abc import Callable

from bench.placement.figures import mean, pass_summary, recheck_cost, recheck_day
from bench.placement.report_site import report_site
from bench.placement.report_tables import (
    budget_line,
    cpu_rows,
    fmt_ms,
    kib,
    kube_rows,
    latency_table,
    slurm_rows,
    watcher_second,
)
from bench.placement.results import Results
from bench.probes import percentile
from bench.slurm import LISTING
from testbed.history_cost import HistoryCost
from workflows.placement import DEFAULT_RECHECK, MAX_RECHECK


def report(r: Results) -> str:
    o = r.options
    lines: list[str] = []
    add = lines.append
    add(f"slurm-bridge placement benchmark ({o.scenario}), {r.started}")
    for key, value in r.environment.items():
        add(f"  {key:<11} {value}")
    if o.scenario == "site":
        setup = (
            f"1-CPU pods grown to {', '.join(f'{level:,}' for level in o.levels)} live placements on "
            f"{o.nodes} nodes x {o.cpus} CPUs (the rest pending), <= {o.concurrency} waiting to be "
            f"submitted; {o.probes} probe pods a level in a partition of their own"
        )
    elif o.scenario == "pending":
        setup = (
            f"{o.pods} 1-CPU pods pending on a partition of one 1-CPU node (held by 1 running pod); "
            f"{o.probes} probe pods in a partition of their own"
        )
    else:
        setup = (
            f"{o.pods} pods x 1 CPU (exclusive=false), {o.nodes} nodes x {o.cpus} CPUs; "
            f"<= {o.concurrency} pods waiting to be bound"
        )
    add(f"  set-up      {setup}; job watch interval {o.watch_interval:g} s")
    add(
        f"              one worker (placement unsandboxed as in production, reference sandboxed; "
        f"{r.activity_slots} activity slots, {r.cache_size} cached workflows); "
        "dev server with in-memory SQLite;"
    )
    add(
        "              real kube-apiserver v1.28 + etcd in processes of their own"
        if o.kube == "real"
        else "              fake Kubernetes API in its own process"
    )
    add(
        f"  Slurm       {r.slurm_jobs_at_start if r.slurm_jobs_at_start is not None else '?'} jobs in "
        f"slurmctld at the start, {o.foreign_jobs} of them the run's foreign jobs (another user's, held)"
    )
    if r.failures:
        add(f"  FAILED placements: {len(r.failures)}: {r.failures[:3]}")
    for note in r.notes:
        add(f"  note: {note}")
    add("")
    if o.scenario == "site":
        report_site(r, add)
    elif o.scenario == "pending":
        report_pending(r, add)
    else:
        report_batch(r, add)
    return "\n".join(lines)


def report_batch(r: Results, add: Callable[[str], None]) -> None:
    o = r.options
    n = len(r.burst.pods) or 1
    rate = r.burst.rate or 0.0
    add("Throughput")
    add(f"  {'placements/s (first pod created -> last pod bound)':<56} {rate:7.2f}")
    if r.reference:
        before = f"before {r.reference_before.rate:.2f}, " if r.reference_before else ""
        add(
            f"  {'reference workflows/s (3 no-op activities + 1 signal)':<56} {r.reference_rate or 0.0:7.2f}"
            f"  ({before}after {r.reference.rate:.2f})"
        )
        add(f"  {'ratio placement / reference (same server, same batch)':<56} {r.ratio or 0.0:7.2f}")
    if summary := pass_summary(r.passes.get("burst", []), o.concurrency):
        add(
            f"  slurmctld started the burst's jobs in {summary['passes']} scheduling passes "
            f"(main {summary['main']}, backfill {summary['backfill']}), "
            f"{summary['jobs_per_pass']:.1f} jobs per pass, {summary['per_second']:.2f} passes/s"
        )
        add(
            f"  closed loop: a pass starts at most the {o.concurrency} pods waiting, so at most "
            f"{summary['ceiling']:.1f} placements/s at these passes; they were {summary['fill']:.0%} full"
        )
    add("")
    latency_table(r, add, "burst", f"Latency at saturation (<= {o.concurrency} waiting), ms")
    if r.reference:
        values = r.reference.latencies
        cells = [percentile(values, 50), percentile(values, 90), percentile(values, 99), max(values or [0.0])]
        add(f"  {'reference: start -> completed':<42} " + " ".join(f"{fmt_ms(v):>7}" for v in cells))
    add("")
    if r.paced.pods:
        latency_table(r, add, "paced", f"Latency paced, {r.paced_rate:.2f} pods/s open loop, ms")
        add("")

    add(f"{'Temporal, per placement (its history)':<40} {'mean':>7} {'min':>7} {'max':>7}  {'reference':>9}")

    def cost_row(label: str, get: Callable[[HistoryCost], float], digits: int = 1) -> None:
        values = [get(c) for c in r.costs] or [0.0]
        refs = [get(c) for c in r.reference_costs]
        ref = f"{mean(refs):9.{digits}f}" if refs else f"{'-':>9}"
        add(f"  {label:<38} {mean(values):7.{digits}f} {min(values):7.0f} {max(values):7.0f}  {ref}")

    cost_row("history events", lambda c: c.events)
    cost_row("history bytes", lambda c: c.bytes, 0)
    cost_row("workflow tasks", lambda c: c.workflow_tasks)
    cost_row("billable actions", lambda c: c.billable_actions)
    for kind in ("start", "activity", "activity retry", "signal", "upsert", "timer"):
        cost_row(f"  {kind}", lambda c, k=kind: c.actions[k])  # type: ignore[misc]
    for name in sorted({name for c in r.costs for name in c.signals}):
        cost_row(f"    signal {name}", lambda c, s=name: c.signals[s])  # type: ignore[misc]
    activities: Counter[str] = Counter()
    for c in r.costs:
        activities.update(c.activities)
    add("  activities: " + ", ".join(f"{name} {count / n:.2f}" for name, count in activities.most_common()))
    for label, costs in (("burst", r.costs), ("paced", r.paced_costs)):
        budget_line(label, costs, add)
    if o.recheck:
        add("  (the hold window is left out: its re-checks are under Waiting)")
    if r.server_actions:
        by_kind = sorted(r.server_actions.items(), key=lambda kv: -kv[1])
        add(
            f"  dev server 'action' counter: {sum(r.server_actions.values()) / n:.2f} per placement, "
            "burst to finish ("
            + ", ".join(f"{k.removeprefix('command_').removeprefix('grpc_')} {v / n:.2f}" for k, v in by_kind)
            + ")"
        )
    signals = r.server_requests.get("SignalWorkflowExecution", 0.0)
    if signals:
        missed = r.server_not_found.get("SignalWorkflowExecution", 0.0)
        add(
            f"  SignalWorkflowExecution RPCs: {signals / n:.2f} per placement, "
            f"{missed / n:.2f} of them NotFound"
        )
    add("")

    window = r.whole.end - r.whole.start
    add(f"Slurm REST, per placement (burst + hold + finish = {window:.0f} s)")
    slurm_rows(r.slurm_activities, "activities", n, add)
    slurm_rows(r.slurm_watcher, "job watcher", n, add)
    listings = r.slurm_activities.count.get(LISTING, 0) + r.slurm_watcher.count.get(LISTING, 0)
    total = sum(r.slurm_activities.count.values()) + sum(r.slurm_watcher.count.values())
    kib_total = (sum(r.slurm_activities.bytes_in.values()) + sum(r.slurm_watcher.bytes_in.values())) / 1024
    add(f"  all         {total / n:.2f} requests, {kib_total / n:.1f} KiB received per placement")
    add(f"  listings of every job (GET /jobs/): {listings} in the whole run")
    restd = r.whole.cpu.get("slurmrestd")
    ctld = r.whole.cpu.get("slurmctld")
    add(
        f"  slurmrestd CPU {fmt_ms(restd / n if restd is not None else None)} ms, slurmctld CPU "
        f"{fmt_ms(ctld / n if ctld is not None else None)} ms per placement "
        "(shared daemons: others' load included)"
    )
    watcher_second(r, add)
    add("")

    kube_rows(r, n, add)
    cpu_rows(r, n, add)

    if r.hold.end:
        hold = r.hold.end - r.hold.start
        actions = sum(r.hold_actions.values())
        by_kind = sorted(r.hold_actions.items(), key=lambda kv: -kv[1])
        add(f"Waiting: {r.in_flight or n} placements in flight (pods running) for {hold:.0f} s")
        add(
            f"  dev server actions: {actions:.0f} = {actions / n / hold * 3600:.2f} per placement per hour"
            + (
                " (" + ", ".join(f"{k.split('_', 1)[-1]} {v:.0f}" for k, v in by_kind) + ")"
                if by_kind
                else ""
            )
        )
        wait_actions = mean([c.billable_actions for c in r.waiting_costs])
        wait_events = mean([c.events for c in r.waiting_costs])
        rechecks = mean([c.activities.get("check_job", 0) for c in r.waiting_costs])
        add(
            f"  from the histories: {wait_actions:.2f} actions, {wait_events:.1f} events, "
            f"{rechecks:.2f} re-checks (check_job) per placement in the window"
        )
        per_actions, per_events = recheck_cost(r)
        if o.recheck and rechecks:
            add(
                f"  re-check every {o.recheck:g} s, doubling (set_recheck_interval): "
                f"{per_actions:.2f} actions and {per_events:.1f} events per re-check "
                "(the signal and its timer restart taken out: 2 actions, 6 events)"
            )
        day = recheck_day(per_actions, per_events)
        add(
            f"  a bound pod's safety re-check ({DEFAULT_RECHECK.total_seconds() / 60:.0f} min doubling to "
            f"{MAX_RECHECK.total_seconds() / 3600:.0f} h): {day['rechecks_first_day']:.0f} re-checks and "
            f"{day['actions_first_day']:.0f} actions on its first day, {day['rechecks_later_day']:.0f} and "
            f"{day['actions_later_day']:.0f} on each later day"
        )
        add("")

    add("Memory (RSS)")
    base, held = r.rss_kb.get("worker_baseline"), r.rss_kb.get("worker_in_flight")
    add(
        f"  this process: {kib(base)} before, {kib(held)} with {r.in_flight or n} placements in flight, "
        f"{kib(r.rss_kb.get('worker_after'))} after (peak {kib(r.rss_kb.get('worker_peak'))})"
    )
    if base and held:
        add(
            f"    {(held - base) / n:.0f} KiB per in-flight placement = "
            f"{(held - base) / n * 1000 / 1024:.0f} MiB per 1,000"
        )
    server_base, server_held = r.rss_kb.get("server_baseline"), r.rss_kb.get("server_in_flight")
    add(f"  Temporal dev server: {kib(server_base)} before, {kib(server_held)} in flight")
    if r.observer.get("lost"):
        add(f"  (the pod observer's watch expired {r.observer['lost']} times: some timestamps may be late)")


def report_pending(r: Results, add: Callable[[str], None]) -> None:
    o = r.options
    n = len(r.whole.pods) or 1
    fill = r.burst.end - r.burst.start
    add(f"Filling: {n} pending placements submitted in {fill:.0f} s ({n / fill if fill else 0:.1f}/s)")
    add(
        "  Slurm's answer for them at the end: "
        + ", ".join(f"{k} {v}" for k, v in r.pending_reasons.most_common())
    )
    add("")
    add(f"Starvation: {len(r.probes)} probe pods, each in a partition Slurm can start it in at once, ms")
    for key, label in (
        ("created_to_bound", "pod created -> bound"),
        ("created_to_submitted", "pod created -> Slurm job submitted"),
        ("submitted_to_running", "submitted -> RUNNING (Slurm, its log)"),
        ("running_to_bound", "Slurm RUNNING -> pod bound"),
    ):
        values = [p[key] for p in r.probes]
        add(f"  {label:<42} " + " ".join(f"{fmt_ms(v):>7}" for v in values))
    add("")
    hold = r.hold.end - r.hold.start
    if hold > 0:
        actions = sum(r.hold_actions.values())
        by_kind = sorted(r.hold_actions.items(), key=lambda kv: -kv[1])
        add(f"Waiting: {r.in_flight} placements in flight (pending in Slurm) for {hold:.0f} s")
        add(
            f"  dev server actions: {actions:.0f} = {actions / n / hold * 3600:.2f} per placement per hour"
            + (
                " (" + ", ".join(f"{k.split('_', 1)[-1]} {v:.0f}" for k, v in by_kind) + ")"
                if by_kind
                else ""
            )
        )
        watcher_second(r, add)
        add("")
    add(f"Slurm REST, per pending placement (fill + hold + probes = {r.whole.end - r.whole.start:.0f} s)")
    slurm_rows(r.slurm_activities, "activities", n, add)
    slurm_rows(r.slurm_watcher, "job watcher", n, add)
    listings = r.slurm_activities.count.get(LISTING, 0) + r.slurm_watcher.count.get(LISTING, 0)
    add(f"  listings of every job (GET /jobs/): {listings} in the whole run")
    add(f"  dev server actions per pending placement (fill to end): {sum(r.server_actions.values()) / n:.2f}")
    add("")
    kube_rows(r, n, add)
    add("Memory (RSS)")
    base, held = r.rss_kb.get("worker_baseline"), r.rss_kb.get("worker_in_flight")
    add(f"  this process: {kib(base)} idle, {kib(held)} with {r.in_flight} placements in flight")
    if base and held and r.in_flight:
        add(f"    {(held - base) / r.in_flight * 1000 / 1024:.0f} MiB per 1,000 in flight (over idle)")
    curve = [(count, rss) for count, rss in r.rss_curve if rss is not None]
    if curve:
        add(
            "    while filling: "
            + ", ".join(f"{count} submitted {rss / 1024:.0f} MiB" for count, rss in curve)
        )
    if len(curve) >= 2 and curve[-1][0] > curve[0][0]:
        slope = (curve[-1][1] - curve[0][1]) / (curve[-1][0] - curve[0][0])
        add(f"    marginal: {slope * 1000 / 1024:.0f} MiB per 1,000 (from {curve[0][0]} to {curve[-1][0]})")
    server_base, server_held = r.rss_kb.get("server_baseline"), r.rss_kb.get("server_in_flight")
    add(f"  Temporal dev server: {kib(server_base)} idle, {kib(server_held)} in flight")
    del o
