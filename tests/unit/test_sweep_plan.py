"""The orphan sweep's decisions, its facts, its schedule and its setting: pure parts only."""

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import ScheduleActionStartWorkflow, ScheduleIntervalSpec, ScheduleOverlapPolicy

from bridge import keys
from bridge.models import PodRef, admin_comment_for
from bridge.sweep import JobFacts, PodFacts, SweepAction, SweepRequest, job_facts, plan, pod_facts
from worker.schedules import sweep_schedule, sweep_schedule_id
from worker.settings import ConfigurationError, load_settings
from workflows.sweep import summary

NS = "team-a"
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def pid(name: str, installation: str = "prod", generation: str = "") -> str:
    return f"placement/{installation}/{NS}/{name}/u-{name}@{generation or 'u-' + name}"


def wid(name: str, installation: str = "prod") -> str:
    return f"placement/{installation}/{NS}/{name}/u-{name}"


def pod(
    name: str,
    *,
    claim: str | None = "own",
    finalizer: bool = True,
    bound: bool = True,
    terminal: bool = False,
    deleting: bool = False,
    overdue: bool = False,
    job_id: int | None = 7,
) -> PodFacts:
    return PodFacts(
        pod=PodRef(namespace=NS, name=name, uid=f"u-{name}"),
        claim=pid(name) if claim == "own" else claim,
        finalizer=finalizer,
        bound=bound,
        terminal=terminal,
        deleting=deleting,
        overdue=overdue,
        job_id=job_id,
    )


def job(name: str, job_id: int = 7, *, live: bool = True, pods: list[str] | None = None) -> JobFacts:
    return JobFacts(
        job_id=job_id,
        placement_id=pid(name),
        pods=pods or [f"{NS}/{name}"],
        live=live,
        summary="RUNNING" if live else "CANCELLED",
    )


def kinds(actions: list[SweepAction]) -> list[tuple[str, int | None, list[str]]]:
    return [(a.kind, a.job_id, [p.name for p in a.pods]) for a in actions]


# -- plan --------------------------------------------------------------------------


def test_a_bound_pod_with_a_live_job_and_no_running_placement_is_adopted() -> None:
    actions, skipped = plan([pod("a")], {7: job("a")}, {wid("a"): False})
    assert kinds(actions) == [("adopt", 7, ["a"])]
    assert actions[0].placement_id == pid("a")
    assert skipped == []


def test_nothing_is_done_while_the_placement_runs() -> None:
    facts = [pod("a", deleting=True, overdue=True)]
    assert plan(facts, {7: job("a")}, {wid("a"): True}) == ([], [])
    assert plan([pod("b", deleting=True)], {7: None}, {wid("b"): True}) == ([], [])


def test_a_placement_nobody_asked_about_counts_as_running() -> None:
    assert plan([pod("a", deleting=True)], {7: None}, {}) == ([], [])
    assert plan([], {7: job("a")}, {}) == ([], [])


def test_a_job_whose_pods_are_gone_is_cancelled() -> None:
    actions, _ = plan([], {7: job("a")}, {wid("a"): False})
    assert kinds(actions) == [("cancel", 7, [])]


@pytest.mark.parametrize(
    "facts",
    [
        pod("a", terminal=True),  # finished
        pod("a", deleting=True, bound=False),  # deleted before it was bound
        pod("a", deleting=True, overdue=True),  # deleted, past grace period + slack
        pod("a", claim=pid("a", generation="u-other")),  # a namesake claimed by another generation
        pod("a", claim=None),  # not claimed at all
    ],
)
def test_a_job_none_of_whose_pods_needs_it_is_cancelled(facts: PodFacts) -> None:
    actions, _ = plan([facts], {7: job("a")}, {wid("a"): False})
    assert [a.kind for a in actions][:1] == ["cancel"]


def test_the_finalizer_of_a_deleted_pod_goes_after_its_job_is_cancelled() -> None:
    actions, _ = plan([pod("a", deleting=True, overdue=True)], {7: job("a")}, {wid("a"): False})
    assert kinds(actions) == [("cancel", 7, ["a"]), ("drop_finalizer", 7, ["a"])]


def test_a_bound_pod_deleted_within_its_grace_period_keeps_its_job() -> None:
    actions, skipped = plan([pod("a", deleting=True)], {7: job("a")}, {wid("a"): False})
    assert actions == []
    assert len(skipped) == 1
    assert "7" in skipped[0]


@pytest.mark.parametrize("jobs", [{7: None}, {7: job("a", live=False)}, {7: job("other")}])
def test_the_finalizer_of_a_deleted_pod_whose_job_is_over_or_not_its_own_goes(
    jobs: dict[int, JobFacts | None],
) -> None:
    actions, _ = plan([pod("a", deleting=True)], jobs, {wid("a"): False, wid("other"): True})
    assert kinds(actions) == [("drop_finalizer", 7, ["a"])]


def test_the_finalizer_of_a_deleted_pod_that_never_had_a_job_goes() -> None:
    actions, _ = plan([pod("a", deleting=True, job_id=None)], {}, {wid("a"): False})
    assert kinds(actions) == [("drop_finalizer", None, ["a"])]
    assert "never had a Slurm job" in actions[0].reason


def test_a_pod_whose_job_was_not_read_is_left_alone() -> None:
    actions, skipped = plan([pod("a", deleting=True)], {}, {wid("a"): False})
    assert actions == []
    assert "was not read" in skipped[0]


def test_pods_not_being_deleted_and_pods_of_older_bridges_keep_their_finalizer() -> None:
    facts = [pod("a", terminal=True), pod("b", claim=None, deleting=True, job_id=None)]
    actions, skipped = plan(facts, {7: None}, {wid("a"): False})
    assert actions == []
    assert [s.split(":")[0] for s in skipped] == [f"pod {NS}/a", f"pod {NS}/b"]


def test_a_group_with_a_pod_missing_is_not_adopted() -> None:
    group = job("a", pods=[f"{NS}/a", f"{NS}/b"])
    actions, skipped = plan([pod("a")], {7: group}, {wid("a"): False})
    assert actions == []
    assert "only some of its pods" in skipped[0]


def test_a_whole_group_is_adopted_in_the_jobs_order() -> None:
    group = JobFacts(job_id=9, placement_id=pid("a"), pods=[f"{NS}/b", f"{NS}/a"], live=True)
    facts = [pod("a", job_id=9), pod("b", claim=pid("a"), job_id=9)]
    actions, _ = plan(facts, {9: group}, {wid("a"): False})
    assert kinds(actions) == [("adopt", 9, ["b", "a"])]


def test_an_ended_job_is_not_cancelled_again() -> None:
    assert plan([], {7: job("a", live=False)}, {wid("a"): False}) == ([], [])


# -- facts -----------------------------------------------------------------------------


def k8s_pod(**meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": NS, "name": "a", "uid": "u-a", **meta},
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Running"},
    }


def test_pod_facts_keep_this_installations_pods_only() -> None:
    claimed = {keys.ANNOTATION_PLACEMENT: pid("a")}
    facts = pod_facts(
        k8s_pod(annotations=claimed, finalizers=[keys.FINALIZER], labels={keys.LABEL_SLURM_JOB_ID: "7"}),
        "prod",
        60,
        NOW,
    )
    assert facts is not None
    assert (facts.claim, facts.finalizer, facts.bound, facts.job_id) == (pid("a"), True, True, 7)
    other = {keys.ANNOTATION_PLACEMENT: pid("a", installation="staging")}
    assert pod_facts(k8s_pod(annotations=other, finalizers=[keys.FINALIZER]), "prod", 60, NOW) is None
    assert pod_facts(k8s_pod(), "prod", 60, NOW) is None  # nothing of the bridge on it


def test_a_pod_is_overdue_after_its_grace_period_plus_the_slack() -> None:
    # deletionTimestamp is the time of the delete request plus the grace period.
    stamp = (NOW - timedelta(seconds=59)).strftime("%Y-%m-%dT%H:%M:%SZ")
    deleted = k8s_pod(deletionTimestamp=stamp, finalizers=[keys.FINALIZER])
    facts = pod_facts(deleted, "prod", 60, NOW)
    assert facts is not None
    assert facts.deleting
    assert not facts.overdue
    assert pod_facts(deleted, "prod", 60, NOW + timedelta(seconds=1)).overdue  # type: ignore[union-attr]


def slurm_job(comment: str | None, admin_comment: str | None, state: str = "RUNNING") -> dict[str, Any]:
    return {"job_id": 7, "job_state": [state], "comment": comment, "admin_comment": admin_comment}


def test_job_facts_keep_this_installations_bridge_jobs_only() -> None:
    pods = admin_comment_for([f"{NS}/a"])
    facts = job_facts(slurm_job(pid("a"), pods), "prod")
    assert facts == JobFacts(job_id=7, placement_id=pid("a"), pods=[f"{NS}/a"], live=True, summary="RUNNING")
    assert job_facts(slurm_job(pid("a"), pods, "CANCELLED"), "prod").live is False  # type: ignore[union-attr]
    assert job_facts(slurm_job(pid("a", installation="staging"), pods), "prod") is None
    assert job_facts(slurm_job(pid("a"), None), "prod") is None  # no bridge admin_comment: not ours
    assert job_facts(slurm_job(pid("a"), '{"pods": [], "x": 1}'), "prod") is None
    assert job_facts(slurm_job(f"placement/{NS}/a/u-a", pods), "prod") is None  # no placement id
    assert job_facts(slurm_job("batch", pods), "prod") is None


# -- the workflow's summaries, the schedule, the setting ---------------------------------


def test_heal_summaries_say_what_the_batch_does() -> None:
    ref = PodRef(namespace=NS, name="a", uid="u")
    batch = [
        SweepAction(kind="adopt", placement_id=pid("a"), job_id=1, pods=[ref]),
        SweepAction(kind="cancel", placement_id=pid("a"), job_id=2),
        SweepAction(kind="cancel", placement_id=pid("a"), job_id=3),
        SweepAction(kind="drop_finalizer", placement_id=pid("a"), pods=[ref]),
    ]
    assert summary(batch) == "adopt 1 placement, cancel 2 jobs, drop 1 finalizer"


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "jwt"
    path.write_text("SLURM_JWT=secret-token-value\n")
    return path


def test_the_sweep_runs_every_ten_minutes_by_default_and_zero_turns_it_off(
    monkeypatch: pytest.MonkeyPatch, token_file: Path
) -> None:
    assert load_settings(slurm_jwt_file=token_file).sweep_interval == 600
    monkeypatch.setenv("SWEEP_INTERVAL", "0")
    assert load_settings(slurm_jwt_file=token_file).sweep_interval == 0
    for value in ("30", "-1", "86401", "often"):
        monkeypatch.setenv("SWEEP_INTERVAL", value)
        with pytest.raises(ConfigurationError, match="invalid setting SWEEP_INTERVAL"):
            load_settings(slurm_jwt_file=token_file)


def test_the_sweep_schedule_is_the_installations_own_and_never_piles_up(token_file: Path) -> None:
    settings = load_settings(
        slurm_jwt_file=token_file,
        sweep_interval=900,
        temporal_task_queue="bridge-q",
        scheduler_name="my-scheduler",
        installation_id="prod-a",
        deletion_slack=30,
    )
    assert sweep_schedule_id("prod-a") == "sweep/prod-a"
    start = datetime(2026, 1, 1, 0, 15, tzinfo=UTC)
    schedule = sweep_schedule(settings, start_at=start)
    assert schedule.spec.start_at == start
    [interval] = schedule.spec.intervals
    assert isinstance(interval, ScheduleIntervalSpec)
    assert interval.every.total_seconds() == 900
    assert schedule.policy.overlap == ScheduleOverlapPolicy.SKIP
    action = schedule.action
    assert isinstance(action, ScheduleActionStartWorkflow)
    assert action.workflow == "SweepWorkflow"
    assert action.id == "sweep/prod-a"
    assert action.task_queue == "bridge-q"
    assert list(action.args) == [
        SweepRequest(installation="prod-a", scheduler_name="my-scheduler", deletion_slack_seconds=30)
    ]
