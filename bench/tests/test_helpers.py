"""The benchmark's own helpers: pure functions and parsers, no servers (fast)."""

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

from bench.kube import KubeDriver, PodObserver, PodTimes
from bench.placement.cli import parse
from bench.placement.figures import pass_summary, recheck_day
from bench.placement.report_tables import BUDGET_ACTIONS, budget_line
from bench.placement.results import placement_rate
from bench.placement.scenarios import stats_delta
from bench.probes import (
    RequestStats,
    pids_by_comm,
    recheck_times,
    split_history,
    step_durations,
    wake_times,
)
from bench.slurm import SchedulerPass, _note_reason, scheduler_passes
from bridge import keys
from bridge.slurm_api.v0044 import V0044JobInfo
from testbed.history_cost import HistoryCost, history_cost


def test_recheck_times_double_up_to_the_cap() -> None:
    minutes = [t / 60 for t in recheck_times(600, 6 * 3600, 86_400)]
    assert minutes == [10, 30, 70, 150, 310, 630, 990, 1350]


def test_recheck_day_counts_the_first_and_the_later_days() -> None:
    day = recheck_day(per_recheck_actions=2.0, per_recheck_events=11.0)
    assert day["rechecks_first_day"] == 8
    assert day["actions_first_day"] == 17  # 8 x (timer + check_job) + the timer running at midnight
    assert day["rechecks_later_day"] == 4
    assert day["actions_later_day"] == 8


def _event(kind: "EventType.ValueType", at: float) -> HistoryEvent:
    event = HistoryEvent(event_type=kind)
    event.event_time.seconds = int(at)
    event.event_time.nanos = int((at - int(at)) * 1e9)
    return event


def test_split_history_puts_the_window_apart() -> None:
    events = [
        _event(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED, 100.0),
        _event(EventType.EVENT_TYPE_TIMER_STARTED, 100.5),
        _event(EventType.EVENT_TYPE_TIMER_STARTED, 110.0),
        _event(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, 119.9),
        _event(EventType.EVENT_TYPE_TIMER_STARTED, 120.0),
    ]
    own, waiting = split_history(events, 110.0, 120.0)
    assert (own.events, own.billable_actions) == (3, 3)
    assert (waiting.events, waiting.billable_actions) == (2, 2)
    assert waiting.actions == Counter({"timer": 1, "signal": 1})


def test_step_durations_follow_the_path_to_bound() -> None:
    ev = EventType

    def event(event_id: int, kind: "EventType.ValueType", at: float) -> HistoryEvent:
        made = _event(kind, at)
        made.event_id = event_id
        return made

    def scheduled(event_id: int, name: str, at: float) -> HistoryEvent:
        made = event(event_id, ev.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, at)
        made.activity_task_scheduled_event_attributes.activity_type.name = name
        return made

    def started(event_id: int, of: int, at: float) -> HistoryEvent:
        made = event(event_id, ev.EVENT_TYPE_ACTIVITY_TASK_STARTED, at)
        made.activity_task_started_event_attributes.scheduled_event_id = of
        return made

    def completed(event_id: int, of: int, at: float) -> HistoryEvent:
        made = event(event_id, ev.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, at)
        made.activity_task_completed_event_attributes.scheduled_event_id = of
        return made

    def signal(event_id: int, name: str, at: float) -> HistoryEvent:
        made = event(event_id, ev.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, at)
        made.workflow_execution_signaled_event_attributes.signal_name = name
        return made

    history = [
        event(1, ev.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED, 10.000),
        event(3, ev.EVENT_TYPE_WORKFLOW_TASK_STARTED, 10.010),
        scheduled(5, "prepare_and_submit", 10.020),
        started(6, 5, 10.025),
        completed(7, 5, 10.100),
        signal(8, "pod_changed", 10.150),  # not the job's news: not the bind path
        event(10, ev.EVENT_TYPE_WORKFLOW_TASK_STARTED, 10.160),
        signal(12, "job_changed", 10.400),
        event(14, ev.EVENT_TYPE_WORKFLOW_TASK_STARTED, 10.420),
        scheduled(16, "bind", 10.430),
        started(17, 16, 10.432),
        completed(18, 16, 10.500),
    ]
    steps = step_durations(history)
    expected = {
        "start_to_task": 0.010,
        "task_to_submit": 0.015,
        "submit_runs": 0.075,
        "signal_to_task": 0.020,
        "task_to_bind": 0.012,
        "bind_runs": 0.068,
    }
    assert steps.keys() == expected.keys()
    for key, seconds in expected.items():
        assert abs(steps[key] - seconds) < 1e-6, (key, steps[key])


def test_budget_line_leaves_out_placements_with_a_pending_reason() -> None:
    lines: list[str] = []
    plain = HistoryCost(
        events=33, actions=Counter({"start": 1, "activity": 3, "signal": 2, "upsert": 1, "timer": 1})
    )
    pending = HistoryCost(
        events=44, actions=Counter({"activity": 9}), activities=Counter({"report_pending": 1})
    )
    budget_line("burst", [plain, pending], lines.append)
    everyone, budget = lines
    assert "all 2 placements: actions 8.50, events 38.5" in everyone
    assert "1 of 2 placements" in budget
    assert f"actions {BUDGET_ACTIONS:.2f}" in budget
    assert budget.endswith("within")


def test_stats_delta_keeps_what_grew() -> None:
    then, now = RequestStats(), RequestStats()
    then.count["GET /jobs/state/"] = 2
    now.count.update({"GET /jobs/state/": 5, "GET /jobs/": 1})
    now.bytes_in.update({"GET /jobs/state/": 500, "GET /jobs/": 100})
    delta = stats_delta(now, then)
    assert delta.count == Counter({"GET /jobs/state/": 3, "GET /jobs/": 1})


def test_placement_rate_is_pods_over_first_created_to_last_bound() -> None:
    pods = [PodTimes("a", created=10.0, bound=11.0), PodTimes("b", created=10.5, bound=12.0)]
    assert placement_rate(pods) == 1.0
    assert placement_rate([PodTimes("c", created=10.0)]) is None


def test_note_reason_keeps_each_pending_reason_once() -> None:
    reasons: dict[int, list[str]] = {}
    for state, reason in (
        ("PENDING", "None"),
        ("PENDING", "Priority"),
        ("PENDING", "Priority"),
        ("RUNNING", ""),
    ):
        _note_reason(reasons, V0044JobInfo(job_id=7, job_state=[state], state_reason=reason))
    assert reasons == {7: ["None", "Priority"]}


def test_observer_stamps_claim_label_binding_and_release() -> None:
    pods = {"p": PodTimes("p", uid="u1")}
    told: list[tuple[str, str]] = []
    observer = PodObserver(
        KubeDriver("http://127.0.0.1:9"), "ns", pods, lambda name, what: told.append((name, what))
    )
    meta = {"name": "p", "uid": "u1", "finalizers": [keys.FINALIZER]}
    observer._see({"metadata": meta}, 1.0)
    observer._see({"metadata": {**meta, "labels": {keys.LABEL_SLURM_JOB_ID: "42"}}}, 2.0)
    observer._see({"metadata": meta, "spec": {"nodeName": "n1"}}, 3.0)
    observer._see({"metadata": {"name": "p", "uid": "u1"}, "spec": {"nodeName": "n1"}}, 4.0)
    observer._see({"metadata": {"name": "p", "uid": "other"}}, 5.0)  # a namesake: ignored
    times = pods["p"]
    assert (times.claimed, times.labelled, times.bound, times.released) == (1.0, 2.0, 3.0, 4.0)
    assert (times.job_id, times.node) == (42, "n1")
    assert told == [("p", "labelled"), ("p", "bound")]
    assert observer._kubelet.get_nowait() == "p"  # the kubelet turns it Running, then says so


def test_parse_pending_defaults() -> None:
    options = parse(["--scenario", "pending"])
    assert (options.pods, options.nodes, options.cpus, options.reference, options.paced) == (1000, 1, 1, 0, 0)
    batch = parse(["--pods", "30", "--foreign-jobs", "5000"])
    assert (batch.pods, batch.reference, batch.paced, batch.foreign_jobs) == (30, 30, 30, 5000)


def test_parse_site_defaults_and_levels() -> None:
    site = parse(["--scenario", "site"])
    assert (site.levels, site.pods, site.nodes, site.cpus) == ((100, 1000, 10000), 10000, 1000, 5)
    assert (site.reference, site.paced, site.probes, site.timeout) == (1000, 0, 100, 3600)
    assert parse(["--scenario", "site", "--reference", "0"]).reference == 0
    assert (site.followers, parse(["--scenario", "site", "--follower"]).followers) == (0, 1)
    assert parse(["--followers", "2"]).followers == 2
    assert parse(["--scenario", "site", "--levels", "5,50"]).pods == 50
    for bad in ("1000,100", "100,x", "0,10"):
        with pytest.raises(SystemExit):
            parse(["--scenario", "site", "--levels", bad])


def _local_activity_marker(event_id: int, activity_type: str, at: float) -> HistoryEvent:
    made = _event(EventType.EVENT_TYPE_MARKER_RECORDED, at)
    made.event_id = event_id
    attributes = made.marker_recorded_event_attributes
    attributes.marker_name = "core_local_activity"
    recorded = json.dumps({"seq": 1, "attempt": 1, "activity_id": "1", "activity_type": activity_type})
    attributes.details["data"].payloads.add(data=recorded.encode())
    return made


def test_a_local_bind_is_one_action_per_workflow_task_and_its_task_is_timed() -> None:
    ev = EventType

    def event(event_id: int, kind: "EventType.ValueType", at: float) -> HistoryEvent:
        made = _event(kind, at)
        made.event_id = event_id
        return made

    signalled = event(8, ev.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, 10.400)
    signalled.workflow_execution_signaled_event_attributes.signal_name = "job_changed"
    history = [
        event(1, ev.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED, 10.000),
        signalled,
        event(10, ev.EVENT_TYPE_WORKFLOW_TASK_STARTED, 10.420),
        event(11, ev.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, 10.530),
        _local_activity_marker(12, "bind", 10.530),
        _local_activity_marker(13, "tell_pods", 10.530),  # same task: the server counts one action
        event(15, ev.EVENT_TYPE_WORKFLOW_TASK_STARTED, 11.000),
        event(16, ev.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, 11.010),
        _local_activity_marker(17, "release", 11.010),
    ]
    cost = history_cost(history)
    assert cost.actions["local activities"] == 2
    assert cost.activities == Counter({"bind": 1, "tell_pods": 1, "release": 1})
    steps = step_durations(history)
    assert abs(steps["task_with_local_bind"] - 0.110) < 1e-6
    assert "task_to_bind" not in steps


def test_wake_times_follow_the_job_signal_to_the_task_that_bound() -> None:
    ev = EventType

    def signal(name: str, at: float) -> HistoryEvent:
        made = _event(ev.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, at)
        made.workflow_execution_signaled_event_attributes.signal_name = name
        return made

    history = [
        _event(ev.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED, 10.000),
        _event(ev.EVENT_TYPE_WORKFLOW_TASK_STARTED, 10.010),  # before any job news
        _event(ev.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, 10.050),
        signal("pod_changed", 10.300),
        signal("job_changed", 10.400),
        _event(ev.EVENT_TYPE_WORKFLOW_TASK_STARTED, 10.420),
        _event(ev.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, 10.530),
        _local_activity_marker(12, "bind", 10.530),
        signal("job_changed", 12.000),  # a later change: not the one that woke the bind
        _event(ev.EVENT_TYPE_WORKFLOW_TASK_STARTED, 12.010),
        _event(ev.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, 12.020),
        _local_activity_marker(17, "release", 12.020),
    ]
    times = wake_times(history)
    expected = {"signal": 10.400, "task_started": 10.420, "bound_task_completed": 10.530}
    assert times.keys() == expected.keys()
    assert all(abs(times[key] - at) < 1e-6 for key, at in expected.items()), times


def test_job_starts_are_grouped_into_the_scheduling_passes_that_made_them() -> None:
    starts = [
        (10.700, "backfill"),
        (10.701, "backfill"),
        (10.790, "backfill"),  # 89 ms after the first, 89 after the previous: a pass of its own
        (11.000, "main"),
        (11.020, "main"),
        (11.030, "backfill"),  # as close, but another scheduler
        (11.700, "backfill"),
    ]
    passes = scheduler_passes(reversed(starts))  # the log's order does not matter
    assert [(p.at, p.jobs, p.scheduler) for p in passes] == [
        (10.700, 2, "backfill"),
        (10.790, 1, "backfill"),
        (11.000, 2, "main"),
        (11.030, 1, "backfill"),
        (11.700, 1, "backfill"),
    ]


def test_a_pass_may_take_longer_than_the_gap_that_separates_passes() -> None:
    # 40 ms between consecutive starts, 160 ms from first to last: one pass.
    passes = scheduler_passes((10.0 + 0.04 * i, "main") for i in range(5))
    assert [(p.jobs, p.last) for p in passes] == [(5, 10.16)]


def test_the_closed_loop_ceiling_is_the_slots_times_the_passes_per_second() -> None:
    passes = [SchedulerPass(at=float(t), jobs=20, scheduler="backfill") for t in (100, 101, 102, 103, 104)]
    passes[2].scheduler = "main"
    summary = pass_summary(passes, concurrency=20)
    assert summary == {
        "passes": 5,
        "main": 1,
        "backfill": 4,
        "jobs_per_pass": 20.0,
        "per_second": 1.0,
        "ceiling": 20.0,
        "fill": 1.0,
    }
    assert pass_summary(passes[:1], concurrency=20) is None


def test_a_process_is_found_by_the_name_on_its_command_line_too() -> None:
    # slurmctld after `scontrol reconfigure`: command name slurmctld-wlm, command line slurmctld.
    # `cat` reading a pipe lives until the pipe closes.
    process = subprocess.Popen(
        ["bench-probe-name"], executable="/bin/cat", stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert process.stdin is not None
    assert process.stdout is not None
    try:
        # Popen may return before the child has exec'd (seen under load: command name "python",
        # an empty command line); cat's echo says it runs.
        process.stdin.write(b"ready\n")
        process.stdin.flush()
        assert process.stdout.readline() == b"ready\n"
        assert process.pid in pids_by_comm("bench-probe-name")
        assert process.pid in pids_by_comm("cat")
        assert process.pid not in pids_by_comm("bench-probe-name", root=Path("/nonexistent"))
    finally:
        process.communicate()
