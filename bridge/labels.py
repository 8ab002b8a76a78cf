"""Kubernetes label selectors, parsed and matched as the API server does, without one.

The one implementation of label-selector semantics in the project: the webhook's
MANAGED_NAMESPACE_SELECTOR, the node rules' nodeSelectorTerms (`bridge.matching`)
and the fake API server's `labelSelector=` (testbed/kube_fake) all use it.

- `parse_selector`: the string form of `kubectl -l` and `?labelSelector=`, a port of
  k8s.io/apimachinery/pkg/labels (its lexer, recursive-descent parser, validation
  and error texts): `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`,
  `!k`, `k>N`, `k<N`; a comma means AND. An empty set `()` and empty members
  (`(a,)`) stand for the empty value, as upstream: `k in ()` selects the objects
  whose label `k` is `""`. The fake's tests run these texts against a real
  kube-apiserver too (tests/kube_fake/test_list.py).
- `selector_from_object`: a `metav1.LabelSelector` object ({matchLabels,
  matchExpressions}), as LabelSelectorAsSelector reads it.
- `Requirement.matches`: labels.Requirement.Matches, for In, NotIn, Exists,
  DoesNotExist, Gt and Lt: `a!=b` and `a notin (b)` also match objects that lack
  the key `a`; Gt and Lt compare 64-bit integers and never match a label that is
  not one; a selector without requirements matches everything.

Its size (about 440 lines) is the port of one parser with its validation and error
texts, kept whole so it can be compared with upstream's line for line.
"""

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
# The operators by name: NodeSelectorOperator has them all, LabelSelectorOperator the first four.
OPERATORS: dict[str, Operator] = {
    "In": "In",
    "NotIn": "NotIn",
    "Exists": "Exists",
    "DoesNotExist": "DoesNotExist",
    "Gt": "Gt",
    "Lt": "Lt",
}

# k8s.io/apimachinery/pkg/util/validation.
_QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_QUALIFIED_NAME_RE = re.compile(_QUALIFIED_NAME_FMT)
_QUALIFIED_NAME_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character"
)
_LABEL_VALUE_FMT = f"({_QUALIFIED_NAME_FMT})?"
_LABEL_VALUE_RE = re.compile(_LABEL_VALUE_FMT)
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)
_DNS1123_SUBDOMAIN_FMT = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_DNS1123_SUBDOMAIN_RE = re.compile(_DNS1123_SUBDOMAIN_FMT)
_DNS1123_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character"
)
_INT64 = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class LabelSelectorError(ValueError):
    """A selector that does not parse; the message says where and why (the API server's 400 text)."""


def parse_int64(text: Any) -> int | None:
    """Go's strconv.ParseInt(text, 10, 64): optional sign, ASCII digits, in range; else None."""
    if not isinstance(text, str) or not _INT64.fullmatch(text):
        return None
    number = int(text)
    return number if _INT64_MIN <= number <= _INT64_MAX else None


# -- validation ----------------------------------------------------------------


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    """validation.RegexError, double spaces and all."""
    text = msg + " (e.g. "
    for i, example in enumerate(examples):
        if i:
            text += " or "
        text += f"'{example}', "
    return text + f"regex used for validation is '{fmt}')"


def _invalid(path: str, value: str, detail: str) -> str:
    """field.Invalid(...).Error() for a string value (Go's %q quoting)."""
    return f"{path}: Invalid value: {json.dumps(value, ensure_ascii=False)}: {detail}"


def label_key_errors(key: str) -> list[str]:
    """validation.IsQualifiedName: why `key` is not a label key (empty when it is one)."""
    errs: list[str] = []
    parts = key.split("/")
    if len(parts) > 2:
        return [
            "a qualified name "
            + _regex_error(_QUALIFIED_NAME_MSG, _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            if len(prefix) > 253:
                errs.append("prefix part must be no more than 253 characters")
            if not _DNS1123_SUBDOMAIN_RE.fullmatch(prefix):
                errs.append(
                    "prefix part "
                    + _regex_error(_DNS1123_SUBDOMAIN_MSG, _DNS1123_SUBDOMAIN_FMT, "example.com")
                )
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    if not _QUALIFIED_NAME_RE.fullmatch(name):
        errs.append(
            "name part "
            + _regex_error(_QUALIFIED_NAME_MSG, _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
        )
    return errs


def label_value_errors(value: str) -> list[str]:
    """validation.IsValidLabelValue: why `value` is not a label value (empty is one)."""
    errs: list[str] = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not _LABEL_VALUE_RE.fullmatch(value):
        errs.append(_regex_error(_LABEL_VALUE_MSG, _LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return errs


def operator_problem(operator: str, values: Sequence[Any]) -> str | None:
    """Why NewRequirement refuses `operator` with these values (key and value syntax aside), or None."""
    if operator in ("In", "NotIn"):
        return None if values else "In and NotIn need at least one value"
    if operator in ("Exists", "DoesNotExist"):
        return None if not values else "Exists and DoesNotExist take no values"
    if operator in ("Gt", "Lt"):
        if len(values) != 1 or parse_int64(values[0]) is None:
            return "Gt and Lt need exactly one integer value"
        return None
    return f'unsupported operator "{operator}"'


# -- requirements and selectors ------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, Any]) -> bool:
        """labels.Requirement.Matches."""
        present = self.key in labels
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if self.operator in ("In", "NotIn"):
            value = labels.get(self.key)
            found = present and isinstance(value, str) and value in self.values
            return found if self.operator == "In" else not found
        # Gt / Lt: the label must exist and be an integer too.
        actual = parse_int64(labels.get(self.key))
        limit = parse_int64(next(iter(self.values))) if len(self.values) == 1 else None
        if actual is None or limit is None:
            return False
        return actual > limit if self.operator == "Gt" else actual < limit

    def __str__(self) -> str:
        values = ",".join(sorted(self.values))
        if self.operator == "Exists":
            return self.key
        if self.operator == "DoesNotExist":
            return "!" + self.key
        if self.operator in ("Gt", "Lt"):
            return f"{self.key}{'>' if self.operator == 'Gt' else '<'}{values}"
        if len(self.values) == 1:
            return f"{self.key}{'=' if self.operator == 'In' else '!='}{values}"
        return f"{self.key} {'in' if self.operator == 'In' else 'notin'} ({values})"


@dataclass(frozen=True)
class Selector:
    """All requirements must hold; no requirement at all matches everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, Any] | None) -> bool:
        present = labels or {}
        return all(r.matches(present) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements

    def __str__(self) -> str:
        # The string form the API server accepts as `labelSelector=`.
        return ",".join(str(r) for r in self.requirements)


# -- the string form: labels.Parse ---------------------------------------------

_WHITESPACE = " \t\r\n"
_SPECIAL = "=!(),><"
# string2token: the special symbols and the two keywords.
_SYMBOLS = {"(": "(", ")": ")", ",": ",", "!": "!", "!=": "!=", "=": "=", "==": "==", ">": ">", "<": "<"}
_KEYWORDS = {"in": "in", "notin": "notin"}
_ID = "identifier"
_END = "end"
# selection.Operator as parsed -> the operator it means.
_PARSED: dict[str, Operator] = {
    "=": "In",
    "==": "In",
    "in": "In",
    "!=": "NotIn",
    "notin": "NotIn",
    ">": "Gt",
    "<": "Lt",
}


def _lex(text: str) -> list[tuple[str, str]]:
    """(token, literal) pairs, ending with (end, "")."""
    tokens: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in _WHITESPACE:
            i += 1
        if i >= n:
            tokens.append((_END, ""))
            return tokens
        if text[i] in _SPECIAL:
            # The longest symbol that is a token (every single special character is one).
            j, last = i, ("", "")
            while j < n and text[j] in _SPECIAL:
                buffer = text[i : j + 1]
                if buffer in _SYMBOLS:
                    last = (_SYMBOLS[buffer], buffer)
                elif last[0]:
                    break
                j += 1
            tokens.append(last)
            i += len(last[1])
            continue
        j = i
        while j < n and text[j] not in _WHITESPACE and text[j] not in _SPECIAL:
            j += 1
        word = text[i:j]
        tokens.append((_KEYWORDS.get(word, _ID), word))
        i = j


class _Parser:
    """labels.Parser: lookahead/consume over the scanned tokens."""

    def __init__(self, text: str) -> None:
        self.items = _lex(text)
        self.position = 0

    def lookahead(self, values: bool) -> tuple[str, str]:
        tok, lit = self.items[self.position]
        if values and tok in ("in", "notin"):
            tok = _ID  # in the values context the keywords are identifiers
        return tok, lit

    def consume(self, values: bool) -> tuple[str, str]:
        found = self.lookahead(values)
        self.position += 1
        return found

    def parse(self) -> list[Requirement]:
        requirements: list[Requirement] = []
        while True:
            tok, lit = self.lookahead(True)
            if tok in (_ID, "!"):
                try:
                    requirements.append(self.requirement())
                except LabelSelectorError as exc:
                    raise LabelSelectorError(f"unable to parse requirement: {exc}") from exc
                tok, lit = self.consume(True)
                if tok == _END:
                    return requirements
                if tok != ",":
                    raise LabelSelectorError(f"found '{lit}', expected: ',' or 'end of string'")
                tok, lit = self.lookahead(True)
                if tok not in (_ID, "!"):
                    raise LabelSelectorError(f"found '{lit}', expected: identifier after ','")
            elif tok == _END:
                return requirements
            else:
                raise LabelSelectorError(f"found '{lit}', expected: !, identifier, or 'end of string'")

    def requirement(self) -> Requirement:
        operator: Operator | None = None
        tok, key = self.consume(True)
        if tok == "!":
            operator = "DoesNotExist"
            tok, key = self.consume(True)
        if tok != _ID:
            raise LabelSelectorError(f"found '{key}', expected: identifier")
        if errs := label_key_errors(key):
            raise LabelSelectorError(_invalid("<nil>", key, "; ".join(errs)))
        if self.lookahead(True)[0] in (_END, ","):
            operator = operator or "Exists"
        if operator:
            return Requirement(key, operator)
        tok, lit = self.consume(False)
        if tok not in _PARSED:
            raise LabelSelectorError(f"found '{lit}', expected: in, notin, =, ==, !=, gt, lt")
        values = self.values() if tok in ("in", "notin") else self.exact_value()
        return _new_requirement(key, _PARSED[tok], sorted(values))

    def values(self) -> set[str]:
        tok, lit = self.consume(True)
        if tok != "(":
            raise LabelSelectorError(f"found '{lit}' expected: '('")
        tok, lit = self.lookahead(True)
        if tok == ")":
            self.consume(True)
            return {""}  # "()" is the set of the empty value
        if tok not in (_ID, ","):
            raise LabelSelectorError(f"found '{lit}', expected: ',', ')' or identifier")
        found = self.identifiers()
        if self.consume(True)[0] != ")":
            raise LabelSelectorError(f"found '{lit}', expected: ')'")
        return found

    def identifiers(self) -> set[str]:
        found: set[str] = set()
        while True:
            tok, lit = self.consume(True)
            if tok == _ID:
                found.add(lit)
                after, after_lit = self.lookahead(True)
                if after == ",":
                    continue
                if after == ")":
                    return found
                raise LabelSelectorError(f"found '{after_lit}', expected: ',' or ')'")
            if tok == ",":
                if not found:
                    found.add("")  # "(,"
                after = self.lookahead(True)[0]
                if after == ")":
                    found.add("")  # ",)"
                    return found
                if after == ",":
                    self.consume(True)
                    found.add("")  # ",,"
                continue
            raise LabelSelectorError(f"found '{lit}', expected: ',', or identifier")

    def exact_value(self) -> set[str]:
        if self.lookahead(True)[0] in (_END, ","):
            return {""}
        tok, lit = self.consume(True)
        if tok == _ID:
            return {lit}
        raise LabelSelectorError(f"found '{lit}', expected: identifier")


def _new_requirement(key: str, operator: Operator, values: list[str]) -> Requirement:
    """labels.NewRequirement's value checks, in its words (the parser checked the key)."""
    errs: list[str] = []
    if operator in ("Gt", "Lt"):
        errs += [
            _invalid(f"values[{i}]", v, "for 'Gt', 'Lt' operators, the value must be an integer")
            for i, v in enumerate(values)
            if parse_int64(v) is None
        ]
    for i, value in enumerate(values):
        if problems := label_value_errors(value):
            errs.append(_invalid(f"values[{i}][{key}]", value, "; ".join(problems)))
    if errs:
        raise LabelSelectorError(errs[0] if len(errs) == 1 else "[" + ", ".join(errs) + "]")
    return Requirement(key, operator, frozenset(values))


def parse_selector(text: str) -> Selector:
    """labels.Parse: `env=prod,tier!=web,team in (a,b),gpu,!legacy,cores>4`; "" matches everything."""
    return Selector(tuple(_Parser(text).parse()))


# -- the object form: metav1.LabelSelectorAsSelector ---------------------------


def _requirement(key: str, operator: Operator, values: Iterable[Any], where: str) -> Requirement:
    strings = [str(v) for v in values]
    if errs := label_key_errors(key):
        raise LabelSelectorError(f"{where}: {_invalid('key', key, '; '.join(errs))}")
    if problem := operator_problem(operator, strings):
        raise LabelSelectorError(f"{where}: {problem}")
    for index, value in enumerate(strings):
        if errs := label_value_errors(value):
            raise LabelSelectorError(f"{where}: {_invalid(f'values[{index}]', value, '; '.join(errs))}")
    return Requirement(key, operator, frozenset(strings))


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
        requirements.append(_requirement(str(key), "In", [value], f"matchLabels {key}"))
    expressions = obj.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise LabelSelectorError("matchExpressions must be a list")
    for index, expression in enumerate(expressions):
        where = f"matchExpressions[{index}]"
        if not isinstance(expression, Mapping):
            raise LabelSelectorError(f"{where}: must be an object with key, operator and values")
        operator = OPERATORS.get(str(expression.get("operator")))
        if operator is None or operator in ("Gt", "Lt"):  # LabelSelectorOperator has neither
            raise LabelSelectorError(f"{where}: operator must be In, NotIn, Exists or DoesNotExist")
        values = expression.get("values") or []
        if not isinstance(values, list):
            raise LabelSelectorError(f"{where}: values must be a list")
        requirements.append(_requirement(str(expression.get("key") or ""), operator, values, where))
    return Selector(tuple(requirements))
