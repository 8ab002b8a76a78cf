"""The test bed's own promises (hack/slurm-sid.sh, docs/slurm-testbed.md): preemption
partitions, GPUs that are really allocated, foreign jobs, job starts in the log."""

from __future__ import annotations

import re
import secrets
from typing import Any

import pytest

from testbed.slurm_bed import (
    DEFAULT_PARTITION,
    HIGH_PARTITION,
    LOW_PARTITION,
    SlurmTestBed,
)
from testbed.waiting import wait_until
from tests.slurm.conftest import BridgeNodes, MakeBridgeNodes

pytestmark = pytest.mark.slurm
SCHEDULED = 15.0  # seconds for slurmctld (a scheduling pass each second) to start a job, on a busy machine


def state(nodes: BridgeNodes, job_id: int) -> list[str]:
    return list(nodes.job(job_id)["job_state"])


def running(nodes: BridgeNodes, job_id: int) -> dict[str, Any] | None:
    job = nodes.job(job_id)
    return job if job["job_state"] == ["RUNNING"] else None


def passed_over(nodes: BridgeNodes, job_id: int) -> dict[str, Any] | None:
    """The job, once two scheduling passes after its submission left it pending (else None)."""
    job = nodes.job(job_id)
    evaluated = job["last_sched_evaluation"]["number"] >= job["submit_time"]["number"] + 2
    return job if evaluated and job["state_reason"] == "Resources" else None


def settings(text: str) -> dict[str, str]:
    """`Key=Value` words of scontrol's plain output ("Key = Value" lines of `show config` too)."""
    words = re.findall(r"(\w+)\s*=\s*(\S+)", text)
    return dict(words)


def test_slurm_conf_settings(slurm_bed: SlurmTestBed) -> None:
    config = settings(slurm_bed.scontrol("show", "config"))
    assert config["MaxJobCount"] == "100000"
    assert config["MaxNodeCount"] == "4096"
    assert config["GresTypes"] == "gpu"
    assert config["PreemptType"] == "preempt/partition_prio"
    assert config["PreemptMode"] == "CANCEL"
    assert config["LogTimeFormat"] == "iso8601_ms"

    # (REST's partition objects carry no preemption mode in v0.0.44.)
    shape = {}
    for name in (DEFAULT_PARTITION, LOW_PARTITION, HIGH_PARTITION):
        partition = settings(slurm_bed.scontrol("show", "partition", name))
        shape[name] = tuple(partition[key] for key in ("Default", "PriorityTier", "PreemptMode", "GraceTime"))
        assert partition["NodeSets"] == "bridge_nodes"
    assert shape == {
        DEFAULT_PARTITION: ("YES", "1", "OFF", "0"),
        LOW_PARTITION: ("NO", "1", "CANCEL", "0"),
        HIGH_PARTITION: ("NO", "10", "OFF", "0"),
    }


def test_high_job_preempts_low_job(bridge_nodes: MakeBridgeNodes, slurm_bed: SlurmTestBed) -> None:
    nodes = bridge_nodes("")
    low = nodes.submit(LOW_PARTITION, cpus_per_task=4)  # the whole node
    wait_until(lambda: running(nodes, low), f"low job {low} running", timeout=SCHEDULED)

    high = nodes.submit(HIGH_PARTITION, cpus_per_task=4)
    started = wait_until(lambda: running(nodes, high), f"high job {high} running", timeout=SCHEDULED)

    assert started["nodes"] == nodes.names[0]
    preempted = nodes.job(low)
    assert preempted["job_state"] == ["PREEMPTED"]  # straight from RUNNING: no grace, no COMPLETING
    assert preempted["preempt_time"]["number"] == preempted["end_time"]["number"] > 0
    # Both starts are in slurmctld's log, to the millisecond, in order.
    starts = wait_until(
        lambda: found if len(found := slurm_bed.job_start_times([low, high])) == 2 else None,
        "both starts logged",
        timeout=SCHEDULED,
    )
    assert starts[low] <= starts[high]
    log = slurm_bed.slurmctld_log.read_text(errors="replace")
    assert f"preempted JobId={low} has been killed to reclaim resources for JobId={high}" in log


def test_default_partition_is_never_preempted(bridge_nodes: MakeBridgeNodes) -> None:
    nodes = bridge_nodes("")
    default = nodes.submit(DEFAULT_PARTITION, cpus_per_task=4)
    wait_until(lambda: running(nodes, default), f"job {default} running", timeout=SCHEDULED)

    high = nodes.submit(HIGH_PARTITION, cpus_per_task=4)
    wait_until(lambda: passed_over(nodes, high), f"high job {high} passed over twice", timeout=20)

    assert state(nodes, default) == ["RUNNING"]
    assert state(nodes, high) == ["PENDING"]
    # Same tier: a bridge-low job waits as well.
    low = nodes.submit(LOW_PARTITION, cpus_per_task=4)
    wait_until(lambda: passed_over(nodes, low), f"low job {low} passed over twice", timeout=20)
    assert state(nodes, default) == ["RUNNING"]


def test_gpu_jobs_go_only_where_enough_gpus_are_free(
    bridge_nodes: MakeBridgeNodes, slurm_bed: SlurmTestBed
) -> None:
    nodes = bridge_nodes("gpu:1", "gpu:4")
    small, big = nodes.names
    for name, gres in ((small, "gpu:1"), (big, "gpu:4")):
        node = slurm_bed.rest("GET", f"/node/{name}").json()["nodes"][0]
        assert (node["gres"], node["gres_used"]) == (gres, "gpu:0")

    # Both ways of writing a per-node GPU count work ("gpu:2" alone is refused: error 2115).
    three = nodes.submit(DEFAULT_PARTITION, tres_per_node="gres/gpu:3")
    job = wait_until(lambda: running(nodes, three), f"3-GPU job {three} running", timeout=SCHEDULED)
    assert (job["nodes"], job["gres_detail"]) == (big, ["gpu:3(IDX:0-2)"])

    # One GPU free on each node: a 2-GPU job waits, on neither node.
    two = nodes.submit(DEFAULT_PARTITION, tres_per_node="gres/gpu=2")
    wait_until(lambda: passed_over(nodes, two), f"2-GPU job {two} passed over twice", timeout=20)
    assert state(nodes, two) == ["PENDING"]

    slurm_bed.cancel_job(three)
    job = wait_until(lambda: running(nodes, two), f"2-GPU job {two} running", timeout=SCHEDULED)
    assert (job["nodes"], job["gres_detail"]) == (big, ["gpu:2(IDX:0-1)"])
    layout = slurm_bed.rest("GET", f"/resources/{two}").json()["nodes"]
    assert [(n["node"], n["gres"]) for n in layout] == [
        (big, [{"name": "gpu", "type": "", "count": 2, "index": "0-1"}])
    ]
    another = nodes.submit(DEFAULT_PARTITION, tres_per_node="gres/gpu:2")
    job = wait_until(lambda: running(nodes, another), f"2-GPU job {another} running", timeout=SCHEDULED)
    assert (job["nodes"], job["gres_detail"]) == (big, ["gpu:2(IDX:2-3)"])

    # The small node still takes what fits it.
    one = nodes.submit(DEFAULT_PARTITION, tres_per_node="gres/gpu:1")
    job = wait_until(lambda: running(nodes, one), f"1-GPU job {one} running", timeout=SCHEDULED)
    assert (job["nodes"], job["gres_detail"]) == (small, ["gpu:1(IDX:0)"])


def test_gpu_count_is_fixed_once_registered(bridge_nodes: MakeBridgeNodes, slurm_bed: SlurmTestBed) -> None:
    # The price of gres.conf's device files (docs/slurm-testbed.md): same count or 0 only.
    (name,) = bridge_nodes("gpu:2").names
    same = slurm_bed.rest("POST", f"/node/{name}", {"gres": "gpu:2"})
    assert same.status_code == 200
    other = slurm_bed.rest("POST", f"/node/{name}", {"gres": "gpu:4"})
    assert other.status_code == 422
    assert [e["error_number"] for e in other.json()["errors"]] == [2072]  # ESLURM_INVALID_GRES


def test_foreign_jobs(slurm_bed: SlurmTestBed) -> None:
    name = f"foreign-{secrets.token_hex(4)}"
    ids = slurm_bed.submit_foreign_jobs(20, name=name)
    own = None
    try:
        assert len(set(ids)) == 20
        assert set(slurm_bed.job_states(ids).values()) == {("PENDING",)}
        job = slurm_bed.rest("GET", f"/job/{ids[0]}").json()["jobs"][0]
        assert job["user_name"] == slurm_bed.foreign_user.name != slurm_bed.user_name
        assert (job["name"], job["state_reason"], job["priority"]["number"]) == (name, "JobHeldUser", 0)
        assert "EXTERNAL_JOB" in job["flags"]

        # A job of the bridge's user, same name: cancelling foreign jobs leaves it alone.
        body = {
            "job": {
                "name": name,
                "flags": ["EXTERNAL_JOB"],
                "hold": True,
                "nodes": "1",
                "partition": DEFAULT_PARTITION,
                "current_working_directory": "/tmp",
            }
        }
        own = int(slurm_bed.rest("POST", "/job/submit", body).json()["job_id"])
        slurm_bed.cancel_foreign_jobs(name=name)

        states = slurm_bed.job_states([*ids, own])
        assert {states[job_id] for job_id in ids} == {("CANCELLED",)}
        assert states[own] == ("PENDING",)
        slurm_bed.cancel_foreign_jobs(ids)  # ended jobs are fine

        # The bridge's user's own jobs, in bulk: ended ones of others in the list are fine.
        slurm_bed.cancel_jobs([*ids, own])
        assert slurm_bed.job_states([own])[own] == ("CANCELLED",)
    finally:
        slurm_bed.cancel_foreign_jobs(ids)
        if own is not None:
            slurm_bed.cancel_job(own)


def test_job_start_log_line(bridge_nodes: MakeBridgeNodes, slurm_bed: SlurmTestBed) -> None:
    nodes = bridge_nodes("")
    job_id = nodes.submit(DEFAULT_PARTITION)
    job = wait_until(lambda: running(nodes, job_id), f"job {job_id} running", timeout=SCHEDULED)
    starts = wait_until(lambda: slurm_bed.job_start_times([job_id]), "start logged", timeout=SCHEDULED)
    # Slurm's own start_time has whole seconds only, from the clock at the start of the
    # scheduling pass: a pass that began at x.999 logs at (x+1).00y.
    assert 0 <= starts[job_id].timestamp() - job["start_time"]["number"] < 2
    line = next(
        line
        for line in slurm_bed.slurmctld_log.read_text(errors="replace").splitlines()
        if re.search(rf"JobId={job_id}\b.* (NodeList=|on ){nodes.names[0]}", line)
    )
    assert re.match(r"\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\] ", line), line
