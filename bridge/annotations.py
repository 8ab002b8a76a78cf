"""The `slurmjob.slinky.slurm.net/*` annotations: one parser for everyone.

The worker (translation), the admission webhook and `slurm-bridge explain` all
call `parse_job_annotations`, so what the webhook admits is exactly what the
worker can submit. Every problem is collected (not just the first), each naming
the annotation and saying how to fix it.

Each key is read as upstream slurm-bridge reads it (`parseUserAnnotations`,
internal/utils/slurmjobir/annotations.go, and its `timelimit.Parse`): a manifest
that works there is accepted here and asks Slurm for the same thing. Where
upstream passes a value on that Slurm then silently turns into something else
(a negative count, memory or CPUs; a zero time limit, which ends the job at
once) the value is refused with the reason instead. Unknown keys under the
prefix are ignored, as upstream ignores them; `annotation_warnings` names them
(with the likely key meant) for the webhook to warn about.
"""

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from pydantic import BaseModel, ConfigDict

from bridge import keys
from bridge.quantity import MIB, QuantityError, parse_quantity, whole_cpus

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


def _text(value: str) -> str | None:
    """Free text; empty (or blank) is "not set", as Slurm reads the empty text upstream sends."""
    return value.strip() or None


def _kept_text(value: str) -> str:
    """Free text whose empty value upstream sends and Slurm honours: no GRES, an empty job name."""
    return value.strip()


def _required_text(value: str) -> str:
    if not value.strip():
        # Upstream sends "" and Slurm keeps such a job pending for ever (PartitionConfig).
        raise ValueError("must not be empty; remove the annotation to use the default")
    return value.strip()


def _whole_number(value: str, example: str, low: int, why: str = "") -> int:
    """A whole number as upstream's strconv.ParseInt(value, 10, 32) reads it (optional sign, ASCII
    digits), from `low` up: upstream passes negative numbers on, which Slurm ignores or misreads."""
    # ASCII digits only (`\d` accepts other scripts' digits, Go and Slurm do not);
    # the length bound keeps hostile values from Python's int conversion limit.
    match = re.fullmatch(r"([+-]?)([0-9]+)", value.strip())
    if match is None:
        raise ValueError(f"must be a whole number, for example {example}")
    digits = match[2].lstrip("0") or "0"
    if match[1] == "-" and digits != "0":
        raise ValueError("must not be negative")
    if len(digits) > len(str(INT32_MAX)) or int(digits) > INT32_MAX:
        raise ValueError(f"must be at most {INT32_MAX}")
    number = int(digits)
    if number < low:
        raise ValueError(f"must be at least {low}{why}")
    return number


def _max_nodes(value: str) -> int:
    return _whole_number(value, "4", 1, ": Slurm refuses a maximum of 0 nodes")


def _min_nodes(value: str) -> int:
    return _whole_number(value, "2", 0)


def _priority(value: str) -> int:
    # 0 is taken as upstream takes it: Slurm holds such a job (JobHeldUser) until released.
    return _whole_number(value, "100", 0)


def _id(value: str) -> str | None:
    """A user or group, by name or number, as Slurm resolves either; digits are normalized ("007" → "7")."""
    text = value.strip()
    if not text:
        return None  # Slurm's default: the user (group) the bridge submits as
    if re.fullmatch(r"[0-9]+", text):
        digits = text.lstrip("0") or "0"
        if len(digits) > len(str(INT32_MAX)) or int(digits) > INT32_MAX:
            raise ValueError(f"must be at most {INT32_MAX}")
        return digits
    return text


def _quantity(value: str) -> Fraction:
    try:
        quantity = parse_quantity(value)
    except QuantityError as error:
        raise ValueError(str(error)) from None
    if quantity < 0:
        raise ValueError("must not be negative")
    return quantity


def _cpus(value: str) -> int:
    # Rounded up as upstream's Quantity.Value(); 0 is sent as 0 (Slurm gives the task 1 CPU).
    # Negative is refused: Slurm takes -1 and never starts the job (PartitionConfig).
    cpus = whole_cpus(_quantity(value))
    if cpus > INT32_MAX:
        # Slurm's cpus_per_task is an int32: a larger value would only fail at submission.
        raise ValueError(f"must be at most {INT32_MAX} CPUs")
    return cpus


def _memory_mib(value: str) -> int:
    # As upstream: the quantity's whole bytes (rounded up), divided by 1 MiB, rounded down. 0, and
    # anything below 1Mi, is memory_per_node 0: Slurm's --mem=0, all of the node's memory.
    # Negative is refused: Slurm would read it as 0 too.
    mib = math.ceil(_quantity(value)) // MIB
    if mib > INT64_MAX:
        # Slurm's memory_per_node is a 64-bit number of MiB.
        raise ValueError("is larger than Slurm can represent; give the memory per node, for example 4Gi")
    return mib


def _exclusive(value: str) -> bool:
    """Upstream's rule: every value but "false" (any case, spaces trimmed) asks for whole nodes."""
    return value.strip().lower() != "false"


_SLURM_TIMES = (
    # Slurm's time limit formats (sbatch --time) with a colon or a dash, most specific first.
    re.compile(r"(?P<d>[0-9]+)-(?P<h>[0-9]+):(?P<m>[0-9]+):(?P<s>[0-9]+)"),
    re.compile(r"(?P<d>[0-9]+)-(?P<h>[0-9]+):(?P<m>[0-9]+)"),
    re.compile(r"(?P<d>[0-9]+)-(?P<h>[0-9]+)"),
    re.compile(r"(?P<h>[0-9]+):(?P<m>[0-9]+):(?P<s>[0-9]+)"),
    re.compile(r"(?P<m>[0-9]+):(?P<s>[0-9]+)"),
)
# Upstream's unit-suffixed durations (Prometheus' model.ParseDuration): each unit at most once,
# largest first; a year is 365 days, a week 7.
_DURATION = re.compile(
    r"(?:(?P<y>[0-9]+)y)?(?:(?P<w>[0-9]+)w)?(?:(?P<d>[0-9]+)d)?(?:(?P<h>[0-9]+)h)?"
    r"(?:(?P<m>[0-9]+)m)?(?:(?P<s>[0-9]+)s)?(?:(?P<ms>[0-9]+)ms)?"
)
_MILLISECONDS = {
    "y": 365 * 86_400_000,
    "w": 7 * 86_400_000,
    "d": 86_400_000,
    "h": 3_600_000,
    "m": 60_000,
    "s": 1000,
    "ms": 1,
}
TIME_LIMIT_HELP = (
    "use minutes (30), a duration (90s, 2h, 1d, 1h30m), a Slurm time (MM:SS, HH:MM:SS, D-HH, "
    "D-HH:MM, D-HH:MM:SS) or UNLIMITED"
)


def _time_milliseconds(text: str) -> int | None:
    """The time in milliseconds, or None when `text` is not a time."""
    if re.fullmatch(r"[0-9]+", text):
        return int(text) * 60_000  # a bare number is minutes, as for Slurm and upstream
    if ":" in text or "-" in text:
        for pattern in _SLURM_TIMES:
            match = pattern.fullmatch(text)
            if match is not None:
                return sum(int(v) * _MILLISECONDS[unit] for unit, v in match.groupdict().items() if v)
        return None
    match = _DURATION.fullmatch(text)
    if match is None:
        return None
    return sum(int(v) * _MILLISECONDS[unit] for unit, v in match.groupdict().items() if v)


def parse_time_limit(value: str) -> int | None:
    """Minutes, rounded up as Slurm and upstream round; None for UNLIMITED/INFINITE."""
    text = value.strip()
    if text.lower() in ("unlimited", "infinite"):
        return None
    if not text:
        raise ValueError(f"must not be empty; {TIME_LIMIT_HELP}")
    if len(text) > 32:
        # No valid time limit is this long; stops hostile values before int().
        raise ValueError(f"is too long; {TIME_LIMIT_HELP}")
    if text.startswith("-"):
        raise ValueError(f"must not be negative; {TIME_LIMIT_HELP}")
    milliseconds = _time_milliseconds(text)
    if milliseconds is None:
        raise ValueError(f"is not a time limit; {TIME_LIMIT_HELP}")
    minutes = -(-milliseconds // 60_000)
    if minutes == 0:
        # Upstream sends 0; slurmctld then ends the job at its start (TIMEOUT). sbatch's
        # "0 = no limit" is sbatch's own translation, not Slurm's.
        raise ValueError("is zero: Slurm would end the job at once; use UNLIMITED for no time limit")
    if minutes > INT32_MAX:
        raise ValueError("is too long")
    return minutes


# Annotation suffix → (field name, parser). The 18 keys of upstream slurm-bridge.
_PARSERS: dict[str, tuple[str, Callable[[str], object]]] = {
    "account": ("account", _text),
    "constraints": ("constraints", _text),
    "cpu-per-task": ("cpu_per_task", _cpus),
    "exclusive": ("exclusive", _exclusive),
    "gres": ("gres", _kept_text),
    "group-id": ("group_id", _id),
    "job-name": ("job_name", _kept_text),
    "licenses": ("licenses", _text),
    "max-nodes": ("max_nodes", _max_nodes),
    "mem-per-node": ("mem_per_node_mib", _memory_mib),
    "min-nodes": ("min_nodes", _min_nodes),
    "partition": ("partition", _required_text),
    "priority": ("priority", _priority),
    "qos": ("qos", _text),
    "reservation": ("reservation", _text),
    "user-id": ("user_id", _id),
    "wckey": ("wckey", _text),
}
KNOWN_SUFFIXES = frozenset({*_PARSERS, "timelimit"})


def _suggestion(suffix: str) -> str:
    import difflib

    close = difflib.get_close_matches(suffix, sorted(KNOWN_SUFFIXES), n=1)
    return f"; did you mean {keys.SLURMJOB_PREFIX}{close[0]}?" if close else ""


def annotation_warnings(annotations: Mapping[str, str] | None) -> list[str]:
    """What is accepted but likely not meant: unknown keys (ignored) and a non-boolean `exclusive`.

    Not problems: upstream accepts both, so a manifest written for it must pass. The
    webhook returns these as admission warnings, which `kubectl` prints.
    """
    warnings: list[str] = []
    for key, value in sorted((annotations or {}).items()):
        if not key.startswith(keys.SLURMJOB_PREFIX):
            continue
        suffix = key.removeprefix(keys.SLURMJOB_PREFIX)
        if suffix not in KNOWN_SUFFIXES:
            message = f"unknown to slurm-bridge and ignored{_suggestion(suffix)}"
        elif suffix == "exclusive" and value.strip().lower() not in ("true", "false"):
            message = 'taken as "true" (whole nodes): only "false" shares nodes'
        else:
            continue
        warnings.append(str(AnnotationProblem(key, value, message)))
    return warnings


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
            # else: unknown, ignored as upstream does (annotation_warnings names it)
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
