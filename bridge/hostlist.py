"""Slurm hostlist expressions: `k8s-node-[1-3,7],gpu[01-02]` <-> a list of names.

Pure functions, no Slurm needed. Follows Slurm's rules: commas outside brackets
separate expressions, a bracket holds comma-separated numbers or `lo-hi` ranges,
and a range is zero-padded to the width of its lower bound as written (`[08-10]`
gives 08, 09, 10; `[8-10]` gives 8, 9, 10). Several bracket groups in one
expression expand to their cartesian product.
"""

import itertools
import re
from collections.abc import Iterable, Iterator
from typing import NamedTuple

# Far above any real cluster; stops a typo like `n[1-99999999]` eating all memory.
MAX_HOSTS = 1 << 20

_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)$")
_RESERVED = frozenset("[],")


def expand(expression: str) -> list[str]:
    """Every host name of a hostlist expression, in the order written (duplicates kept)."""
    hosts: list[str] = []
    for part in _split_top_level(expression):
        for host in _expand_one(part):
            hosts.append(host)
            if len(hosts) > MAX_HOSTS:
                raise ValueError(f"hostlist expands to more than {MAX_HOSTS} names")
    return hosts


def compress(names: Iterable[str]) -> str:
    """A compact hostlist for `names`: sorted, duplicates dropped, numeric runs as ranges.

    Only a trailing number is folded into a range, as Slurm does: `gpu01,gpu02`
    -> `gpu[01-02]`, while `rack1-a` stays as written.
    """
    parsed = sorted({_split_name(name) for name in names}, key=_NameParts.sort_key)
    return ",".join(
        _render(prefix, list(group))
        for prefix, group in itertools.groupby(parsed, key=lambda parts: parts.prefix)
    )


class _NameParts(NamedTuple):
    prefix: str
    digits: str  # "" when the name does not end in a number

    def sort_key(self) -> tuple[str, int, int, str]:
        # Numbers sort by value, not as text (n2 before n10); the written width
        # breaks ties so `01` and `1`, different names, keep a stable order.
        value = int(self.digits) if self.digits else -1
        return (self.prefix, value, len(self.digits), self.digits)


def _split_top_level(expression: str) -> Iterator[str]:
    depth = 0
    start = 0
    for index, char in enumerate(expression):
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested '[' in hostlist {expression!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {expression!r}")
        elif char == "," and depth == 0:
            yield from _non_empty(expression[start:index])
            start = index + 1
    if depth != 0:
        raise ValueError(f"unbalanced '[' in hostlist {expression!r}")
    yield from _non_empty(expression[start:])


def _non_empty(part: str) -> Iterator[str]:
    part = part.strip()
    if part:
        yield part


def _expand_one(part: str) -> Iterator[str]:
    """`rack[1-2]-n[01-02]` -> rack1-n01, rack1-n02, rack2-n01, rack2-n02."""
    pieces = re.split(r"\[([^\]]*)\]", part)
    # re.split with one group alternates literal text and bracket contents.
    literals = pieces[0::2]
    choices = [list(_expand_ranges(body, part)) for body in pieces[1::2]]
    for picked in itertools.product(*choices):
        yield literals[0] + "".join(
            number + literal for number, literal in zip(picked, literals[1:], strict=True)
        )


def _expand_ranges(body: str, part: str) -> Iterator[str]:
    for item in body.split(","):
        item = item.strip()
        low, dash, high = item.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"bad range {item!r} in hostlist {part!r}")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ValueError(f"descending range {item!r} in hostlist {part!r}")
        if last - first >= MAX_HOSTS:
            raise ValueError(f"range {item!r} in hostlist {part!r} is too large")
        width = len(low)
        for value in range(first, last + 1):
            yield str(value).zfill(width)


def _split_name(name: str) -> _NameParts:
    if not name or _RESERVED.intersection(name):
        raise ValueError(f"cannot put {name!r} in a hostlist")
    match = _TRAILING_NUMBER.match(name)
    if match is None:
        return _NameParts(name, "")
    return _NameParts(match.group(1), match.group(2))


def _render(prefix: str, group: list[_NameParts]) -> str:
    plain = [parts for parts in group if not parts.digits]
    numbered = [parts.digits for parts in group if parts.digits]
    rendered = [prefix for _ in plain]
    if numbered:
        ranges = _ranges(numbered)
        single = len(ranges) == 1 and "-" not in ranges[0]
        rendered.append(prefix + ranges[0] if single else f"{prefix}[{','.join(ranges)}]")
    return ",".join(rendered)


def _ranges(numbers: list[str]) -> list[str]:
    """Sorted number strings -> `lo-hi` runs that expand back to exactly these strings."""
    runs: list[list[str]] = []
    # Open runs by the value that would extend them: `1,01,2,02` interleaves two
    # runs (1-2 and 01-02), so the last run alone is not enough.
    waiting: dict[int, list[list[str]]] = {}
    for digits in numbers:
        value = int(digits)
        candidates = waiting.get(value, [])
        run = next((run for run in candidates if _fits(run, digits)), None)
        if run is None:
            run = [digits, digits]
            runs.append(run)
        else:
            candidates.remove(run)
            run[1] = digits
        waiting.setdefault(value + 1, []).append(run)
    return [low if low == high else f"{low}-{high}" for low, high in runs]


def _fits(run: list[str], digits: str) -> bool:
    # A range pads every number to its lower bound's width: in a run from `8`,
    # `10` may follow `9`; in a run from `08`, `10` may follow `09`; but `2`
    # may not follow `01`, nor `02` follow `1`.
    return str(int(digits)).zfill(len(run[0])) == digits
