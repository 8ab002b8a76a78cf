"""bench/sizing.py's figures: what each sizing asks Slurm to hold against what the pods request."""

from bench.sizing import MIX, job_for, report, reserved, rows


def test_per_pod_sizing_holds_what_the_pods_request_and_largest_pod_sizing_no_less() -> None:
    table = rows()
    assert [row.workload for row in table] == list(MIX)
    for row in table:
        assert row.per_pod == row.requested, row.workload
        for field in ("cpus", "memory_mib", "gpus"):
            assert getattr(row.largest_pod, field) >= getattr(row.requested, field), row.workload
    uniform = next(row for row in table if row.workload.startswith("uniform"))
    assert (uniform.components, uniform.largest_pod) == (1, uniform.requested)
    mixed = [row for row in table if row.components > 1]
    assert mixed
    assert all(row.largest_pod != row.requested for row in mixed)


def test_the_report_prints_a_line_per_workload_and_the_whole_mix() -> None:
    text = report(rows())
    for workload in MIX:
        assert workload in text
    assert "the whole mix" in text
    assert "held for nothing under largest-pod sizing" in text


def test_reserved_counts_every_component_node_by_node() -> None:
    job = job_for(MIX["LeaderWorkerSet: 2-CPU leader, 8 workers of 8 GPUs"], "per-pod")
    assert [c.nodes for c in job.components] == ["8", "1"]  # the GPU component first
    assert reserved(job).gpus == 64
    assert reserved(job).cpus == 2 + 8 * 32
