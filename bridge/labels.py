"""Kubernetes label selectors, parsed and matched without an API server.

The webhook decides "is this namespace managed?" from cached namespace labels,
and the worker filters the same way, so both need the API server's semantics
without asking it: `a!=b` and `a notin (b)` also match objects that lack the
key `a`, an empty selector matches everything, and keys and values follow the
label syntax rules (so a typo is reported at start, not silently never matching).

Two input forms are accepted: the string form of `kubectl -l` (`parse_selector`)
and the `metav1.LabelSelector` object of manifests (`selector_from_object`).
"""

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]

_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_NAME_RE = re.compile(_NAME)
_DNS_SUBDOMAIN_RE = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*")


class LabelSelectorError(ValueError):
    """A selector that does not parse; the message says where and why."""


def label_key_problem(key: str) -> str | None:
    """Why `key` is not a valid label key, or None when it is."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.fullmatch(prefix)):
        return f'label key "{key}": the prefix must be a DNS subdomain such as example.com'
    if not _NAME_RE.fullmatch(name):
        return (
            f'label key "{key}": the name must be 1-63 characters of letters, digits, "-", "_" or ".", '
            "starting and ending with a letter or digit"
        )
    return None


def label_value_problem(value: str) -> str | None:
    """Why `value` is not a valid label value, or None when it is (empty is valid)."""
    if value and not _NAME_RE.fullmatch(value):
        return (
            f'label value "{value}": must be at most 63 characters of letters, digits, "-", "_" or ".", '
            "starting and ending with a letter or digit"
        )
    return None


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if self.operator == "In":
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values

    def __str__(self) -> str:
        values = ",".join(sorted(self.values))
        if self.operator == "Exists":
            return self.key
        if self.operator == "DoesNotExist":
            return "!" + self.key
        if len(self.values) == 1:
            return f"{self.key}{'=' if self.operator == 'In' else '!='}{values}"
        return f"{self.key} {'in' if self.operator == 'In' else 'notin'} ({values})"


@dataclass(frozen=True)
class Selector:
    """All requirements must hold; no requirement at all matches everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        present = labels or {}
        return all(r.matches(present) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements

    def __str__(self) -> str:
        # The string form the API server accepts as `labelSelector=`.
        return ",".join(str(r) for r in self.requirements)


def _requirement(key: str, operator: Operator, values: Iterable[str], where: str) -> Requirement:
    problem = label_key_problem(key)
    if problem:
        raise LabelSelectorError(f"{where}: {problem}")
    frozen = frozenset(values)
    for value in frozen:
        problem = label_value_problem(value)
        if problem:
            raise LabelSelectorError(f"{where}: {problem}")
    if operator in ("In", "NotIn") and not frozen:
        raise LabelSelectorError(f"{where}: {operator} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and frozen:
        raise LabelSelectorError(f"{where}: {operator} takes no values")
    return Requirement(key, operator, frozen)


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside a `(...)` value set."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "(":
            depth += 1
            if depth > 1:
                raise LabelSelectorError(f'"{text}": nested parentheses')
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise LabelSelectorError(f'"{text}": ")" without "("')
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    if depth:
        raise LabelSelectorError(f'"{text}": "(" without ")"')
    parts.append(text[start:])
    return parts


_SET_RE = re.compile(r"(?P<key>\S+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)")
_EQUALITY_RE = re.compile(r"(?P<key>[^\s=!]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s=!]*)")
_EXISTS_RE = re.compile(r"(?P<not>!?)\s*(?P<key>[^\s=!(),]+)")


def parse_selector(text: str) -> Selector:
    """The `kubectl -l` form: `env=prod,tier!=web,team in (a,b),gpu,!legacy`."""
    if not text.strip():
        return Selector()
    requirements = []
    for raw in _split_top_level(text):
        part = raw.strip()
        where = f'"{part}"' if part else f'"{text}"'
        if not part:
            raise LabelSelectorError(f"{where}: empty requirement (a stray comma?)")
        if match := _SET_RE.fullmatch(part):
            values = [v.strip() for v in match["values"].split(",")]
            if any(not v for v in values):
                raise LabelSelectorError(f"{where}: empty value in the set")
            operator: Operator = "In" if match["op"] == "in" else "NotIn"
            requirements.append(_requirement(match["key"], operator, values, where))
        elif match := _EQUALITY_RE.fullmatch(part):
            operator = "NotIn" if match["op"] == "!=" else "In"
            requirements.append(_requirement(match["key"], operator, [match["value"]], where))
        elif match := _EXISTS_RE.fullmatch(part):
            operator = "DoesNotExist" if match["not"] else "Exists"
            requirements.append(_requirement(match["key"], operator, [], where))
        else:
            raise LabelSelectorError(
                f"{where}: not a requirement; use key=value, key!=value, key in (a,b), "
                "key notin (a,b), key or !key"
            )
    return Selector(tuple(requirements))


def selector_from_object(obj: Mapping[str, Any] | None) -> Selector:
    """A `metav1.LabelSelector` ({matchLabels, matchExpressions}); None or {} matches everything."""
    if obj is None:
        return Selector()
    if not isinstance(obj, Mapping):
        raise LabelSelectorError(
            "a label selector must be an object with matchLabels and/or matchExpressions"
        )
    requirements = []
    match_labels = obj.get("matchLabels") or {}
    if not isinstance(match_labels, Mapping):
        raise LabelSelectorError("matchLabels must map label keys to values")
    for key, value in match_labels.items():
        requirements.append(_requirement(str(key), "In", [str(value)], f"matchLabels {key}"))
    expressions = obj.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise LabelSelectorError("matchExpressions must be a list")
    for index, expression in enumerate(expressions):
        where = f"matchExpressions[{index}]"
        if not isinstance(expression, Mapping):
            raise LabelSelectorError(f"{where}: must be an object with key, operator and values")
        operator = expression.get("operator")
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise LabelSelectorError(f"{where}: operator must be In, NotIn, Exists or DoesNotExist")
        values = expression.get("values") or []
        if not isinstance(values, list):
            raise LabelSelectorError(f"{where}: values must be a list")
        requirements.append(_requirement(str(expression.get("key") or ""), operator, map(str, values), where))
    return Selector(tuple(requirements))
