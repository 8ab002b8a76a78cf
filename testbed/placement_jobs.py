"""A one-pod placement's Slurm job as the bridge describes it, for the tests and benchmarks that
submit through `SlurmActivities` without a workflow (tests/slurm, bench/recovery.py)."""

from bridge.keys import EXTERNAL_JOB_FLAG
from bridge.models import JobDescription, NoValNumber, admin_comment_for


def one_pod_job(partition: str, pod: str) -> JobDescription:
    """An external job of one node, one CPU and 256 MiB for the pod `namespace/name`."""
    return JobDescription(
        name=pod,
        flags=[EXTERNAL_JOB_FLAG],
        admin_comment=admin_comment_for([pod]),
        partition=partition,
        nodes="1",
        minimum_nodes=1,
        maximum_nodes=1,
        cpus_per_task=1,
        memory_per_node=NoValNumber(number=256),
        time_limit=NoValNumber(number=60),
    )


def placement_id(scope: str, pod: str, token: str) -> str:
    """A placement id of the bridge's form (`placement/<scope>/<pod>/<uid>@<generation>`)."""
    return f"placement/{scope}/{pod}/uid-{token}@gen-{token}"
