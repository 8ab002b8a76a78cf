"""The soak's counts (bench/soak.py), from made-up outcomes: no servers."""

from bench.soak import summarize, text
from testbed.kill_points import KillPoint, Kind, Outcome
from testbed.slurm_bed import BedJob

ENDED = BedJob(1, ("CANCELLED",), "placement/x/ns/p/u@u")


def outcome(kind: Kind, point: KillPoint, **facts: object) -> Outcome:
    nodes = {"a": "n1", "b": "n2"} if kind is Kind.GROUP else {"a": "n1"}
    base = Outcome("p", kind, point, pods=list(nodes), killed=True, nodes=nodes, jobs=[ENDED])
    for key, value in facts.items():
        setattr(base, key, value)
    return base


def test_clean_placements_count_as_neither_lost_nor_duplicated() -> None:
    summary = summarize(
        [outcome(Kind.POD, KillPoint.AFTER_BIND), outcome(Kind.GROUP, KillPoint.BEFORE_SUBMIT)], 10.0, 7
    )
    assert (summary["placements"], summary["pods"], summary["kills"]) == (2, 3, 2)
    assert (summary["lost"], summary["duplicated"], summary["problems"]) == (0, 0, [])
    assert summary["kills_by_point"] == {"after-bind": 1, "before-submit": 1}
    assert "lost        0" in text(summary)


def test_two_jobs_are_a_duplicate_and_an_unbound_pod_or_a_live_job_is_lost() -> None:
    live = BedJob(2, ("RUNNING",), ENDED.comment)
    summary = summarize(
        [
            outcome(Kind.POD, KillPoint.AFTER_SUBMIT, jobs=[ENDED, ENDED._replace(job_id=3)]),
            outcome(Kind.GROUP, KillPoint.AFTER_LABEL, nodes={"a": "n1"}),
            outcome(Kind.POD, KillPoint.DURING_CLEANUP, jobs=[live]),
            outcome(Kind.POD, KillPoint.AFTER_BIND, finalizers_left=["a"]),
        ],
        10.0,
        7,
    )
    assert (summary["duplicated"], summary["lost"]) == (1, 3)
    assert len(summary["problems"]) == 4


def test_a_placement_given_up_with_the_reason_on_its_pods_is_failed_not_lost() -> None:
    refused = outcome(
        Kind.POD, KillPoint.AFTER_LABEL, nodes={}, jobs=[], told={"a": "SlurmRejected"}, error="never bound"
    )
    silent = outcome(Kind.POD, KillPoint.AFTER_LABEL, nodes={}, jobs=[], error="never bound")
    summary = summarize([refused, silent], 10.0, 7)
    assert (summary["failed_told"], summary["lost"]) == (1, 1)
    assert summary["failed_reasons"] == {"SlurmRejected": 1}


def test_the_api_faults_injected_are_reported() -> None:
    faults = {"reads answered 500": 3, "watch drops": 2}
    summary = summarize([outcome(Kind.POD, KillPoint.AFTER_BIND)], 10.0, 7, faults=faults)
    assert summary["api_faults"] == faults
    assert "API faults  {'reads answered 500': 3, 'watch drops': 2}" in text(summary)
