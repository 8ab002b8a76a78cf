"""The site scenario's report: one column per level of live placements (bench/placement/site.py)."""

from collections.abc import Callable, Sequence

from bench.placement.report_tables import fmt_ms
from bench.placement.results import Results, SiteLevel
from bench.probes import percentile

# The legs of a probe's Slurm RUNNING -> bound (site.py: probe_latencies).
WAKE_LEGS = (
    ("RUNNING -> the job watcher's probe saw it", "running_to_seen"),
    ("-> its job_changed signal recorded", "seen_to_signal"),
    ("-> the workflow task it woke started", "signal_to_task"),
    ("-> the pod bound (in that task)", "task_to_bound"),
    ("pod bound -> that task completed", "bound_to_task_completed"),
)


def report_site(r: Results, add: Callable[[str], None]) -> None:
    levels = r.site_levels
    if not levels:
        add("No level was reached.")
        return
    base = r.rss_kb.get("worker_baseline")

    def row(label: str, cells: Sequence[object]) -> None:
        add(f"  {label:<52} " + " ".join(f"{cell!s:>10}" for cell in cells))

    def per_second(level: SiteLevel, seconds: float, value: float | None) -> str:
        return "-" if value is None or seconds <= 0 else f"{value / seconds * 1000:.1f}"

    def hold_cpu(key: str) -> list[str]:
        return [per_second(v, v.hold_seconds, v.hold_cpu.get(key)) for v in levels]

    def paused_cpu(key: str) -> list[str]:
        return [per_second(v, v.paused_seconds, v.paused_cpu.get(key)) for v in levels]

    def probe(key: str, q: float) -> list[str]:
        return [
            fmt_ms(
                None
                if (p := percentile([x for d in v.probes if (x := d[key]) is not None], q)) is None
                else p
            )
            for v in levels
        ]

    add("Live placements (levels)")
    row("placements in flight", [f"{v.live:,}" for v in levels])
    row("  of them bound (pods running)", [f"{v.bound:,}" for v in levels])
    row("  of them pending in Slurm", [f"{v.live - v.bound:,}" for v in levels])
    rates = [v.fill_placements / v.fill_seconds if v.fill_seconds else None for v in levels]
    row("placements/s while growing to the level", ["-" if x is None else f"{x:.1f}" for x in rates])
    reference = r.reference_rate
    if reference:
        add(f"  (reference workflows/s, 3 no-op activities + 1 signal, same concurrency: {reference:.1f})")
        row("  ratio to the reference", ["-" if x is None else f"{x / reference:.2f}" for x in rates])
    add("")
    add("While they wait (hold), per second")
    row("job watcher passes", [f"{v.watcher_passes / v.hold_seconds:.2f}" for v in levels])
    row("job watcher requests", [f"{sum(v.watcher.count.values()) / v.hold_seconds:.2f}" for v in levels])
    ops = sorted({op for v in levels for op in v.watcher.count})
    for op in ops:
        row(f"  {op}", [f"{v.watcher.count.get(op, 0) / v.hold_seconds:.2f}" for v in levels])
    row(
        "job watcher KiB received",
        [f"{sum(v.watcher.bytes_in.values()) / 1024 / v.hold_seconds:.1f}" for v in levels],
    )
    row("slurmrestd CPU, ms", hold_cpu("slurmrestd"))
    row("  with the job watcher paused", paused_cpu("slurmrestd"))
    row("slurmctld CPU, ms", hold_cpu("slurmctld"))
    row("  with the job watcher paused", paused_cpu("slurmctld"))
    row("this process (the bridge) CPU, ms", hold_cpu("process"))
    row("  asyncio thread", hold_cpu("main_thread"))
    if any(v.hold_cpu.get("follower") is not None for v in levels):
        row("a follower replica's process CPU, ms", hold_cpu("follower"))
    row("Temporal dev server CPU, ms", hold_cpu("server"))
    row(
        "dev server actions per placement per hour",
        [f"{v.hold_actions / v.live / v.hold_seconds * 3600:.2f}" for v in levels],
    )
    add("")
    add("Memory (RSS), MiB")
    row("this process (the bridge)", [f"{(v.rss_worker_kb or 0) / 1024:.0f}" for v in levels])
    row(
        "  per 1,000 in flight, over idle",
        [
            f"{((v.rss_worker_kb or 0) - base) / v.live * 1000 / 1024:.0f}"
            if base and v.rss_worker_kb
            else "-"
            for v in levels
        ],
    )
    if any(v.rss_follower_kb for v in levels):
        row("a follower replica", [f"{(v.rss_follower_kb or 0) / 1024:.0f}" for v in levels])
    row("Temporal dev server", [f"{(v.rss_server_kb or 0) / 1024:.0f}" for v in levels])
    add("")
    n = max((len(v.probes) for v in levels), default=0)
    add(f"Probe pods ({n} a level, one a second, in a partition with free CPUs), ms")
    row("pod created -> bound, p50", probe("created_to_bound", 50))
    row("pod created -> bound, p99", probe("created_to_bound", 99))
    row("Slurm RUNNING -> pod bound, p50", probe("running_to_bound", 50))
    row("Slurm RUNNING -> pod bound, p99", probe("running_to_bound", 99))
    add("  where RUNNING -> bound went, p50 / p99")
    for label, key in WAKE_LEGS:
        row(f"    {label}", [f"{a} / {b}" for a, b in zip(probe(key, 50), probe(key, 99), strict=True)])
