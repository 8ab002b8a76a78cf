"""Every figure as JSON (`--json FILE`)."""

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from bench.placement.figures import mean, pass_summary, recheck_cost, recheck_day
from bench.placement.report_site import WAKE_LEGS
from bench.placement.results import Results
from bench.probes import STEP_ROWS, RequestStats, percentile
from bench.slurm import LISTING

KEYS = ("created_to_bound", "running_to_bound", *(key for _, key in WAKE_LEGS))  # a site level's probes


def to_json(r: Results) -> dict[str, Any]:
    def quantiles(values: Sequence[float]) -> dict[str, float | None]:
        return {f"p{q}": None if (v := percentile(values, q)) is None else v * 1000 for q in (50, 90, 99)} | {
            "n": float(len(values))
        }

    def per(stats: RequestStats, n: int) -> dict[str, dict[str, float]]:
        return {
            op: {
                "per_placement": count / n,
                "kib_per_request": stats.bytes_in[op] / count / 1024,
                "ms_per_request": stats.seconds[op] / count * 1000,
            }
            for op, count in stats.count.items()
        }

    n = len(r.whole.pods) or 1
    hold = (r.hold.end - r.hold.start) or 0.0
    slurm_total = sum(r.slurm_activities.count.values()) + sum(r.slurm_watcher.count.values())
    slurm_kib = (sum(r.slurm_activities.bytes_in.values()) + sum(r.slurm_watcher.bytes_in.values())) / 1024
    restd = r.whole.cpu.get("slurmrestd")
    return {
        "options": asdict(r.options),
        "started": r.started,
        "environment": r.environment,
        "slurm_jobs_at_start": r.slurm_jobs_at_start,
        "placement_rate": r.burst.rate,
        "reference_rate": r.reference_rate,
        "reference_rate_before": r.reference_before.rate if r.reference_before else None,
        "reference_rate_after": r.reference.rate if r.reference else None,
        "ratio": r.ratio,
        "paced_rate": r.paced_rate,
        "latencies_ms": {
            phase: {key: quantiles(values) for key, values in lat.items()}
            for phase, lat in r.latencies.items()
        },
        "steps_ms": {
            phase: {key: quantiles([step[key] for step in steps if key in step]) for _, key in STEP_ROWS}
            for phase, steps in r.steps.items()
        },
        "running_from_log": r.running_from_log,
        "slurm_passes": {
            phase: pass_summary(passes, r.options.concurrency) for phase, passes in r.passes.items()
        },
        "via_watcher": r.via_watcher,
        "pending_reasons_read": {phase: dict(c) for phase, c in r.reasons.items()},
        "budget": {
            phase: {
                "placements": len(plain),
                "actions_mean": mean([c.billable_actions for c in plain]),
                "actions_max": max([c.billable_actions for c in plain] or [0]),
                "events_mean": mean([c.events for c in plain]),
                "events_max": max([c.events for c in plain] or [0]),
            }
            for phase, costs in (("burst", r.costs), ("paced", r.paced_costs))
            for plain in [[c for c in costs if not c.activities.get("report_pending")]]
        },
        "history": {
            "events": mean([c.events for c in r.costs]),
            "bytes": mean([c.bytes for c in r.costs]),
            "actions": mean([c.billable_actions for c in r.costs]),
            "actions_by_kind": {
                kind: mean([c.actions.get(kind, 0) for c in r.costs])
                for kind in sorted({k for c in r.costs for k in c.actions})
            },
        },
        "server_actions_per_placement": sum(r.server_actions.values()) / n,
        "server_actions": r.server_actions,
        "server_requests": r.server_requests,
        "server_not_found": r.server_not_found,
        "slurm": {
            "activities": per(r.slurm_activities, n),
            "watcher": per(r.slurm_watcher, n),
            "requests_per_placement": slurm_total / n,
            "kib_per_placement": slurm_kib / n,
            "listings": r.slurm_activities.count.get(LISTING, 0) + r.slurm_watcher.count.get(LISTING, 0),
            "slurmrestd_cpu_ms_per_placement": None if restd is None else restd / n * 1000,
            "watcher_hold": {
                "seconds": hold,
                "passes_per_s": r.watcher_passes_hold / hold if hold else None,
                "requests_per_s": sum(r.slurm_hold.count.values()) / hold if hold else None,
                "kib_per_s": sum(r.slurm_hold.bytes_in.values()) / 1024 / hold if hold else None,
                "by_operation": dict(r.slurm_hold.count),
            },
        },
        "kube_requests_per_placement": {
            op: count / n for op, count in r.kube_requests.items() if not op.endswith("(watch)")
        },
        "kube_ms_per_request": {
            op: r.kube_seconds.get(op, 0.0) / count * 1000
            for op, count in r.kube_requests.items()
            if not op.endswith("(watch)")
        },
        "cpu": {
            "idle": r.idle.cpu,
            "watcher_paused": r.paused.cpu,
            "burst": r.burst.cpu,
            "whole": r.whole.cpu,
            "hold": r.hold.cpu,
            "paced": r.paced.cpu,
            "reference": r.reference_cpu,
        },
        "rss_kb": r.rss_kb,
        "rss_curve_kb": r.rss_curve,
        "in_flight": r.in_flight,
        "max_cached_workflows": r.cache_size,
        "max_concurrent_activities": r.activity_slots,
        "hold_actions": r.hold_actions,
        "waiting_per_placement": {
            "actions": mean([c.billable_actions for c in r.waiting_costs]),
            "events": mean([c.events for c in r.waiting_costs]),
            "rechecks": mean([c.activities.get("check_job", 0) for c in r.waiting_costs]),
        },
        "recheck_day": recheck_day(*recheck_cost(r)),
        "probes_ms": [{k: None if v is None else v * 1000 for k, v in p.items()} for p in r.probes],
        "pending_reasons": dict(r.pending_reasons),
        "site_levels": [
            {
                "live": v.live,
                "bound": v.bound,
                "fill_placements_per_s": v.fill_placements / v.fill_seconds if v.fill_seconds else None,
                "hold_seconds": v.hold_seconds,
                "hold_cpu_s": v.hold_cpu,
                "paused_seconds": v.paused_seconds,
                "paused_cpu_s": v.paused_cpu,
                "watcher_passes": v.watcher_passes,
                "watcher_requests": dict(v.watcher.count),
                "watcher_kib": sum(v.watcher.bytes_in.values()) / 1024,
                "hold_actions": v.hold_actions,
                "rss_worker_kb": v.rss_worker_kb,
                "rss_server_kb": v.rss_server_kb,
                "rss_follower_kb": v.rss_follower_kb,
                "probes": {
                    key: quantiles([x for d in v.probes if (x := d[key]) is not None]) for key in KEYS
                },
            }
            for v in r.site_levels
        ],
        "failures": r.failures,
        "notes": r.notes,
    }
