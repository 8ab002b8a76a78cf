"""The `slurmjob.slinky.slurm.net/*` annotations: one parser for everyone.

The worker (translation), the admission webhook and `slurm-bridge explain` all
call `parse_job_annotations`, so what the webhook admits is exactly what the
worker can submit. Every problem is collected (not just the first), each naming
the annotation and saying how to fix it; unknown keys under the prefix are
problems too, because a typo such as `timelimt` would otherwise be ignored.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from bridge import keys
from bridge.quantity import QuantityError, mebibytes, parse_quantity, whole_cpus

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


class JobAnnotations(BaseModel):
    """Values from annotations, each overriding what the bridge would derive."""

    model_config = ConfigDict(frozen=True)

    account: str | None = None
    constraints: str | None = None
    cpu_per_task: int | None = None
    exclusive: bool | None = None
    gres: str | None = None
    group_id: str | None = None
    job_name: str | None = None
    licenses: str | None = None
    max_nodes: int | None = None
    mem_per_node_mib: int | None = None
    min_nodes: int | None = None
    partition: str | None = None
    priority: int | None = None
    qos: str | None = None
    reservation: str | None = None
    # Minutes; None means "not set", and `time_limit_infinite` overrides it.
    time_limit_minutes: int | None = None
    time_limit_infinite: bool = False
    user_id: str | None = None
    wckey: str | None = None


@dataclass(frozen=True)
class AnnotationProblem:
    key: str
    value: str
    message: str

    def __str__(self) -> str:
        # Echo at most a prefix of the value: annotations may hold up to 256 KiB,
        # and the message ends up in a denial, an event and a log line.
        shown = self.value if len(self.value) <= 80 else self.value[:77] + "..."
        return f'annotation {self.key}="{shown}": {self.message}'


class AnnotationError(ValueError):
    def __init__(self, problems: list[AnnotationProblem]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


def _text(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty; remove the annotation to use the default")
    return value.strip()


def _whole_number(value: str, example: str) -> int:
    # ASCII digits only (`\d` accepts other scripts' digits, Slurm does not);
    # the length bound keeps hostile values from Python's int conversion limit.
    text = value.strip()
    if not re.fullmatch(r"[0-9]+", text):
        raise ValueError(f"must be a whole number, for example {example}")
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(INT32_MAX)):
        raise ValueError(f"must be at most {INT32_MAX}")
    return int(digits)


def _count(value: str) -> int:
    number = _whole_number(value, "2")
    if not 1 <= number <= INT32_MAX:
        raise ValueError(f"must be between 1 and {INT32_MAX}")
    return number


def _non_negative(value: str) -> int:
    number = _whole_number(value, "100")
    if number > INT32_MAX:
        raise ValueError(f"must be at most {INT32_MAX}")
    return number


def _numeric_id(value: str) -> str:
    return str(_non_negative(value))


def _cpus(value: str) -> int:
    try:
        quantity = parse_quantity(value)
    except QuantityError as error:
        raise ValueError(str(error)) from None
    if quantity <= 0:
        raise ValueError("must be a positive CPU quantity, for example 2 or 500m")
    if whole_cpus(quantity) > INT32_MAX:
        # Slurm's cpus_per_task is an int32: a larger value would only fail at submission.
        raise ValueError(f"must be at most {INT32_MAX} CPUs")
    return whole_cpus(quantity)


def _memory_mib(value: str) -> int:
    try:
        quantity = parse_quantity(value)
    except QuantityError as error:
        raise ValueError(str(error)) from None
    if quantity <= 0:
        raise ValueError("must be a positive memory quantity, for example 4Gi or 512Mi")
    if mebibytes(quantity) > INT64_MAX:
        # Slurm's memory_per_node is a 64-bit number of MiB.
        raise ValueError("is larger than Slurm can represent; give the memory per node, for example 4Gi")
    return mebibytes(quantity)


def _boolean(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError('must be "true" or "false"')
    return lowered == "true"


_TIME_FORMATS = (
    # Slurm's accepted time limit formats (sbatch --time), most specific first.
    (re.compile(r"(?P<d>[0-9]+)-(?P<h>[0-9]+):(?P<m>[0-9]+):(?P<s>[0-9]+)"), "D-HH:MM:SS"),
    (re.compile(r"(?P<d>[0-9]+)-(?P<h>[0-9]+):(?P<m>[0-9]+)"), "D-HH:MM"),
    (re.compile(r"(?P<d>[0-9]+)-(?P<h>[0-9]+)"), "D-HH"),
    (re.compile(r"(?P<h>[0-9]+):(?P<m>[0-9]+):(?P<s>[0-9]+)"), "HH:MM:SS"),
    (re.compile(r"(?P<m>[0-9]+):(?P<s>[0-9]+)"), "MM:SS"),
    (re.compile(r"(?P<m>[0-9]+)"), "minutes"),
)
TIME_LIMIT_HELP = "use minutes (30) or a Slurm time: MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or UNLIMITED"


def parse_time_limit(value: str) -> int | None:
    """Minutes, rounded up as Slurm does; None for UNLIMITED/INFINITE."""
    text = value.strip()
    if text.lower() in ("unlimited", "infinite"):
        return None
    if len(text) > 32:
        # No valid time limit is this long; stops hostile values before int().
        raise ValueError(f"is too long; {TIME_LIMIT_HELP}")
    for pattern, _ in _TIME_FORMATS:
        match = pattern.fullmatch(text)
        if match is None:
            continue
        parts = {k: int(v) for k, v in match.groupdict().items() if v is not None}
        seconds = (
            parts.get("d", 0) * 86400 + parts.get("h", 0) * 3600 + parts.get("m", 0) * 60 + parts.get("s", 0)
        )
        minutes = -(-seconds // 60)
        if minutes < 1:
            raise ValueError(f"must be at least one minute; {TIME_LIMIT_HELP}")
        if minutes > INT32_MAX:
            raise ValueError("is too long")
        return minutes
    raise ValueError(f"is not a time limit; {TIME_LIMIT_HELP}")


# Annotation suffix → (field name, parser). The 18 keys of upstream slurm-bridge.
_PARSERS = {
    "account": ("account", _text),
    "constraints": ("constraints", _text),
    "cpu-per-task": ("cpu_per_task", _cpus),
    "exclusive": ("exclusive", _boolean),
    "gres": ("gres", _text),
    "group-id": ("group_id", _numeric_id),
    "job-name": ("job_name", _text),
    "licenses": ("licenses", _text),
    "max-nodes": ("max_nodes", _count),
    "mem-per-node": ("mem_per_node_mib", _memory_mib),
    "min-nodes": ("min_nodes", _count),
    "partition": ("partition", _text),
    "priority": ("priority", _non_negative),
    "qos": ("qos", _text),
    "reservation": ("reservation", _text),
    "user-id": ("user_id", _numeric_id),
    "wckey": ("wckey", _text),
}
KNOWN_SUFFIXES = frozenset({*_PARSERS, "timelimit"})


def _suggestion(suffix: str) -> str:
    import difflib

    close = difflib.get_close_matches(suffix, sorted(KNOWN_SUFFIXES), n=1)
    if close:
        return f"did you mean {keys.SLURMJOB_PREFIX}{close[0]}?"
    return "known keys: " + ", ".join(sorted(KNOWN_SUFFIXES))


def parse_job_annotations(annotations: Mapping[str, str] | None) -> JobAnnotations:
    """Parse every `slurmjob.slinky.slurm.net/*` annotation; raise AnnotationError listing all problems."""
    values: dict[str, object] = {}
    problems: list[AnnotationProblem] = []
    for key, value in sorted((annotations or {}).items()):
        if not key.startswith(keys.SLURMJOB_PREFIX):
            continue
        suffix = key.removeprefix(keys.SLURMJOB_PREFIX)
        try:
            if suffix == "timelimit":
                minutes = parse_time_limit(value)
                values["time_limit_minutes"] = minutes
                values["time_limit_infinite"] = minutes is None
            elif suffix in _PARSERS:
                field, parse = _PARSERS[suffix]
                values[field] = parse(value)
            else:
                problems.append(AnnotationProblem(key, value, f"unknown annotation; {_suggestion(suffix)}"))
        except ValueError as error:
            problems.append(AnnotationProblem(key, value, str(error)))
    low, high = values.get("min_nodes"), values.get("max_nodes")
    if isinstance(low, int) and isinstance(high, int) and low > high:
        problems.append(
            AnnotationProblem(
                keys.SLURMJOB_PREFIX + "min-nodes",
                str(low),
                f"is greater than {keys.SLURMJOB_PREFIX}max-nodes ({high}); min-nodes must be <= max-nodes",
            )
        )
    if problems:
        raise AnnotationError(problems)
    return JobAnnotations.model_validate(values)
