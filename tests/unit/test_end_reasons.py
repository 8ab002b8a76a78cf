"""Why a job ended under running pods, as the pod's Event and SlurmJobEnded condition say it."""

import json
from pathlib import Path
from typing import Any

import pytest

from bridge.models import END_REASONS, ENDED_JOB_STATES, JobEvent, end_reason

SPEC = Path(__file__).parents[2] / "bridge" / "slurm_api" / "openapi-v0.0.44.json"


def job_states_enum() -> list[str]:
    """Slurm's job_state enum (base states and flags), as v0.0.44's job_info declares it."""
    schema: dict[str, Any] = json.loads(SPEC.read_text())["components"]["schemas"]["v0.0.44_job_info"]
    return list(schema["properties"]["job_state"]["items"]["enum"])


# Slurm's base states (enum job_states in slurm.h) past PENDING, RUNNING and SUSPENDED.
BASE_END_STATES = [
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
]


@pytest.mark.parametrize(
    ("states", "reason", "words"),
    [
        (["PREEMPTED"], "PreemptedBySlurm", "preempted by Slurm for higher-priority work"),
        (["TIMEOUT"], "SlurmTimeLimit", "reached its Slurm time limit"),
        (["DEADLINE"], "SlurmTimeLimit", "reached its Slurm deadline"),
        (["CANCELLED"], "SlurmJobCancelled", "cancelled in Slurm"),
        (["NODE_FAIL"], "SlurmNodeFailure", "lost its node in Slurm"),
        (["BOOT_FAIL"], "SlurmNodeFailure", "could not boot its node in Slurm"),
        # With the flags Slurm adds while a job winds down: the base state decides.
        (["CANCELLED", "COMPLETING"], "SlurmJobCancelled", "cancelled in Slurm"),
        (["NODE_FAIL", "COMPLETING"], "SlurmNodeFailure", "lost its node in Slurm"),
        (["TIMEOUT", "COMPLETING"], "SlurmTimeLimit", "reached its Slurm time limit"),
        (["PREEMPTED", "COMPLETING"], "PreemptedBySlurm", "preempted by Slurm for higher-priority work"),
        # Ends of the job's own making: told as they are, with Slurm's state.
        (["COMPLETED"], "SlurmJobEnded", "ended in Slurm (COMPLETED)"),
        (["FAILED"], "SlurmJobEnded", "ended in Slurm (FAILED)"),
        (["FAILED", "LAUNCH_FAILED"], "SlurmJobEnded", "ended in Slurm (FAILED+LAUNCH_FAILED)"),
        (["OUT_OF_MEMORY"], "SlurmJobEnded", "ended in Slurm (OUT_OF_MEMORY)"),
        ([], "SlurmJobEnded", "ended in Slurm (UNKNOWN)"),
    ],
)
def test_end_reason_of_each_slurm_state(states: list[str], reason: str, words: str) -> None:
    assert end_reason(JobEvent(job_id=7, states=states)) == (reason, words)


def test_a_reason_from_slurm_is_part_of_the_generic_words() -> None:
    job = JobEvent(job_id=7, states=["FAILED"], reason="NonZeroExitCode")
    assert end_reason(job) == ("SlurmJobEnded", "ended in Slurm (FAILED (NonZeroExitCode))")


def test_a_job_slurm_forgot_is_gone_whatever_its_last_states() -> None:
    assert end_reason(JobEvent(job_id=7, states=[], gone=True)) == (
        "SlurmJobGone",
        "is no longer known to Slurm",
    )
    assert end_reason(JobEvent(job_id=7, states=["NODE_FAIL"], gone=True))[0] == "SlurmJobGone"


def test_every_mapped_state_is_a_slurm_end_state() -> None:
    enum = job_states_enum()
    assert set(BASE_END_STATES) <= set(enum), "the table above names states Slurm does not have"
    assert set(END_REASONS) <= set(enum)
    # A mapped state the job watcher did not count as an end would never reach end_reason.
    assert set(END_REASONS) <= ENDED_JOB_STATES
    assert set(BASE_END_STATES) == ENDED_JOB_STATES
