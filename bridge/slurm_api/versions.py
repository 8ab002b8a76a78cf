"""v0.0.45 answers in the shape the bridge's v0.0.44 models parse.

Between the two versions slurmrestd 26.05 changed the type of one field in the
answers the bridge parses: a partition's `cpus.task_binding` (an integer in
v0.0.44, a list of flags in v0.0.45). The models validate every field they
know, so that one field would fail a whole `GET /partitions/`. The bridge
reads no such field, so it is dropped before parsing. Every other difference
leaves the fields the bridge sends and parses as they were
(tests/unit/test_slurm_api_versions.py checks the two documents, and that each
changed field is handled here).
"""

from typing import Any, Final

# (schema, field) of every field whose type differs, as tests/unit/test_slurm_api_versions.py finds them.
CHANGED_IN_V0045: Final = frozenset({("partition_info", "cpus.task_binding")})


def as_v0044(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer without the fields whose type changed (in place; returned for convenience)."""
    for partition in answer.get("partitions") or []:
        cpus = partition.get("cpus") if isinstance(partition, dict) else None
        if isinstance(cpus, dict):
            cpus.pop("task_binding", None)
    return answer
